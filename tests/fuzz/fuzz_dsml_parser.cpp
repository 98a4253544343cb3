// Feeds a raw model completion to the streaming reasoning / DSML tool-call parser, as the server does with
// generated text: the first byte picks the options (format, start state, tool parsing, JSON output), the next
// picks the chunk size, the rest is the text. The parser must take any text without throwing or crashing.
#include "server/protocol/assistant_message.h"
#include "server/protocol/output_parser.h"

#include <algorithm>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace peregrine;
    if (size < 2) return 0;
    OutputParserOptions o;
    o.format = data[0] & 1 ? ChatFormat::deepseek_v4 : ChatFormat::deepseek_v41;
    o.start = static_cast<ParseStart>((data[0] >> 1) % 3);
    o.parse_tool_calls = data[0] & 8;
    o.json_output = data[0] & 16;
    if (data[0] & 32) o.stop = {"</", "\n\n"};
    const size_t chunk = 1 + data[1] % 17;
    const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
    OutputParser parser(o, [](int i) { return "call_" + std::to_string(i); });
    AssistantMessage msg(reports_reasoning(o.start));
    for (size_t at = 0; at < text.size(); at += chunk) msg.add(parser.push(text.substr(at, chunk)));
    msg.add(parser.finish());
    msg.to_openai_json();
    msg.finish_reason("stop", parser.cut_in_block());
    return 0;
}
