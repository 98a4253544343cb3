#pragma once
// Shared by the fuzz targets: the server's route limits and a small grammar vocabulary. A target accepts the
// errors the product turns into 400s (or refuses a file with); anything else escapes and is a finding.
#include "engine/grammar/budget.h"
#include "engine/grammar/compiled_grammar.h"
#include "engine/grammar/matcher.h"
#include "server/route_requests.h"
#include "server/structured_output.h"

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace peregrine::fuzz {

// What `serve` gives the routes on the demo model's V4 tokenizer vocabulary.
inline const RouteOptions& route_options() {
    static const RouteOptions o = [] {
        RouteOptions r;
        r.served_model_name = "peregrine-demo-v4";
        r.chat_format = ChatFormat::deepseek_v4;
        r.limits.vocab = 129280;
        r.limits.context_length = 65536;
        return r;
    }();
    return o;
}

// Single bytes, a few JSON-ish pieces and EOS: enough for masks to cross grammar boundaries, small enough that
// one compilation stays in milliseconds.
inline std::shared_ptr<const grammar::Vocabulary> small_vocab() {
    static const auto v = [] {
        setenv("PEREGRINE_GRAMMAR_THREADS", "1", 0);  // fuzzing runs one input at a time
        std::vector<std::string> toks;
        for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, static_cast<char>(b)));
        for (const char* p : {"{\"", "\":", "\",", "\"}", "true", "false", "null", "123", "-1", "e+5", "ab", "\\n",
                              "\\u00e9", "é", "日本", "\xe6\x97", "[]", "{}", ", ", ": ", "  ", "\n"})
            toks.push_back(p);
        const auto eos = static_cast<int32_t>(toks.size());
        toks.push_back("<eos>");
        return std::make_shared<const grammar::Vocabulary>(std::move(toks), std::vector<int32_t>{},
                                                           std::vector<int32_t>{eos});
    }();
    return v;
}

// The time serve gives one request's grammar (--grammar-compile-timeout's default): an input that takes longer
// ends as the request's error ("grammar too complex", a 400), as in the product, not as a fuzzer timeout.
struct ServeBudget {
    grammar::CompileBudget budget{GrammarCompileOptions{}.timeout};
    grammar::BudgetScope scope{&budget};
    ServeBudget() { budget.start(); }
};

// Compiles a grammar and walks a few tokens through its matcher, as a request's first steps would.
inline void compile_and_walk(const grammar::Grammar& g, std::string_view steer) {
    grammar::GrammarCompiler compiler(small_vocab());
    grammar::GrammarMatcher m(compiler.compile(g));
    std::vector<uint32_t> mask(static_cast<size_t>(small_vocab()->mask_words()));
    for (size_t i = 0; i < 16 && !m.is_terminated(); ++i) {
        m.fill_next_token_bitmask(mask.data());
        // The input's bytes pick among the allowed tokens, so the walk differs per input.
        const size_t want = i < steer.size() ? static_cast<unsigned char>(steer[i]) : 0;
        int32_t pick = -1, seen = 0;
        for (int32_t id = 0; id < small_vocab()->size(); ++id)
            if (mask[static_cast<size_t>(id) / 32] >> (id % 32) & 1u)
                if (pick < 0 || static_cast<size_t>(seen++) == want) pick = id;
        if (pick < 0 || !m.accept_token(pick)) break;
    }
    m.min_bytes_to_end();
}

}  // namespace peregrine::fuzz
