#include "engine/grammar/regex.h"

#include <utf8proc.h>

#include <mutex>

#include "util/error.h"

namespace peregrine::grammar {

Frag encode_utf8(GrammarBuilder& b, const CodepointSet& set) { return b.codepoints(set); }

namespace {

// Unicode members of \d \w \s under Python's str semantics (and ECMA's \s), from utf8proc's tables.
struct UnicodeClasses {
    CodepointSet digit, word, space;
    UnicodeClasses() {
        for (uint32_t c = 0; c <= kMaxCodepoint; ++c) {
            if (c >= 0xD800 && c <= 0xDFFF) continue;
            auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
            bool letter = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
            bool number = cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO;
            bool mark = cat >= UTF8PROC_CATEGORY_MN && cat <= UTF8PROC_CATEGORY_ME;
            bool sep = cat >= UTF8PROC_CATEGORY_ZS && cat <= UTF8PROC_CATEGORY_ZP;
            if (number) digit.add(c);
            if (letter || number || mark || c == '_') word.add(c);
            if (sep) space.add(c);
        }
        for (uint32_t c : {9u, 10u, 11u, 12u, 13u, 0x1Cu, 0x1Du, 0x1Eu, 0x1Fu, 0x20u, 0x85u, 0xA0u, 0xFEFFu})
            space.add(c);
    }
};

const UnicodeClasses& unicode_classes() {
    static const UnicodeClasses u;
    return u;
}

struct Node {
    enum Kind { kEmpty, kSet, kConcat, kAlt, kRepeat, kStart, kEnd } kind = kEmpty;
    CodepointSet set;
    std::vector<Node> kids;
    int64_t min = 0, max = 0;
};

class RegexParser {
public:
    explicit RegexParser(const std::string& p) : src_(p) {
        for (size_t i = 0; i < p.size();) cps_.push_back(decode_utf8(p, i));
    }

    Node parse() {
        Node n = parse_alt();
        if (pos_ < cps_.size()) error("unbalanced ')'");
        return n;
    }

private:
    [[noreturn]] void error(const std::string& what) const {
        fail("regex '{}': {} (at position {})", src_, what, pos_);
    }
    bool at_end() const { return pos_ >= cps_.size(); }
    uint32_t peek(size_t k = 0) const { return pos_ + k < cps_.size() ? cps_[pos_ + k] : 0xFFFFFFFF; }
    uint32_t next() {
        if (at_end()) error("unexpected end of pattern");
        return cps_[pos_++];
    }

    Node parse_alt() {
        NestingLevel level(depth_, [&] { error(fmt::format("groups nest deeper than {} levels", kMaxNesting)); });
        Node first = parse_concat();
        if (peek() != '|') return first;
        Node alt;
        alt.kind = Node::kAlt;
        alt.kids.push_back(std::move(first));
        while (peek() == '|') {
            ++pos_;
            alt.kids.push_back(parse_concat());
        }
        return alt;
    }

    Node parse_concat() {
        Node cat;
        cat.kind = Node::kConcat;
        while (!at_end() && peek() != '|' && peek() != ')') cat.kids.push_back(parse_repeat());
        return cat;
    }

    bool parse_int(int64_t& v) {
        size_t start = pos_;
        v = 0;
        while (!at_end() && peek() >= '0' && peek() <= '9') {
            v = v * 10 + (next() - '0');
            if (v > 1000000) error("repetition count too large");
        }
        return pos_ > start;
    }

    // {m}, {m,}, {m,n}, {,n}; returns false (position restored) when '{' is a literal.
    bool parse_braces(int64_t& lo, int64_t& hi) {
        size_t save = pos_;
        ++pos_;
        bool has_lo = parse_int(lo);
        if (!has_lo) lo = 0;
        if (peek() == '}') {
            if (!has_lo) { pos_ = save; return false; }
            ++pos_;
            hi = lo;
            return true;
        }
        if (peek() != ',') { pos_ = save; return false; }
        ++pos_;
        if (!parse_int(hi)) hi = -1;
        if (peek() != '}') { pos_ = save; return false; }
        ++pos_;
        if (hi >= 0 && hi < lo) error("repetition {m,n} with n < m");
        return true;
    }

