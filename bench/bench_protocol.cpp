// Chat protocol costs per request: rendering an agent-loop prompt, and streaming a completion with
// reasoning, text and several DSML tool calls through the output parser in token-sized chunks.
#include "server/protocol/assistant_message.h"
#include "server/protocol/output_parser.h"
#include "server/protocol/prompt_render.h"

#include <benchmark/benchmark.h>

using namespace peregrine;

namespace {

ChatRequest agent_request(int turns) {
    ojson body = ojson::parse(R"({"messages": [{"role": "system", "content": "You are a coding agent."}],
        "tools": [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "array",
            "items": {"type": "integer"}}}, "required": ["path"]}}}]})");
    for (int t = 0; t < turns; ++t) {
        body["messages"].push_back(
            {{"role", "user"}, {"content", "Look at file " + std::to_string(t) + " and explain."}});
        std::string id = "call_" + std::to_string(t);
        body["messages"].push_back(
            {{"role", "assistant"},
             {"content", "Reading it."},
             {"reasoning_content", "Need the file."},
             {"tool_calls",
              {{{"id", id},
                {"type", "function"},
                {"function",
                 {{"name", "read_file"}, {"arguments", R"({"path": "src/a.cpp", "lines": [1, 200]})"}}}}}}});
        body["messages"].push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", std::string(2000, 'x')}});
    }
    return parse_chat_request(body);
}

std::string completion() {
    std::string s = "Let me plan this carefully. ";
    for (int i = 0; i < 40; ++i) s += "Step " + std::to_string(i) + ": think about the problem, 日本語 too.\n";
    s += "</think>I will call the tools now.\n\n<｜DSML｜ calls>\n";
    for (int i = 0; i < 4; ++i)
        s += "<｜DSML｜ invoke name=\"read_file\">\n<｜DSML｜ parameter name=\"path\" string=\"true\">src/module_" +
             std::to_string(i) +
             ".cpp</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"lines\" string=\"false\">[1, 2, 3, 400]"
             "</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n";
    return s + "</｜DSML｜ calls>";
}

void BM_RenderAgentPrompt(benchmark::State& st) {
    ChatRequest req = agent_request(static_cast<int>(st.range(0)));
    size_t bytes = 0;
    for (auto _ : st) {
        RenderedPrompt p = render_prompt(req, ChatFormat::deepseek_v41);
        bytes += p.text.size();
        benchmark::DoNotOptimize(p);
    }
    st.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_RenderAgentPrompt)->Arg(1)->Arg(20);

void BM_StreamParse(benchmark::State& st) {
    const std::string text = completion();
    const size_t chunk = static_cast<size_t>(st.range(0));  // ~4 bytes is one token
    OutputParserOptions o{ChatFormat::deepseek_v41, ParseStart::reasoning, true, {}, false};
    for (auto _ : st) {
        OutputParser p(o, [](int i) { return "call_" + std::to_string(i); });
        AssistantMessage m(true);
        for (size_t i = 0; i < text.size(); i += chunk) m.add(p.push(std::string_view(text).substr(i, chunk)));
        m.add(p.finish());
        benchmark::DoNotOptimize(m);
    }
    st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * text.size()));
    st.counters["time_per_token"] = benchmark::Counter(static_cast<double>(st.iterations() * (text.size() / 4)),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_StreamParse)->Arg(4)->Arg(64)->Arg(1 << 20);

}  // namespace

BENCHMARK_MAIN();
