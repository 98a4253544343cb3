#pragma once
// Streaming parser for DeepSeek V4 / V4.1 completions: splits raw model text into reasoning, answer
// content and DSML tool calls, as events a server turns into OpenAI chunks or Anthropic content blocks
// (reasoning -> thinking_delta, content -> text_delta, tool_call_start -> tool_use block start,
// tool_call_arguments -> input_json_delta).
//
// Guarantees, for any split of the input into chunks (bytes, even inside a UTF-8 character):
// - the concatenated events equal those of parsing the whole text at once;
// - only what could still begin a tag (or a stop sequence, or an incomplete UTF-8 character) is held
//   back, so no markup reaches content and no tag fragment reaches arguments;
// - each tool call's arguments are a JSON object text ({"k": v, ...}) once its start event is out;
// - malformed DSML never throws: it comes back as text (or is dropped inside a block) with a warning.
#include "server/protocol/chat_format.h"
#include "server/protocol/chat_request.h"

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace peregrine {

// Where the completion starts, given how the prompt ended.
enum class ParseStart {
    content,                 // prompt ended with </think>: answer, leading newlines dropped
    reasoning,               // prompt ended with <think>: reasoning, leading newlines dropped
    reasoning_continuation,  // prefix turn still in its reasoning
    content_continuation,    // prefix turn already in its answer
    tool_calls,              // prompt opened the DSML block (tool_choice required / named)
};

struct OutputParserOptions {
    ChatFormat format = ChatFormat::deepseek_v41;
    ParseStart start = ParseStart::content;
    bool parse_tool_calls = false;  // off without tools or with tool_choice "none": DSML is plain text then
    std::vector<std::string> stop;  // matched in answer content only; the text from the match on is dropped
    // response_format json_object: the answer is the JSON (fenced or starting at a bare { or [); each run of
    // other text around it becomes one space, as DeepSeek's API does.
    bool json_output = false;
};

// Whether the response has a reasoning_content field: only when the output starts in reasoning.
inline bool reports_reasoning(ParseStart s) {
    return s == ParseStart::reasoning || s == ParseStart::reasoning_continuation;
}

// The options that match how render_prompt() ended the prompt for this request.
OutputParserOptions output_parser_options(const ChatRequest& req, ChatFormat fmt);

struct ParseEvent {
    enum class Kind { reasoning, content, tool_call_start, tool_call_arguments, warning };
    Kind kind;
    std::string text;  // delta text; the function name for tool_call_start; the message for warning
    int index = -1;    // tool-call index (tool_call_start / tool_call_arguments)
    std::string id;    // tool_call_start only
};

class OutputParser {
public:
    using IdGenerator = std::function<std::string(int index)>;
    // `ids` makes tool-call ids; the default gives "call_" + 24 random alphanumerics.
    explicit OutputParser(OutputParserOptions opts, IdGenerator ids = {});

    std::vector<ParseEvent> push(std::string_view chunk);
    std::vector<ParseEvent> finish();

    // True once the answer is complete (tool-call block closed, or a stop sequence): the engine may stop.
    bool done() const { return state_ == State::finished; }
    bool stopped_by_sequence() const { return stopped_; }
    int tool_call_count() const { return calls_; }
    // After finish(): the output ended inside the tool-call block (a budget ran out mid-call), so its last call
    // is what was produced, not a finished call: the finish reason is the engine's ("length"), not tool_calls.
    bool cut_in_block() const { return cut_in_block_; }

private:
    enum class State { reasoning, content, json, json_done, block, invoke, value, finished };
    bool step();  // consumes what can be decided; false when more input (or finish) is needed
    bool step_text();
    bool step_block();
    bool step_value();
    bool malformed_block(const std::string& why);
    void emit(ParseEvent::Kind k, std::string text, int index = -1, std::string id = {});
    void emit_args(std::string text);
    void warn(std::string msg);
    void close_value();
    void close_invoke();

    OutputParserOptions opts_;
    IdGenerator ids_;
    State state_;
    bool leading_ = true;       // leading newlines are still dropped
    bool run_spaced_ = false;   // JSON output mode: this run of non-JSON text already gave its space
    bool eof_ = false;
    bool stopped_ = false;
    bool warned_after_end_ = false;
    bool cut_in_block_ = false;
    bool eos_seen_ = false;     // the end-of-sentence text was read: anything after it is dropped
    std::string buf_;           // input not yet decided
    std::string tail_;          // last text bytes emitted since the last marker (for partial-match context)
    std::vector<ParseEvent> out_;

    // DSML block bookkeeping.
    State block_origin_ = State::content;  // where text goes if the block turns out malformed
    bool outer_tag_pending_ = false;       // the block's opening tag is not parsed yet
    bool block_raw_live_ = false;          // no call emitted yet: the block can still become text
    std::string block_raw_;                // raw block text so far (incl. newlines absorbed before it)
    int calls_ = 0;
    int params_ = 0;                       // parameters of the open invoke
    enum class ValueKind { string, json, guess } value_kind_ = ValueKind::string;
    std::string value_;                    // buffered non-string value
};

}  // namespace peregrine