    Node parse_repeat() {
        Node atom = parse_atom();
        for (;;) {
            int64_t lo, hi;
            uint32_t c = peek();
            if (c == '*') { ++pos_; lo = 0; hi = -1; }
            else if (c == '+') { ++pos_; lo = 1; hi = -1; }
            else if (c == '?') { ++pos_; lo = 0; hi = 1; }
            else if (c == '{') { if (!parse_braces(lo, hi)) break; }
            else break;
            if (atom.kind == Node::kStart || atom.kind == Node::kEnd) error("quantified anchor");
            if (peek() == '?') ++pos_;  // lazy: same language
            else if (peek() == '+') error("possessive quantifiers are not supported");
            Node r;
            r.kind = Node::kRepeat;
            r.min = lo;
            r.max = hi;
            r.kids.push_back(std::move(atom));
            atom = std::move(r);
        }
        return atom;
    }

    static Node set_node(CodepointSet s) {
        Node n;
        n.kind = Node::kSet;
        n.set = std::move(s);
        return n;
    }

    uint32_t parse_hex(int digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; ++i) {
            uint32_t c = next();
            int d = c >= '0' && c <= '9' ? int(c - '0') : c >= 'a' && c <= 'f' ? int(c - 'a' + 10)
                  : c >= 'A' && c <= 'F' ? int(c - 'A' + 10) : -1;
            if (d < 0) error("bad hex escape");
            v = v * 16 + d;
        }
        if (v > kMaxCodepoint) error("escape beyond U+10FFFF");
        return v;
    }

