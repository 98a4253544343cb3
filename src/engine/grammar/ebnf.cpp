#include "engine/grammar/ebnf.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>

#include "engine/grammar/budget.h"
#include "engine/grammar/builder.h"
#include "engine/grammar/regex.h"
#include "util/error.h"

namespace peregrine::grammar {

namespace {

struct Expr {
    enum Kind { kSeq, kAlt, kBytes, kSet, kRef, kRepeat } kind = kSeq;
    std::string text;  // kBytes: literal bytes; kRef: rule name
    CodepointSet set;
    std::vector<Expr> kids;
    int64_t min = 0, max = 0;
    int line = 0;
};

class EbnfParser {
public:
    explicit EbnfParser(const std::string& s) : s_(s) {}

    std::vector<std::pair<std::string, Expr>> parse() {
        std::vector<std::pair<std::string, Expr>> rules;
        skip_space();
        while (pos_ < s_.size()) {
            poll_budget();
            std::string name = parse_name();
            if (name.empty()) error("expected a rule name");
            skip_space();
            if (s_.compare(pos_, 3, "::=") != 0) error("expected '::=' after rule name '" + name + "'");
            pos_ += 3;
            rules.emplace_back(name, parse_alt());
            skip_space();
        }
        return rules;
    }

private:
    [[noreturn]] void error(const std::string& what) const {
        int line = 1;
        for (size_t i = 0; i < pos_ && i < s_.size(); ++i) line += s_[i] == '\n';
        fail("EBNF line {}: {}", line, what);
    }

    void skip_space() {
        while (pos_ < s_.size()) {
            char c = s_[pos_];
            if (c == '#') {
                while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
            } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
                ++pos_;
            } else {
                break;
            }
        }
    }

    static bool name_char(char c, bool first) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
               (!first && ((c >= '0' && c <= '9') || c == '-' || c == '.'));
    }

    std::string parse_name() {
        size_t start = pos_;
        while (pos_ < s_.size() && name_char(s_[pos_], pos_ == start)) ++pos_;
        return s_.substr(start, pos_ - start);
    }

    // Whether a rule definition (`name ::=`) starts here: it ends the current rule's body.
    bool at_definition() {
        size_t save = pos_;
        std::string n = parse_name();
        skip_space();
        bool def = !n.empty() && s_.compare(pos_, 3, "::=") == 0;
        pos_ = save;
        return def;
    }

    Expr parse_alt() {
        NestingLevel level(depth_, [&] { error(fmt::format("groups nest deeper than {} levels", kMaxNesting)); });
        Expr alt;
        alt.kind = Expr::kAlt;
        alt.kids.push_back(parse_seq());
        skip_space();
        while (pos_ < s_.size() && s_[pos_] == '|') {
            ++pos_;
            alt.kids.push_back(parse_seq());
            skip_space();
        }
        return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
    }

    Expr parse_seq() {
        Expr seq;
        seq.kind = Expr::kSeq;
        for (;;) {
            skip_space();
            if (pos_ >= s_.size()) break;
            char c = s_[pos_];
            if (c == '|' || c == ')') break;
            if (name_char(c, true) && at_definition()) break;
            seq.kids.push_back(parse_postfix());
        }
        return seq;
    }

