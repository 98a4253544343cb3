// Feeds a POST /v1/completions body to the route's parser (prompts, sampling fields, response_format). 400s
// are expected; any other escape (a 500 in the server) or a crash is a finding.
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace peregrine;
    try {
        parse_completions_request(std::string(reinterpret_cast<const char*>(data), size), fuzz::route_options());
    } catch (const ApiError&) {
    }
    return 0;
}
