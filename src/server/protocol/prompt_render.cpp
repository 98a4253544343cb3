#include "server/protocol/prompt_render.h"
#include "util/json_depth.h"

#include <algorithm>
#include <map>

namespace peregrine {

namespace {

constexpr std::string_view kV4EffortHigh =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking "
    "and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic "
    "against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire "
    "deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis "
    "to ensure absolutely no assumption is left unchecked.\n\n";
constexpr std::string_view kV4EffortMax =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\nYou MUST reason with the "
    "utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose the problem into its "
    "most fundamental components, trace every causal chain to its root, and resolve the underlying cause rather "
    "than any surface symptom.\nDo not stop reasoning until you have independently verified the solution from "
    "multiple angles and are certain that no assumption remains unchecked and no error remains undiscovered.\n\n";

// Accumulates prompt text and remembers which bytes are special tokens.
class PromptBuilder {
public:
    void text(std::string_view s) { out_.text += s; }
    void special(std::string_view tok) {
        size_t b = out_.text.size();
        out_.text += tok;
        out_.special_ranges.emplace_back(b, out_.text.size());
    }
    // Fixed encoder text: its ｜DSML｜, <think> and </think> are tokens, the rest is plain.
    void fixed(std::string_view s) {
        size_t i = 0, plain = 0;
        while (i < s.size()) {
            std::string_view hit;
            for (std::string_view t : {tok::dsml, tok::think_open, tok::think_close})
                if (s.substr(i, t.size()) == t) hit = t;
            if (hit.empty()) {
                ++i;
                continue;
            }
            text(s.substr(plain, i - plain));
            special(hit);
            i += hit.size();
            plain = i;
        }
        text(s.substr(plain));
    }
    RenderedPrompt take() { return std::move(out_); }

private:
    RenderedPrompt out_;
};

std::string dsml_open(std::string_view name) { return "<" + std::string(tok::dsml) + std::string(name); }
std::string dsml_close(std::string_view name) { return "</" + std::string(tok::dsml) + std::string(name) + ">"; }

FloatExponent float_style(ChatFormat fmt) {
    return fmt == ChatFormat::deepseek_v41 ? FloatExponent::python : FloatExponent::unpadded;
}

std::string tools_section(const std::vector<const ToolSpec*>& tools, ChatFormat fmt) {
    DsmlNames n = dsml_names(fmt);
    std::string s = "\n\n## Tools\n\nYou have access to a set of tools to help answer the user's question. "
                    "You can invoke tools by writing a \"" + dsml_open(n.block) + ">\" block like the following:\n\n";
    s += dsml_open(n.block) + ">\n";
    s += dsml_open(n.invoke) + " name=\"$TOOL_NAME\">\n";
    s += dsml_open(n.parameter) + " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE" +
         dsml_close(n.parameter) + "\n";
    s += "...\n" + dsml_close(n.invoke) + "\n";
    s += dsml_open(n.invoke) + " name=\"$TOOL_NAME2\">\n...\n" + dsml_close(n.invoke) + "\n";
    s += dsml_close(n.block) + "\n\n";
    s += "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
         "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
         "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
         "<think>...</think> BEFORE any tool calls or final response.\n\n"
         "Otherwise, output directly after </think> with tool calls or final response.\n\n"
         "### Available Tool Schemas\n\n";
    for (size_t i = 0; i < tools.size(); ++i) {
        ojson schema = ojson::object();
        schema["name"] = tools[i]->name;
        schema["description"] = tools[i]->description.value_or("");
        schema["parameters"] = tools[i]->parameters.value_or(ojson::object());
        if (i) s += "\n";
        s += dump_prompt_json(schema, float_style(fmt));
    }
    s += "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
    return s;
}

std::string response_format_section(const ResponseFormat& rf, ChatFormat fmt) {
    if (rf.type == ResponseFormatType::text) return {};
    if (rf.type == ResponseFormatType::json_object && fmt == ChatFormat::deepseek_v4)
        return "\n\nYou are a helpful assistant designed to output JSON.\n## Response Format:\n\nReply with JSON object ONLY.";
    ojson schema = rf.type == ResponseFormatType::json_object ? ojson::object({{"type", "json_object"}}) : rf.schema;
    return "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
           dump_prompt_json(schema, float_style(fmt));
}

std::string effort_prefix(const ChatRequest& req, ChatFormat fmt) {
    if (!req.thinking) return {};
    if (fmt == ChatFormat::deepseek_v41)
        return "Reasoning Effort: " + std::to_string(req.effort.value) +
               " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
    switch (req.effort.tier) {
    case EffortTier::low: return {};
    case EffortTier::high: return std::string(kV4EffortHigh);
    case EffortTier::max: return std::string(kV4EffortMax);
    }
    return {};
}

// One DSML block; `fixed` marks its ｜DSML｜ tokens while names and values stay plain text.
void emit_tool_calls(PromptBuilder& b, const std::vector<ToolCallRecord>& calls, ChatFormat fmt) {
    DsmlNames n = dsml_names(fmt);
    auto open = [&](std::string_view name) {
        b.text("<");
        b.special(tok::dsml);
        b.text(name);
    };
    auto close = [&](std::string_view name) {
        b.text("</");
        b.special(tok::dsml);
        b.text(name);
        b.text(">");
    };
    b.text("\n\n");
    open(n.block);
    b.text(">\n");
    for (const auto& c : calls) {
        open(n.invoke);
        b.text(" name=\"" + c.name + "\">\n");
        // Arguments that are a JSON object become one parameter per key; anything else is kept verbatim.
        ojson args = json_shape_problem(c.arguments) ? ojson(nullptr) : ojson::parse(c.arguments, nullptr, false);
        std::vector<std::pair<std::string, const ojson*>> params;
        ojson raw;
        if (args.is_object()) {
            for (auto it = args.begin(); it != args.end(); ++it) params.emplace_back(it.key(), &it.value());
        } else {
            raw = c.arguments;
            params.emplace_back("arguments", &raw);
        }
        for (size_t i = 0; i < params.size(); ++i) {
            const ojson& v = *params[i].second;
            bool is_str = v.is_string();
            if (fmt == ChatFormat::deepseek_v41 && i) b.text("\n");
            open(n.parameter);
            b.text(" name=\"" + params[i].first + "\" string=\"" + (is_str ? "true" : "false") + "\">");
            b.text(is_str ? v.get_ref<const std::string&>() : dump_prompt_json(v, float_style(fmt)));
            close(n.parameter);
            if (fmt == ChatFormat::deepseek_v4) b.text("\n");
        }
        if (fmt == ChatFormat::deepseek_v41) b.text("\n");
        close(n.invoke);
        b.text("\n");
    }
    close(n.block);
}

}  // namespace

std::string render_tool_calls(const std::vector<ToolCallRecord>& calls, ChatFormat fmt) {
    PromptBuilder b;
    emit_tool_calls(b, calls, fmt);
    return b.take().text;
}

RenderedPrompt render_prompt(const ChatRequest& req, ChatFormat fmt) {
    const bool v41 = fmt == ChatFormat::deepseek_v41;
    const auto tools = req.prompt_tools();
    const bool keep_reasoning = req.thinking && !tools.empty();
    // Empty system messages render as nothing at all (they do not even split user turns).
    std::vector<ChatMessage> msgs;
    for (const auto& m : req.messages)
        if (m.role != Role::system || !m.content.empty()) msgs.push_back(m);

    PromptBuilder b;
    b.special(tok::bos);

    // The preamble: effort, system text, tools and response format. V4.1 keeps only the first system
    // message here (later ones stay in place as <｜System｜> turns); V4 has no system token and hoists them all.
    size_t first = 0;
    std::string preamble = effort_prefix(req, fmt);
    if (v41) {
        if (!msgs.empty() && msgs[0].role == Role::system) {
            preamble += msgs[0].content;
            first = 1;
        }
    } else {
        std::string sys;
        for (const auto& m : msgs)
            if (m.role == Role::system) sys += (sys.empty() ? "" : "\n\n") + m.content;
        preamble += sys;
    }
    if (!tools.empty()) preamble += tools_section(tools, fmt);
    preamble += response_format_section(req.response_format, fmt);
    if (!preamble.empty()) {
        if (v41) b.special(tok::system);
        b.fixed(preamble);
    }

    // User turns absorb the tool results before them: consecutive user/tool messages form one turn.
    std::vector<std::string> user_parts;
    auto flush_user = [&] {
        if (user_parts.empty()) return;
        b.special(tok::user);
        for (size_t i = 0; i < user_parts.size(); ++i) {
            if (i) b.text("\n\n");
            b.text(user_parts[i]);
        }
        user_parts.clear();
    };
    const ChatMessage* last_calls = nullptr;  // the assistant turn the pending tool results answer
    bool open_prefix = false;
    for (size_t i = first; i < msgs.size(); ++i) {
        const ChatMessage& m = msgs[i];
        switch (m.role) {
        case Role::system:
            if (!v41) break;  // hoisted into the preamble
            flush_user();
            b.special(tok::system);
            b.text(m.content);
            break;
        case Role::user: user_parts.push_back(m.content); break;
        case Role::tool: {
            // Results go in the order of the calls they answer, whatever order the client sent them in.
            size_t j = i;
            while (j < msgs.size() && msgs[j].role == Role::tool) ++j;
            std::vector<const ChatMessage*> results;
            for (size_t k = i; k < j; ++k) results.push_back(&msgs[k]);
            if (last_calls) {
                std::map<std::string, size_t> order;
                for (size_t k = 0; k < last_calls->tool_calls.size(); ++k)
                    order.emplace(last_calls->tool_calls[k].id, k);
                std::stable_sort(results.begin(), results.end(), [&](auto* a, auto* c) {
                    return order[a->tool_call_id] < order[c->tool_call_id];
                });
            }
            for (auto* r : results) user_parts.push_back("<tool_result>" + r->content + "</tool_result>");
            i = j - 1;
            break;
        }
        case Role::latest_reminder:
            flush_user();
            b.special(tok::latest_reminder);
            b.text(m.content);
            break;
        case Role::assistant: {
            flush_user();
            b.special(tok::assistant);
            const bool is_prefix = m.prefix && i + 1 == msgs.size();
            const std::string reasoning = m.reasoning_content.value_or("");
            if (is_prefix && req.thinking) {
                // A continued turn: reasoning stays open unless the answer has begun.
                b.special(tok::think_open);
                b.text(reasoning);
                if (!m.content.empty() || !m.tool_calls.empty()) b.special(tok::think_close);
            } else if (keep_reasoning) {
                b.special(tok::think_open);
                b.text(reasoning);
                b.special(tok::think_close);
            } else {
                b.special(tok::think_close);
            }
            b.text(m.content);
            if (!m.tool_calls.empty()) emit_tool_calls(b, m.tool_calls, fmt);
            if (is_prefix) open_prefix = true;
            else b.special(tok::eos);
            last_calls = m.tool_calls.empty() ? nullptr : &m;
            break;
        }
        }
    }
    flush_user();

    if (!open_prefix) {
        b.special(tok::assistant);
        b.special(req.thinking ? tok::think_open : tok::think_close);
        bool forced = req.tool_choice.mode == ToolChoiceMode::required || req.tool_choice.mode == ToolChoiceMode::named;
        if (forced) {
            b.text("\n\n<");
            b.special(tok::dsml);
            b.text(std::string(dsml_names(fmt).block) + ">\n");
        }
    }
    return b.take();
}

}  // namespace peregrine