    // After a backslash: a single code point (returned) or a class (set in `cls`, returns UINT32_MAX).
    uint32_t parse_escape(CodepointSet& cls, bool in_class) {
        uint32_t c = next();
        switch (c) {
            case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
                cls = class_escape_set(static_cast<char>(c));
                return UINT32_MAX;
            case 'n': return '\n';
            case 't': return '\t';
            case 'r': return '\r';
            case 'f': return '\f';
            case 'v': return '\v';
            case 'a': return '\a';
            case '0': return 0;
            case 'x': return parse_hex(2);
            case 'u':
                if (peek() == '{') {
                    ++pos_;
                    uint32_t v = 0;
                    while (peek() != '}') v = v * 16 + parse_hex(1);
                    ++pos_;
                    return v;
                }
                return parse_hex(4);
            case 'U': return parse_hex(8);
            case 'b':
                if (in_class) return '\b';
                error("word boundaries (\\b) are not supported");
            case 'B': error("word boundaries (\\B) are not supported");
            default: break;
        }
        if (c >= '1' && c <= '9') error("backreferences are not supported");
        if (c < 0x80 && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
            error(std::string("unsupported escape \\") + char(c));
        return c;  // escaped punctuation stands for itself
    }

    Node parse_class() {
        bool negate = false;
        if (peek() == '^') { ++pos_; negate = true; }
        CodepointSet set;
        bool first = true;
        while (first || peek() != ']') {
            if (at_end()) error("unterminated character class");
            uint32_t lo;
            CodepointSet cls;
            uint32_t c = next();
            if (c == '[' && peek() == ':') error("POSIX classes are not supported");
            if (c == '\\') {
                lo = parse_escape(cls, true);
                if (lo == UINT32_MAX) { set.add(cls); first = false; continue; }
            } else {
                lo = c;
            }
            first = false;
            if (peek() == '-' && peek(1) != ']' && peek(1) != 0xFFFFFFFF) {
                ++pos_;
                uint32_t hi = next();
                if (hi == '\\') {
                    hi = parse_escape(cls, true);
                    if (hi == UINT32_MAX) error("class escape as a range bound");
                }
                if (hi < lo) error("reversed character range");
                set.add(lo, hi);
            } else {
                set.add(lo);
            }
        }
        ++pos_;
        set = set.minus(CodepointSet::of(0xD800, 0xDFFF));
        return set_node(negate ? set.complement() : set);
    }

    Node parse_atom() {
        uint32_t c = next();
        switch (c) {
            case '(': {
                if (peek() == '?') {
                    ++pos_;
                    uint32_t k = next();
                    if (k == ':') {
                    } else if (k == 'P' && peek() == '<') {
                        while (next() != '>') {}
                    } else if (k == '<' && peek() != '=' && peek() != '!') {
                        while (next() != '>') {}
                    } else if (k == '=' || k == '!' || k == '<') {
                        error("lookaround assertions are not supported");
                    } else if (k == '#') {
                        while (next() != ')') {}
                        return Node{};
                    } else {
                        error("inline flags and (?...) extensions are not supported");
                    }
                }
                Node inner = parse_alt();
                if (at_end() || next() != ')') error("missing ')'");
                return inner;
            }
            case ')': error("unbalanced ')'");
            case '[': return parse_class();
            case '.': return set_node(dot_set());
            case '^': { Node n; n.kind = Node::kStart; return n; }
            case '$': { Node n; n.kind = Node::kEnd; return n; }
            case '*': case '+': case '?': error("nothing to repeat");
            case '\\': {
                if (peek() == 'A') { ++pos_; Node n; n.kind = Node::kStart; return n; }
                if (peek() == 'Z' || peek() == 'z') { ++pos_; Node n; n.kind = Node::kEnd; return n; }
                CodepointSet cls;
                uint32_t v = parse_escape(cls, false);
                if (v == UINT32_MAX) return set_node(cls);
                return set_node(CodepointSet::of(v, v));
            }
            default: return set_node(CodepointSet::of(c, c));
        }
    }

    std::string src_;
    std::vector<uint32_t> cps_;
    size_t pos_ = 0;
    int depth_ = 0;
};

Frag emit(GrammarBuilder& b, const Node& n, const CharEncoder& enc, const std::string& src) {
    switch (n.kind) {
        case Node::kEmpty: return b.empty();
        case Node::kSet:
            if (n.set.empty()) fail("regex '{}': empty character class matches nothing", src);
            return enc(b, n.set);
        case Node::kConcat: {
            std::vector<Frag> parts;
            for (const Node& k : n.kids) parts.push_back(emit(b, k, enc, src));
            return b.seq(parts);
        }
        case Node::kAlt: {
            std::vector<Frag> alts;
            for (const Node& k : n.kids) alts.push_back(emit(b, k, enc, src));
            return b.alt(alts);
        }
        case Node::kRepeat: return b.repeat(emit(b, n.kids[0], enc, src), n.min, n.max);
        case Node::kStart: case Node::kEnd:
            fail("regex '{}': anchors are only supported at the start or end of the pattern", src);
    }
    return b.empty();
}

}  // namespace

CodepointSet dot_set() {
    CodepointSet s = CodepointSet::any();
    CodepointSet nl;
    nl.add('\n');
    nl.add('\r');
    nl.add(0x2028, 0x2029);
    return s.minus(nl);
}

CodepointSet class_escape_set(char c) {
    static std::once_flag once;
    static CodepointSet d, w, s, nd, nw, ns;
    std::call_once(once, [] {
        d = CodepointSet::of('0', '9');
        w = CodepointSet::of('0', '9');
        w.add('A', 'Z');
        w.add('a', 'z');
        w.add('_');
        for (uint32_t x : {9u, 10u, 11u, 12u, 13u, 32u}) s.add(x);
        const UnicodeClasses& u = unicode_classes();
        CodepointSet all_d = u.digit, all_w = u.word, all_s = u.space;
        all_d.add(d);
        all_w.add(w);
        all_s.add(s);
        nd = all_d.complement();
        nw = all_w.complement();
        ns = all_s.complement();
    });
    switch (c) {
        case 'd': return d;
        case 'w': return w;
        case 's': return s;
        case 'D': return nd;
        case 'W': return nw;
        default: return ns;
    }
}

Frag build_regex(GrammarBuilder& b, const std::string& pattern, RegexMode mode, const CharEncoder& enc) {
    Node root = RegexParser(pattern).parse();
    std::vector<Node> branches;
    if (root.kind == Node::kAlt) branches = std::move(root.kids);
    else branches.push_back(std::move(root));
    std::vector<Frag> alts;
    for (Node& br : branches) {
        std::vector<Node> items;
        if (br.kind == Node::kConcat) items = std::move(br.kids);
        else items.push_back(std::move(br));
        bool anchored_start = false, anchored_end = false;
        // A lone top-level group such as ^(a|b)$ is common; anchors inside it stay unsupported.
        while (!items.empty() && items.front().kind == Node::kStart) anchored_start = true, items.erase(items.begin());
        while (!items.empty() && items.back().kind == Node::kEnd) anchored_end = true, items.pop_back();
        std::vector<Frag> parts;
        if (mode == RegexMode::kSearch && !anchored_start) parts.push_back(b.star(enc(b, CodepointSet::any())));
        for (const Node& it : items) parts.push_back(emit(b, it, enc, pattern));
        if (mode == RegexMode::kSearch && !anchored_end) parts.push_back(b.star(enc(b, CodepointSet::any())));
        alts.push_back(b.seq(parts));
    }
    return b.alt(alts);
}

Grammar regex_grammar(const std::string& pattern) {
    GrammarBuilder b;
    int32_t root = b.declare_rule("root");
    b.set_body(root, build_regex(b, pattern, RegexMode::kFullMatch, encode_utf8));
    return b.build(root);
}

}  // namespace peregrine::grammar
