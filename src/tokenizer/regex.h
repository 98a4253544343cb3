#pragma once
// Regular expressions of tokenizer.json (written for Oniguruma, as HF tokenizers runs them),
// compiled with PCRE2 (UTF + UCP + JIT) after translating the constructs whose meaning differs.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace peregrine {

struct Span {
    size_t begin, end;
};

class Regex {
public:
    // `pattern` is Oniguruma syntax (Ruby flavour). A String pattern is compiled via escape_literal.
    explicit Regex(std::string_view pattern);
    ~Regex();
    Regex(Regex&&) noexcept;
    Regex& operator=(Regex&&) noexcept;

    // All non-overlapping matches in `subject` (valid UTF-8), left to right. An empty match right
    // after the previous match is skipped, as Rust's and the onig crate's find_iter do.
    void find_all(std::string_view subject, std::vector<Span>& out) const;

    const std::string& source() const { return source_; }

    static std::string escape_literal(std::string_view text);
    // The PCRE2 pattern for an Oniguruma pattern (exposed for tests).
    static std::string translate(std::string_view onig_pattern);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::string source_;
};

}  // namespace peregrine
