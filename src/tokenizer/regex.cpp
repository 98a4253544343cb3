#include "tokenizer/regex.h"

#include "tokenizer/unicode_delta.h"
#include "util/error.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace peregrine {

namespace {
// Oniguruma (UTF-8, Ruby syntax) vs PCRE2 with UCP: \s is exactly White_Space (PCRE2's takes
// U+180E and misses U+0085); \w is L|M|N|Pc; \h is a hex digit; \uHHHH is a code point; \p{X}
// includes the characters assigned after Unicode 14.
const char* kSpace =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
const char* kHex = "0-9a-fA-F";

// Class body for \p{name}: PCRE2's property plus the code points newer Unicode added to it.
std::string prop_body(std::string_view name) {
    std::string out = "\\p{";
    out.append(name);
    out += "}";
    out += unicode_delta_ranges(name);
    return out;
}
std::string word_body() { return prop_body("L") + prop_body("M") + prop_body("N") + prop_body("Pc"); }

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

struct JitStack {
    pcre2_jit_stack* stack = nullptr;
    pcre2_match_context* ctx = nullptr;
    pcre2_match_data* md = nullptr;
    JitStack() {
        stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
        ctx = pcre2_match_context_create(nullptr);
        pcre2_jit_stack_assign(ctx, nullptr, stack);
        md = pcre2_match_data_create(1, nullptr);
    }
    ~JitStack() {
        pcre2_match_data_free(md);
        pcre2_match_context_free(ctx);
        pcre2_jit_stack_free(stack);
    }
};
JitStack& thread_jit() {
    thread_local JitStack js;
    return js;
}
}  // namespace

std::string Regex::translate(std::string_view p) {
    std::string out;
    out.reserve(p.size() + 16);
    bool in_class = false;
    for (size_t i = 0; i < p.size(); ++i) {
        char c = p[i];
        if (c == '\\' && i + 1 < p.size()) {
            char e = p[i + 1];
            if (e == 'u' && i + 5 < p.size() && is_hex(p[i + 2]) && is_hex(p[i + 3]) && is_hex(p[i + 4]) &&
                is_hex(p[i + 5])) {
                out += "\\x{";
                out.append(p.substr(i + 2, 4));
                out += "}";
                i += 5;
                continue;
            }
            // Class shorthands: body of the positive class, and whether this escape is the negation.
            std::string body;
            bool neg = false;
            size_t consumed = 1;
            if (e == 's' || e == 'S') { body = kSpace; neg = e == 'S'; }
            if (e == 'w' || e == 'W') { body = word_body(); neg = e == 'W'; }
            if (e == 'h' || e == 'H') { body = kHex; neg = e == 'H'; }
            if (e == 'd' || e == 'D') { body = prop_body("Nd"); neg = e == 'D'; }
            if (e == 'p' || e == 'P') {
                std::string name;
                if (i + 2 < p.size() && p[i + 2] == '{') {
                    size_t close = p.find('}', i + 3);
                    PEREGRINE_CHECK(close != std::string_view::npos, "tokenizer regex: unclosed \\p{{ in {}", p);
                    name = std::string(p.substr(i + 3, close - i - 3));
                    consumed = close - i;
                } else if (i + 2 < p.size()) {
                    name = std::string(1, p[i + 2]);
                    consumed = 2;
                }
                neg = e == 'P';
                if (!name.empty() && name[0] == '^') {
                    neg = !neg;
                    name.erase(0, 1);
                }
                body = prop_body(name);
            }
            if (!body.empty()) {
                if (!in_class) {
                    out += neg ? "[^" : "[";
                    out += body;
                    out += "]";
                } else if (!neg) {
                    out += body;
                } else if (e == 'S' || e == 'P' || e == 'D' || e == 'p') {
                    // Negated shorthand inside a class: PCRE2's own (differs only on U+0085 and on
                    // characters assigned after Unicode 14).
                    out.append(p.substr(i, consumed + 1));
                } else {
                    fail("tokenizer regex: \\{} inside a character class is not supported: {}", e, p);
                }
                i += consumed;
                continue;
            }
            out += c;
            out += e;
            ++i;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            out += c;
            if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
            if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
            continue;
        }
        if (in_class && c == '[') {
            if (i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:name:]
                size_t end = p.find(":]", i + 2);
                PEREGRINE_CHECK(end != std::string_view::npos, "tokenizer regex: bad POSIX class in {}", p);
                out.append(p.substr(i, end + 2 - i));
                i = end + 1;
                continue;
            }
            fail("tokenizer regex: nested character classes are not supported: {}", p);
        }
        if (in_class && c == '&' && i + 1 < p.size() && p[i + 1] == '&')
            fail("tokenizer regex: class intersection (&&) is not supported: {}", p);
        if (in_class && c == ']') in_class = false;
        out += c;
    }
    return out;
}

std::string Regex::escape_literal(std::string_view text) {
    std::string out;
    for (char c : text) {
        auto u = static_cast<unsigned char>(c);
        bool alnum = (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z');
        if (u > 0x20 && u < 0x7F && !alnum) out += '\\';
        out += c;
    }
    return out;
}

struct Regex::Impl {
    pcre2_code* code = nullptr;
    bool jit = false;
    ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(std::string_view pattern) : impl_(std::make_unique<Impl>()), source_(pattern) {
    std::string pcre = translate(pattern);
    int err = 0;
    PCRE2_SIZE erroff = 0;
    // Ruby syntax: ^ and $ always match at line boundaries.
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
    impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre.data()), pcre.size(), opts, &err, &erroff, nullptr);
    if (!impl_->code) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(err, buf, sizeof(buf));
        fail("tokenizer regex does not compile ({} at offset {}): {}", reinterpret_cast<char*>(buf), erroff,
             std::string(pattern));
    }
    impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

void Regex::find_all(std::string_view subject, std::vector<Span>& out) const {
    out.clear();
    JitStack& js = thread_jit();
    auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
    size_t pos = 0;
    size_t last_end = SIZE_MAX;
    while (pos <= subject.size()) {
        // The subject was validated once by the caller: no per-call UTF check (it would be O(n^2)).
        int rc = impl_->jit ? pcre2_jit_match(impl_->code, s, subject.size(), pos, PCRE2_NO_UTF_CHECK, js.md, js.ctx)
                            : pcre2_match(impl_->code, s, subject.size(), pos, PCRE2_NO_UTF_CHECK, js.md, js.ctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR buf[256];
            pcre2_get_error_message(rc, buf, sizeof(buf));
            fail("tokenizer regex match failed ({}): {}", reinterpret_cast<char*>(buf), source_);
        }
        PCRE2_SIZE* ov = pcre2_get_ovector_pointer(js.md);
        size_t b = ov[0], e = ov[1];
        if (b == e && e == last_end) {
            // Empty match adjacent to the previous one: step one character and search again.
            if (pos >= subject.size()) break;
            unsigned char c = static_cast<unsigned char>(subject[pos]);
            pos += c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            continue;
        }
        out.push_back({b, e});
        last_end = e;
        if (b == e) {
            if (e >= subject.size()) break;
            // Next search starts at e; the adjacent-empty rule above moves past it.
        }
        pos = e;
    }
}

}  // namespace peregrine