    int64_t parse_int() {
        size_t start = pos_;
        int64_t v = 0;
        while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
            v = v * 10 + (s_[pos_++] - '0');
            if (v > 100000) error("repetition count too large");
        }
        if (pos_ == start) error("expected a number");
        return v;
    }

    Expr parse_postfix() {
        Expr e = parse_primary();
        for (;;) {
            if (pos_ >= s_.size()) break;
            char c = s_[pos_];
            int64_t lo, hi;
            if (c == '*') { ++pos_; lo = 0; hi = -1; }
            else if (c == '+') { ++pos_; lo = 1; hi = -1; }
            else if (c == '?') { ++pos_; lo = 0; hi = 1; }
            else if (c == '{') {
                ++pos_;
                skip_space();
                lo = parse_int();
                skip_space();
                hi = lo;
                if (pos_ < s_.size() && s_[pos_] == ',') {
                    ++pos_;
                    skip_space();
                    hi = (pos_ < s_.size() && s_[pos_] == '}') ? -1 : parse_int();
                    skip_space();
                }
                if (pos_ >= s_.size() || s_[pos_] != '}') error("expected '}'");
                ++pos_;
                if (hi >= 0 && hi < lo) error("repetition {m,n} with n < m");
            } else {
                break;
            }
            Expr r;
            r.kind = Expr::kRepeat;
            r.min = lo;
            r.max = hi;
            r.kids.push_back(std::move(e));
            e = std::move(r);
        }
        return e;
    }

    uint32_t parse_hex(int n) {
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
            if (pos_ >= s_.size()) error("truncated escape");
            char c = s_[pos_++];
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) error("bad hex digit in escape");
            v = v * 16 + d;
        }
        if (v > kMaxCodepoint) error("escape beyond U+10FFFF");
        return v;
    }

    // One (possibly escaped) code point inside a string or class.
    uint32_t parse_char() {
        if (pos_ >= s_.size()) error("unterminated string or class");
        if (s_[pos_] != '\\') return decode_utf8(s_, pos_);
        ++pos_;
        if (pos_ >= s_.size()) error("truncated escape");
        char c = s_[pos_++];
        switch (c) {
            case 'n': return '\n';
            case 't': return '\t';
            case 'r': return '\r';
            case 'f': return '\f';
            case 'v': return '\v';
            case 'b': return '\b';
            case 'a': return '\a';
            case '0': return 0;
            case 'e': return 0x1B;
            case 'x': return parse_hex(2);
            case 'u': return parse_hex(4);
            case 'U': return parse_hex(8);
            case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': return uint8_t(c);
            default: error(std::string("unknown escape \\") + c);
        }
    }

    Expr parse_primary() {
        char c = s_[pos_];
        Expr e;
        if (c == '"' || c == '\'') {
            ++pos_;
            e.kind = Expr::kBytes;
            while (pos_ < s_.size() && s_[pos_] != c) append_utf8(e.text, parse_char());
            if (pos_ >= s_.size()) error("unterminated string");
            ++pos_;
            return e;
        }
        if (c == '[') {
            ++pos_;
            bool negate = pos_ < s_.size() && s_[pos_] == '^';
            if (negate) ++pos_;
            CodepointSet set;
            while (pos_ < s_.size() && s_[pos_] != ']') {
                uint32_t lo = parse_char();
                if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
                    ++pos_;
                    uint32_t hi = parse_char();
                    if (hi < lo) error("reversed character range");
                    set.add(lo, hi);
                } else {
                    set.add(lo);
                }
            }
            if (pos_ >= s_.size()) error("unterminated character class");
            ++pos_;
            set = set.minus(CodepointSet::of(0xD800, 0xDFFF));
            e.kind = Expr::kSet;
            e.set = negate ? set.complement() : set;
            if (e.set.empty()) error("empty character class");
            return e;
        }
        if (c == '.') {
            ++pos_;
            e.kind = Expr::kSet;
            e.set = CodepointSet::any();
            return e;
        }
        if (c == '(') {
            ++pos_;
            e = parse_alt();
            skip_space();
            if (pos_ >= s_.size() || s_[pos_] != ')') error("expected ')'");
            ++pos_;
            return e;
        }
        if (name_char(c, true)) {
            e.kind = Expr::kRef;
            e.text = parse_name();
            return e;
        }
        error(std::string("unexpected character '") + c + "'");
    }

    const std::string& s_;
    size_t pos_ = 0;
    int depth_ = 0;
};

void collect_refs(const Expr& e, std::vector<std::string>& out) {
    if (e.kind == Expr::kRef) out.push_back(e.text);
    for (const Expr& k : e.kids) collect_refs(k, out);
}

}  // namespace

