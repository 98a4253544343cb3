#pragma once
// Helpers shared by the grammar tests: a synthetic vocabulary with the awkward cases (single bytes,
// multi-byte pieces crossing grammar boundaries, partial UTF-8, specials, EOS) and string matching.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/matcher.h"

namespace peregrine::grammar::test {

// Ids 0..255: the single bytes; then structured pieces; then random strings; then 2 specials + EOS.
inline std::shared_ptr<const Vocabulary> synthetic_vocab(int n_random = 1500, uint64_t seed = 7) {
    std::vector<std::string> toks;
    for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, char(b)));
    const char* pieces[] = {"{\"", "\":", "\",", "\"}", "\"]", "},", "}]", "true", "false", "null", " \"", "\n  ",
                            "  ", "    ", "\t", "123", "0.5", "-1", "e+5", "ab", "abc", "\"a\"", "\"name\"", "name",
                            "\": \"", "\", \"", "\\n", "\\u00e9", "\\\"", "é", "\xc3", "\xa9x", "日本", "\xe6\x97",
                            "\xa5\xe6", "::=", "ORD-", "2024-", "-01", "T12:", ":00Z", "@x.com", "[", "]", "[]", "{}",
                            "{\"a\":1}", " {", "}\n", ",\n", ", ", ": ", ":\"", "1,", "2]", "\"]}", "\"}]", "x\"y"};
    for (const char* p : pieces) toks.push_back(p);
    std::mt19937_64 rng(seed);
    const std::string alphabet = "abcxyzAZ019 _-.:,\"{}[]\\\n\t@T+e";
    for (int i = 0; i < n_random; ++i) {
        int len = 2 + static_cast<int>(rng() % 5);
        std::string t;
        for (int k = 0; k < len; ++k) t += alphabet[rng() % alphabet.size()];
        if (rng() % 8 == 0) t += "\xc3\xa9";
        toks.push_back(t);
    }
    int32_t special1 = static_cast<int32_t>(toks.size());
    toks.push_back("<special>");
    toks.push_back("<also special>");
    int32_t eos = static_cast<int32_t>(toks.size());
    toks.push_back("<eos>");
    return std::make_shared<Vocabulary>(std::move(toks), std::vector<int32_t>{special1, special1 + 1},
                                        std::vector<int32_t>{eos});
}

inline std::shared_ptr<const Vocabulary> byte_vocab() {
    static auto v = [] {
        std::vector<std::string> toks;
        for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, char(b)));
        toks.push_back("<eos>");
        return std::make_shared<const Vocabulary>(std::move(toks), std::vector<int32_t>{}, std::vector<int32_t>{256});
    }();
    return v;
}

// Whether the grammar accepts exactly `text`.
inline bool accepts(const std::shared_ptr<const CompiledGrammar>& cg, const std::string& text) {
    GrammarMatcher m(cg);
    return m.accept_bytes(text) && m.can_end();
}

inline std::shared_ptr<const CompiledGrammar> compile_bytes(Grammar g) {
    return std::make_shared<const CompiledGrammar>(std::move(g), byte_vocab());
}

}  // namespace peregrine::grammar::test
