#include "server/tool_call_grammar.h"

#include "engine/grammar/ebnf.h"
#include "server/api_error.h"
#include "server/protocol/chat_format.h"

#include <fmt/format.h>

#include <map>

namespace peregrine {

namespace {

// An EBNF string literal.
std::string lit(std::string_view s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        if (c == '\n') out += "\\n";
        else out += c;
    }
    return out + "\"";
}

struct Built {
    std::string ebnf;
    std::map<std::string, std::string> schema_rules;
};

Built build(const ChatRequest& req, ChatFormat fmt) {
    const DsmlNames n = dsml_names(fmt);
    const std::string open = "<" + std::string(tok::dsml), close = "</" + std::string(tok::dsml);
    Built b;
    std::string invokes;
    int t = 0;
    for (const ToolSpec* tool : req.prompt_tools()) {
        const std::string rule = fmt::format("invoke{}", t);
        std::string body = lit(open + std::string(n.invoke) + " name=\"" + tool->name + "\">\n");
        int params = 0;
        if (tool->parameters) {
            const ojson& s = *tool->parameters;
            if (!s.is_object() || (s.contains("type") && s["type"] != "object"))
                throw ApiError(400,
                               fmt::format("tool_choice: the parameters of '{}' must be an object schema", tool->name),
                               "tools");
            const ojson props = s.value("properties", ojson::object());
            std::vector<std::string> required;
            if (s.contains("required") && s["required"].is_array())
                for (auto& r : s["required"]) required.push_back(r.get<std::string>());
            int p = 0;
            for (auto it = props.begin(); it != props.end(); ++it, ++p) {
                const std::string arg = fmt::format("args{}_{}", t, p);
                b.schema_rules[arg] = it.value().dump();
                std::string param =
                    lit(open + std::string(n.parameter) + " name=\"" + it.key() + "\" string=\"false\">") + " " + arg +
                    " " + lit(close + std::string(n.parameter) + ">\n");
                const bool req_ = std::find(required.begin(), required.end(), it.key()) != required.end();
                body += " " + (req_ ? param : "(" + param + ")?");
                ++params;
            }
        }
        if (fmt == ChatFormat::deepseek_v41 && params == 0) body += " \"\\n\"";
        body += " " + lit(close + std::string(n.invoke) + ">\n");
        b.ebnf += rule + " ::= " + body + "\n";
        invokes += (invokes.empty() ? "" : " | ") + rule;
        ++t;
    }
    if (t == 0) throw ApiError(400, "tool_choice requires at least one tool", "tool_choice");
    b.ebnf += "invoke ::= " + invokes + "\n";
    b.ebnf += std::string("root ::= invoke") + (req.parallel_tool_calls ? "+ " : " ") +
              lit(close + std::string(n.block) + ">") + "\n";
    return b;
}

}  // namespace

std::string tool_call_grammar_key(const ChatRequest& req, ChatFormat fmt) {
    Built b = build(req, fmt);
    std::string key = "tool_calls" + std::string(1, '\0') + b.ebnf;
    for (auto& [k, v] : b.schema_rules) key += '\0' + k + '\0' + v;
    return key;
}

grammar::Grammar tool_call_grammar(const ChatRequest& req, ChatFormat fmt) {
    Built b = build(req, fmt);
    return grammar::ebnf_grammar(b.ebnf, "root", b.schema_rules);
}

}  // namespace peregrine