Grammar ebnf_grammar(const std::string& text, const std::string& root_rule,
                     const std::map<std::string, std::string>& schema_rules, const JsonSchemaOptions& schema_options) {
    auto parsed = EbnfParser(text).parse();
    std::map<std::string, const Expr*> defs;
    for (auto& [name, body] : parsed) {
        PEREGRINE_CHECK(!defs.count(name), "EBNF: rule '{}' is defined twice", name);
        PEREGRINE_CHECK(!schema_rules.count(name), "EBNF: rule '{}' is also given as a JSON Schema", name);
        defs[name] = &body;
    }
    PEREGRINE_CHECK(defs.count(root_rule), "EBNF: no '{}' rule", root_rule);
    std::map<std::string, std::vector<std::string>> refs;
    for (auto& [name, body] : defs) {
        poll_budget();
        collect_refs(*body, refs[name]);
        for (const std::string& r : refs[name])
            PEREGRINE_CHECK(defs.count(r) || schema_rules.count(r), "EBNF: rule '{}' references undefined rule '{}'",
                            name, r);
        // Schema rules are leaves here: their own recursion is handled by the schema compiler.
        std::erase_if(refs[name], [&](const std::string& r) { return schema_rules.count(r) > 0; });
    }
    // A rule is recursive if it can reach itself (it lies on a cycle of references); only those need pushdown calls.
    // Strongly connected components (Tarjan's algorithm, iterative: a chain of thousands of rules must not recurse
    // as deep); a walk from every rule was quadratic in a chain's length.
    std::vector<std::string> names;
    std::map<std::string, int> index_of;
    for (auto& [name, _] : defs) index_of[name] = static_cast<int>(names.size()), names.push_back(name);
    const int n = static_cast<int>(names.size());
    std::vector<std::vector<int>> adj(static_cast<size_t>(n));
    for (int v = 0; v < n; ++v)
        for (const std::string& r : refs[names[v]]) adj[v].push_back(index_of.at(r));
    std::vector<int> order(n, -1), low(n, 0), comp(n, -1), comp_size, stack;
    std::vector<uint8_t> on_stack(n, 0);
    int counter = 0;
    for (int root = 0; root < n; ++root) {
        if (order[root] >= 0) continue;
        std::vector<std::pair<int, size_t>> frames{{root, 0}};
        order[root] = low[root] = counter++;
        stack.push_back(root), on_stack[root] = 1;
        while (!frames.empty()) {
            poll_budget();
            const int v = frames.back().first;
            if (frames.back().second < adj[v].size()) {
                const int w = adj[v][frames.back().second++];
                if (order[w] < 0) {
                    order[w] = low[w] = counter++;
                    stack.push_back(w), on_stack[w] = 1;
                    frames.push_back({w, 0});
                } else if (on_stack[w]) {
                    low[v] = std::min(low[v], order[w]);
                }
                continue;
            }
            if (low[v] == order[v]) {
                const int c = static_cast<int>(comp_size.size());
                comp_size.push_back(0);
                for (int w = -1; w != v;) {
                    w = stack.back();
                    stack.pop_back(), on_stack[w] = 0;
                    comp[w] = c, ++comp_size[c];
                }
            }
            frames.pop_back();
            if (!frames.empty()) low[frames.back().first] = std::min(low[frames.back().first], low[v]);
        }
    }
    std::map<std::string, bool> recursive;
    for (int v = 0; v < n; ++v)
        recursive[names[v]] = comp_size[comp[v]] > 1 || std::find(adj[v].begin(), adj[v].end(), v) != adj[v].end();

    GrammarBuilder b;
    std::map<std::string, int32_t> rule_ids;
    int32_t root = b.declare_rule(root_rule);
    rule_ids[root_rule] = root;
    for (auto& [name, rec] : recursive)
        if (rec) rule_ids[name] = b.declare_rule(name);

    // Rules that are not recursive are inlined where they are used, so a chain of them nests as deep as it is long:
    // the depth is capped (the compile thread's stack), not the chain's length.
    int depth = 0;
    struct Leave {
        int& depth;
        ~Leave() { --depth; }
    };
    std::function<Frag(const Expr&)> emit = [&](const Expr& e) -> Frag {
        poll_budget();  // inlining rules can multiply the work
        Leave leave{++depth};
        if (depth > kMaxInlineDepth)
            fail("rules refer to one another (inlined) deeper than {} levels: make the chain recursive or shorter",
                 kMaxInlineDepth);
        switch (e.kind) {
            case Expr::kBytes: return b.literal(e.text);
            case Expr::kSet: return b.codepoints(e.set);
            case Expr::kRef:
                if (auto it = schema_rules.find(e.text); it != schema_rules.end())
                    return json_schema_fragment(b, it->second, schema_options);
                if (recursive[e.text] || e.text == root_rule) return b.call(rule_ids[e.text]);
                return emit(*defs[e.text]);
            case Expr::kSeq: {
                std::vector<Frag> parts;
                for (const Expr& k : e.kids) parts.push_back(emit(k));
                return b.seq(parts);
            }
            case Expr::kAlt: {
                std::vector<Frag> alts;
                for (const Expr& k : e.kids) alts.push_back(emit(k));
                return b.alt(alts);
            }
            case Expr::kRepeat: return b.repeat(emit(e.kids[0]), e.min, e.max);
        }
        return b.empty();
    };
    for (auto& [name, id] : rule_ids) b.set_body(id, emit(*defs[name]));
    return b.build(root);
}

}  // namespace peregrine::grammar
