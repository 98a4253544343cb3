#include "server/protocol/output_parser.h"

#include "server/protocol/json_text.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <random>

namespace peregrine {

namespace {

const std::string kOpen = "<" + std::string(tok::dsml);    // starts every DSML opening tag
const std::string kClose = "</" + std::string(tok::dsml);  // starts every DSML closing tag
constexpr size_t kMaxTag = 4096;                          // a tag longer than this is not a tag

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

// Trailing bytes of `s` that start a UTF-8 character whose remaining bytes have not arrived.
size_t utf8_incomplete_tail(std::string_view s) {
    for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
        unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
        if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

// Longest proper prefix of `pat` that `s` ends with.
size_t partial_suffix(std::string_view s, std::string_view pat) {
    for (size_t k = std::min(s.size(), pat.size() - 1); k > 0; --k)
        if (s.substr(s.size() - k) == pat.substr(0, k)) return k;
    return 0;
}

struct Tag {
    bool close = false;
    std::string name;
    std::vector<std::pair<std::string, std::string>> attrs;
    size_t len = 0;
    const std::string* attr(std::string_view key) const {
        for (auto& [k, v] : attrs)
            if (k == key) return &v;
        return nullptr;
    }
};
enum class TagStatus { incomplete, ok, bad };

// `s` starts with kOpen or kClose. Grammar: prefix, spaces, name, (spaces key="value")*, spaces, '>'.
TagStatus parse_tag(std::string_view s, Tag& t) {
    t = Tag{};
    t.close = s.starts_with(kClose);
    size_t i = t.close ? kClose.size() : kOpen.size();
    auto at_end = [&] { return i >= s.size(); };
    auto more = [&] { return s.size() > kMaxTag ? TagStatus::bad : TagStatus::incomplete; };
    while (!at_end() && s[i] == ' ') ++i;
    while (!at_end() && is_name_char(s[i])) t.name += s[i++];
    if (at_end()) return more();
    if (t.name.empty()) return TagStatus::bad;
    for (;;) {
        while (!at_end() && s[i] == ' ') ++i;
        if (at_end()) return more();
        if (s[i] == '>') {
            t.len = i + 1;
            return TagStatus::ok;
        }
        std::string key;
        while (!at_end() && is_name_char(s[i])) key += s[i++];
        if (at_end()) return more();
        if (key.empty() || s[i] != '=') return TagStatus::bad;
        if (++i >= s.size()) return more();
        if (s[i] != '"') return TagStatus::bad;
        size_t q = s.find('"', i + 1);
        if (q == std::string_view::npos) return more();
        t.attrs.emplace_back(key, std::string(s.substr(i + 1, q - i - 1)));
        i = q + 1;
    }
}

bool is_block_name(std::string_view n) {
    return n == "calls" || n == "tool_calls" || n == "toolcalls" || n == "function_calls";
}

std::string random_call_id(int) {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    std::string id = "call_";
    for (int i = 0; i < 24; ++i) id += kAlnum[rng() % (sizeof kAlnum - 1)];
    return id;
}

}  // namespace

OutputParserOptions output_parser_options(const ChatRequest& req, ChatFormat fmt) {
    OutputParserOptions o;
    o.format = fmt;
    o.parse_tool_calls = !req.prompt_tools().empty();
    o.stop = req.stop;
    o.json_output = req.response_format.type == ResponseFormatType::json_object;
    const ChatMessage& last = req.messages.back();
    const bool prefix = last.role == Role::assistant && last.prefix;
    if (req.tool_choice.mode == ToolChoiceMode::required || req.tool_choice.mode == ToolChoiceMode::named)
        o.start = ParseStart::tool_calls;
    else if (!req.thinking)
        o.start = ParseStart::content;  // the prompt ended with </think> (a prefix turn too)
    else if (prefix)
        o.start = last.content.empty() && last.tool_calls.empty() ? ParseStart::reasoning_continuation
                                                                   : ParseStart::content_continuation;
    else
        o.start = ParseStart::reasoning;
    return o;
}

OutputParser::OutputParser(OutputParserOptions opts, IdGenerator ids)
    : opts_(std::move(opts)), ids_(ids ? std::move(ids) : IdGenerator(random_call_id)) {
    std::erase(opts_.stop, std::string());
    switch (opts_.start) {
    case ParseStart::content: state_ = State::content; break;
    case ParseStart::reasoning: state_ = State::reasoning; break;
    case ParseStart::reasoning_continuation: state_ = State::reasoning; leading_ = false; break;
    case ParseStart::content_continuation: state_ = State::content; leading_ = false; break;
    case ParseStart::tool_calls: state_ = State::block; block_raw_live_ = false; break;
    }
}

void OutputParser::emit(ParseEvent::Kind k, std::string text, int index, std::string id) {
    if (text.empty() && k != ParseEvent::Kind::tool_call_start) return;
    // Adjacent deltas of the same stream merge, so one push yields few events.
    if (!out_.empty() && k != ParseEvent::Kind::tool_call_start && k != ParseEvent::Kind::warning &&
        out_.back().kind == k && out_.back().index == index) {
        out_.back().text += text;
        return;
    }
    out_.push_back(ParseEvent{k, std::move(text), index, std::move(id)});
}

void OutputParser::emit_args(std::string text) {
    emit(ParseEvent::Kind::tool_call_arguments, std::move(text), calls_ - 1);
}
void OutputParser::warn(std::string msg) { emit(ParseEvent::Kind::warning, std::move(msg)); }

std::vector<ParseEvent> OutputParser::push(std::string_view chunk) {
    buf_ += chunk;
    while (step()) {
    }
    return std::move(out_);
}

std::vector<ParseEvent> OutputParser::finish() {
    eof_ = true;
    while (step()) {
    }
    // What is left is an unterminated structure: close it so every started call has valid JSON.
    switch (state_) {
    case State::value:
        cut_in_block_ = true;
        warn("tool call parameter not closed at end of output");
        close_value();
        close_invoke();
        break;
    case State::invoke:
        cut_in_block_ = true;
        warn("tool call not closed at end of output");
        close_invoke();
        break;
    case State::block:
        if (block_raw_live_) {
            warn("malformed tool-call block returned as text");
            emit(block_origin_ == State::reasoning ? ParseEvent::Kind::reasoning : ParseEvent::Kind::content,
                 block_raw_ + buf_);
        } else {
            cut_in_block_ = true;
            warn("tool-call block not closed at end of output");
        }
        break;
    default: break;
    }
    buf_.clear();
    state_ = State::finished;
    return std::move(out_);
}

bool OutputParser::step() {
    switch (state_) {
    case State::reasoning:
    case State::content:
    case State::json:
    case State::json_done: return step_text();
    case State::block:
    case State::invoke: return step_block();
    case State::value: return step_value();
    case State::finished: {
        // The end-of-sentence text may close a tool-call block's output (DeepSeek's encoding ends every
        // assistant turn with it); it is not text after the end.
        std::string_view rest = buf_;
        if (!eos_seen_ && rest.starts_with(tok::eos)) {
            rest.remove_prefix(tok::eos.size());
            eos_seen_ = true;
        } else if (!eos_seen_ && !eof_ && !rest.empty() && tok::eos.starts_with(rest)) {
            return false;  // may still become it
        }
        if (!warned_after_end_ && !stopped_ &&
            std::any_of(rest.begin(), rest.end(), [](char c) { return !is_space(c); })) {
            warn(eos_seen_ ? "text after the end-of-sentence token dropped" : "text after the tool-call block dropped");
            warned_after_end_ = true;
        }
        buf_.clear();
        return false;
    }
    }
    return false;
}

bool OutputParser::step_text() {
    const bool reasoning = state_ == State::reasoning;
    const auto kind = reasoning ? ParseEvent::Kind::reasoning : ParseEvent::Kind::content;
    // JSON output mode (response_format json_object): outside the JSON, each run of other text becomes one space.
    const bool masked = (state_ == State::content && opts_.json_output) || state_ == State::json_done;
    if (leading_) {
        size_t n = 0;
        while (n < buf_.size() && buf_[n] == '\n') ++n;
        buf_.erase(0, n);
        if (buf_.empty()) return false;
    }
    // Markers: </think> (reasoning end, or a stray one in content), the DSML block, stop sequences, and in
    // JSON output mode the JSON's start (a ``` fence, or a bare { or [) and end (a closing fence).
    // Newlines right before </think> in reasoning and before a DSML block belong to the marker.
    // The end-of-sentence text, written out, ends the output wherever it comes (as DeepSeek's encoding reads
    // a completion: everything before it is the message).
    enum What { think_end, dsml, stop, fence_open, bare_open, fence_close, eos };
    struct Marker {
        std::string_view text;
        bool absorbs_newlines;
        What what;
    };
    std::vector<Marker> markers;
    switch (state_) {
    case State::reasoning:
        if (opts_.parse_tool_calls) markers.push_back({kOpen, true, dsml});
        markers.push_back({tok::think_close, true, think_end});
        break;
    case State::content:
        if (opts_.json_output) {
            for (std::string_view f : {"```json\n", "```\n"}) markers.push_back({f, false, fence_open});
            for (std::string_view b : {"{", "["}) markers.push_back({b, false, bare_open});
        } else {
            for (auto& st : opts_.stop) markers.push_back({st, false, stop});
        }
        if (opts_.parse_tool_calls) markers.push_back({kOpen, true, dsml});
        markers.push_back({tok::think_close, false, think_end});
        break;
    case State::json:
        for (auto& st : opts_.stop) markers.push_back({st, false, stop});
        markers.push_back({"\n```", false, fence_close});
        break;
    default:  // json_done
        if (opts_.parse_tool_calls) markers.push_back({kOpen, true, dsml});
        break;
    }
    markers.push_back({tok::eos, false, eos});
    auto emit_text = [&](std::string text) {
        if (text.empty()) return;
        leading_ = false;
        if (!masked) return emit(kind, std::move(text));
        if (!run_spaced_) emit(kind, " ");
        run_spaced_ = true;
    };

    size_t best_pos = std::string::npos, best_end = std::string::npos;
    const Marker* best = nullptr;
    for (auto& m : markers) {
        size_t p = buf_.find(m.text);
        if (p != std::string::npos && p + m.text.size() < best_end) {
            best_pos = p;
            best_end = p + m.text.size();
            best = &m;
        }
    }
    if (best) {
        size_t text_end = best_pos;
        if (best->absorbs_newlines) {
            while (text_end > 0 && buf_[text_end - 1] == '\n') --text_end;
            // DeepSeek's matcher does not count the first newline that breaks a partial match of the
            // marker (text ending in "<" or "<｜DSML" right before the newlines): that newline stays text.
            if (text_end < best_pos && partial_suffix(tail_ + buf_.substr(0, text_end), best->text) > 0) ++text_end;
        }
        std::string absorbed = buf_.substr(text_end, best_pos - text_end);
        emit_text(buf_.substr(0, text_end));
        tail_.clear();
        run_spaced_ = false;
        switch (best->what) {
        case think_end:
            buf_.erase(0, best_end);
            if (reasoning) {
                state_ = State::content;
                leading_ = true;
            } else {
                warn("stray </think> in the answer dropped");
                leading_ = false;
            }
            break;
        case dsml:
            buf_.erase(0, best_pos);  // the tag itself is parsed in the block state
            block_origin_ = state_;
            block_raw_ = absorbed;
            block_raw_live_ = true;
            outer_tag_pending_ = true;
            state_ = State::block;
            break;
        case stop:
            buf_.clear();
            stopped_ = true;
            state_ = State::finished;
            break;
        case eos:
            buf_.erase(0, best_end);
            eos_seen_ = true;
            state_ = State::finished;
            break;
        case fence_open:
        case bare_open:
            if (best->what == bare_open) emit(kind, std::string(best->text));
            buf_.erase(0, best_end);
            leading_ = false;
            state_ = State::json;
            break;
        case fence_close:
            buf_.erase(0, best_end);
            state_ = State::json_done;
            break;
        }
        return true;
    }
    // No marker yet: hold back what could still grow into one, and an incomplete UTF-8 character.
    size_t hold = 0;
    if (!eof_) {
        for (auto& m : markers) {
            size_t h = partial_suffix(buf_, m.text);
            if (m.absorbs_newlines)
                while (h < buf_.size() && buf_[buf_.size() - h - 1] == '\n') ++h;
            hold = std::max(hold, h);
        }
        hold += utf8_incomplete_tail(std::string_view(buf_).substr(0, buf_.size() - hold));
    }
    if (hold < buf_.size()) {
        tail_ += std::string_view(buf_).substr(0, buf_.size() - hold);
        if (tail_.size() > 32) tail_.erase(0, tail_.size() - 32);
        emit_text(buf_.substr(0, buf_.size() - hold));
        buf_.erase(0, buf_.size() - hold);
    }
    return false;
}

bool OutputParser::malformed_block(const std::string& why) {
    // The opening tag is not DSML after all: give its text back and carry on as before.
    warn("malformed DSML returned as text: " + why);
    emit(block_origin_ == State::reasoning ? ParseEvent::Kind::reasoning : ParseEvent::Kind::content,
         block_raw_ + kOpen);
    buf_.erase(0, kOpen.size());
    block_raw_.clear();
    block_raw_live_ = false;
    outer_tag_pending_ = false;
    tail_.clear();
    state_ = block_origin_;
    leading_ = false;
    return true;
}

bool OutputParser::step_block() {
    auto consume = [&](size_t n) {
        if (block_raw_live_) block_raw_ += buf_.substr(0, n);
        buf_.erase(0, n);
    };
    if (outer_tag_pending_) {
        Tag t;
        TagStatus st = parse_tag(buf_, t);
        if (st == TagStatus::incomplete && !eof_) return false;
        if (st != TagStatus::ok) return malformed_block("unterminated or invalid tag");
        if (t.close || t.name == "parameter") return malformed_block("unexpected <" + t.name + "> tag");
        outer_tag_pending_ = false;
        if (t.name == "invoke") {
            warn("tool call without an enclosing block");
            return true;  // the invoke tag is handled below
        }
        if (!is_block_name(t.name)) return malformed_block("unknown block <" + t.name + ">");
        consume(t.len);
        return true;
    }
    size_t ws = 0;
    while (ws < buf_.size() && is_space(buf_[ws])) ++ws;
    consume(ws);
    if (buf_.empty()) return false;
    if (!buf_.starts_with(kOpen) && !buf_.starts_with(kClose)) {
        // Stray text between tags: dropped, up to the next tag (or what could still begin one).
        size_t next = std::min(buf_.find(kOpen), buf_.find(kClose));
        if (next == std::string::npos) {
            if (!eof_ && (kOpen.starts_with(buf_) || kClose.starts_with(buf_))) return false;
            next =
                eof_ ? buf_.size() : buf_.size() - std::max(partial_suffix(buf_, kOpen), partial_suffix(buf_, kClose));
        }
        if (next == 0) return false;
        warn("stray text in tool-call block dropped");
        consume(next);
        return true;
    }
    Tag t;
    TagStatus st = parse_tag(buf_, t);
    if (st == TagStatus::incomplete && !eof_) return false;
    if (st != TagStatus::ok) {
        if (eof_) return false;  // finish() decides what the unterminated tag becomes
        warn("invalid DSML tag dropped");
        consume(t.close ? kClose.size() : kOpen.size());
        return true;
    }
    if (state_ == State::block) {
        if (!t.close && t.name == "invoke") {
            const std::string* name = t.attr("name");
            if (!name || name->empty()) {
                warn("tool call without a name dropped");
                consume(t.len);
                return true;
            }
            consume(t.len);
            block_raw_live_ = false;
            block_raw_.clear();
            ++calls_;
            params_ = 0;
            emit(ParseEvent::Kind::tool_call_start, *name, calls_ - 1, ids_(calls_ - 1));
            state_ = State::invoke;
        } else if (t.close && t.name != "invoke" && t.name != "parameter") {
            consume(t.len);
            state_ = State::finished;
        } else {
            warn("unexpected DSML tag <" + std::string(t.close ? "/" : "") + t.name + "> dropped");
            consume(t.len);
        }
        return true;
    }
    // Inside an invoke.
    if (!t.close && t.name == "parameter") {
        const std::string* name = t.attr("name");
        const std::string* str = t.attr("string");
        consume(t.len);
        std::string head = params_ == 0 ? "{\"" : ", \"";
        append_json_escaped(head, name ? *name : "");
        head += "\": ";
        if (!name) warn("tool call parameter without a name");
        if (str && *str == "true") {
            value_kind_ = ValueKind::string;
            head += '"';
        } else if (str && *str == "false") {
            value_kind_ = ValueKind::json;
        } else {
            warn("tool call parameter without string=\"true|false\"");
            value_kind_ = ValueKind::guess;
        }
        ++params_;
        emit_args(std::move(head));
        value_.clear();
        state_ = State::value;
    } else if (t.close && t.name == "invoke") {
        consume(t.len);
        close_invoke();
        state_ = State::block;
    } else if (!t.close && t.name == "invoke") {
        warn("tool call not closed before the next one");
        close_invoke();
        state_ = State::block;
    } else if (t.close && t.name != "parameter") {
        warn("tool call not closed before the end of the block");
        consume(t.len);
        close_invoke();
        state_ = State::finished;
    } else {
        warn("unexpected DSML tag <" + std::string(t.close ? "/" : "") + t.name + "> dropped");
        consume(t.len);
    }
    return true;
}

void OutputParser::close_value() {
    if (value_kind_ == ValueKind::string) {
        emit_args("\"");
        return;
    }
    if (nlohmann::json::accept(value_)) {
        emit_args(value_);  // verbatim, as the model wrote it
    } else {
        if (value_kind_ == ValueKind::json) warn("parameter marked string=\"false\" is not JSON; passed as a string");
        std::string s = "\"";
        append_json_escaped(s, value_);
        emit_args(s + "\"");
    }
    value_.clear();
}

void OutputParser::close_invoke() { emit_args(params_ == 0 ? "{}" : "}"); }

bool OutputParser::step_value() {
    size_t open = buf_.find(kOpen), close = buf_.find(kClose);
    size_t end = std::min(open, close);
    size_t take = end;
    if (end == std::string::npos) {
        take = buf_.size();
        if (!eof_) {
            size_t hold = std::max(partial_suffix(buf_, kOpen), partial_suffix(buf_, kClose));
            take -= hold;
            take -= utf8_incomplete_tail(std::string_view(buf_).substr(0, take));
        }
    }
    if (take > 0) {
        if (value_kind_ == ValueKind::string) {
            std::string esc;
            append_json_escaped(esc, std::string_view(buf_).substr(0, take));
            emit_args(std::move(esc));
        } else {
            value_ += buf_.substr(0, take);
        }
        buf_.erase(0, take);
    }
    if (end == std::string::npos) return false;
    if (buf_.starts_with(kOpen)) {
        warn("tool call parameter not closed before the next tag");
        close_value();
        state_ = State::invoke;
        return true;
    }
    Tag t;
    TagStatus st = parse_tag(buf_, t);
    if (st == TagStatus::incomplete && !eof_) return false;
    close_value();
    state_ = State::invoke;
    if (st != TagStatus::ok) {
        warn("invalid closing tag in tool call parameter");
        buf_.erase(0, kClose.size());
    } else if (t.name == "parameter") {
        buf_.erase(0, t.len);
    } else {
        warn("tool call parameter not closed");  // the invoke (or block) close is handled next
    }
    return true;
}

}  // namespace peregrine
