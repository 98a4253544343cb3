// Feeds a POST /v1/messages body (Anthropic's Messages API) to the route's parser, as a message and as a
// /count_tokens body: the translation to a chat body, the chat parser and the prompt renderer. 400s are
// expected; any other escape (a 500 in the server) or a crash is a finding.
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace peregrine;
    const std::string body(reinterpret_cast<const char*>(data), size);
    for (bool count_only : {false, true}) {
        try {
            parse_messages_request(body, fuzz::route_options(), count_only);
        } catch (const ApiError&) {
        } catch (const RequestError&) {
        }
    }
    return 0;
}
