// Feeds a POST /v1/chat/completions body to the route's parser and prompt renderer, then builds the DSML
// grammar that tool_choice required / a named function would compile. 400s are expected; any other escape
// (a 500 in the server) or a crash is a finding.
#include "fuzz_common.h"
#include "server/tool_call_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace peregrine;
    const auto& o = fuzz::route_options();
    try {
        ChatRouteRequest r = parse_chat_route_request(std::string(reinterpret_cast<const char*>(data), size), o);
        if (r.req.tool_choice.mode == ToolChoiceMode::required || r.req.tool_choice.mode == ToolChoiceMode::named) {
            tool_call_grammar_key(r.req, o.chat_format);
            try {
                tool_call_grammar(r.req, o.chat_format);
            } catch (const Error&) {  // the server's compile_guarded answers these with a 400 naming "tools"
            }
        }
    } catch (const ApiError&) {
    } catch (const RequestError&) {
    }
    return 0;
}
