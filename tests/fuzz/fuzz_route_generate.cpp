// Feeds a POST /generate body (SGLang's native shape) to the route's parser: text or input_ids,
// sampling_params and its regex / ebnf / json_schema choice. 400s are expected; any other escape (a 500 in the
// server) or a crash is a finding.
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace peregrine;
    try {
        parse_generate_request(std::string(reinterpret_cast<const char*>(data), size), fuzz::route_options());
    } catch (const ApiError&) {
    }
    return 0;
}
