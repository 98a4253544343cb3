// peregrine grammar-sample: drives the grammar matcher with random sampling over noise logits restricted
// by the token mask (the stand-in for a model until the server exists) and prints each output as a JSON
// line, so tests can validate outputs with independent tools (jsonschema, re.fullmatch, xgrammar).
#include "commands.h"
#include "engine/grammar/constraint.h"
#include "engine/grammar/matcher.h"
#include "util/error.h"
#include "util/file.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

namespace peregrine {

using namespace grammar;

static RegisterCommand reg_grammar([](CLI::App& app, int& exit_code) {
    auto* cmd =
        app.add_subcommand("grammar-sample", "Sample constrained outputs with noise logits (grammar engine debug)");
    struct Opts {
        std::string vocab, tokenizer, kind = "json_schema", spec, spec_file, masks_out;
        int n = 10, max_tokens = 400, finish_after = -1;
        uint64_t seed = 1;
        bool compact = false, dump = false, check = false;
        int max_ws = JsonSchemaOptions{}.max_whitespace;
    };
    auto o = std::make_shared<Opts>();
    cmd->add_option("--vocab", o->vocab, "peregrine-vocab file (tools/grammar/make_vocab.py)");
    cmd->add_option("--tokenizer", o->tokenizer, "model/tokenizer directory (tokenizer.json + tokenizer_config.json)");
    cmd->add_option("--kind", o->kind, "json_object | json_schema | regex | ebnf");
    cmd->add_option("--spec", o->spec, "schema / regex / grammar text");
    cmd->add_option("--spec-file", o->spec_file, "read the spec from a file");
    cmd->add_option("-n", o->n, "number of samples");
    cmd->add_option("--seed", o->seed, "random seed");
    cmd->add_option("--max-tokens", o->max_tokens, "token budget per sample");
    cmd->add_option("--finish-after", o->finish_after,
                    "after this many tokens, steer to the nearest valid end (single-byte tokens, then EOS)");
    cmd->add_option("--max-whitespace", o->max_ws, "JSON: whitespace characters allowed per gap");
    cmd->add_flag("--compact", o->compact, "JSON: no free whitespace, separators ', ' and ': '");
    cmd->add_option("--masks-out", o->masks_out, "write the first sample's per-step allowed ids (JSON lines)");
    cmd->add_flag("--check-masks", o->check, "verify every mask against per-token matching (slow)");
    cmd->add_flag("--dump-grammar", o->dump, "print the automaton");
    cmd->callback([o, &exit_code] {
        ConstraintSpec spec{constraint_kind_from_name(o->kind),
                            o->spec_file.empty() ? o->spec : read_file(o->spec_file)};
        JsonSchemaOptions jo;
        jo.any_whitespace = !o->compact;
        jo.max_whitespace = o->max_ws;
        if (o->vocab.empty() == o->tokenizer.empty()) fail("give exactly one of --vocab and --tokenizer");
        auto vocab = o->vocab.empty() ? Vocabulary::from_model_dir(o->tokenizer) : Vocabulary::load(o->vocab);
        auto t0 = std::chrono::steady_clock::now();
        GrammarCompiler compiler(vocab, jo);
        std::shared_ptr<const CompiledGrammar> cg;
        try {
            cg = compiler.compile(spec);
        } catch (const Error& e) {
            std::printf("%s\n", nlohmann::json{{"error", e.what()}}.dump().c_str());
            exit_code = 2;
            return;
        }
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (o->dump) std::fprintf(stderr, "%s", cg->grammar().describe().c_str());
        const CompileStats& st = cg->stats();
        std::fprintf(stderr,
                     "compiled in %.1f ms (mask cache %.1f ms): %d states, %d cached, %lld uncertain, %.1f MiB\n", ms,
                     st.precompute_ms, st.states, st.mask_states, static_cast<long long>(st.uncertain_total),
                     st.cache_bytes / 1048576.0);
        std::mt19937_64 rng(o->seed);
        std::vector<uint32_t> mask(vocab->mask_words());
        std::ofstream masks_out;
        if (!o->masks_out.empty()) masks_out.open(o->masks_out);
        int bad_masks = 0;
        for (int i = 0; i < o->n; ++i) {
            GrammarMatcher m(cg);
            std::vector<int32_t> tokens;
            std::string text;
            bool ended = false;
            while (static_cast<int>(tokens.size()) < o->max_tokens) {
                m.fill_next_token_bitmask(mask.data());
                if (i == 0 && masks_out.is_open()) {
                    std::vector<int32_t> allowed;
                    for (int32_t w = 0; w < vocab->mask_words(); ++w)
                        for (uint32_t x = mask[w]; x; x &= x - 1) allowed.push_back(w * 32 + __builtin_ctz(x));
                    masks_out << nlohmann::json(allowed).dump() << "\n";
                }
                if (o->check) {
                    for (int32_t id = 0; id < vocab->size(); ++id) {
                        bool fast = mask[id >> 5] >> (id & 31) & 1u;
                        bool slow = m.accept_token(id);
                        if (slow) m.rollback(1);
                        if (fast != slow) {
                            if (bad_masks < 10)
                                std::fprintf(stderr, "mask mismatch at step %zu token %d: fast %d slow %d\n",
                                             tokens.size(), id, fast, slow);
                            ++bad_masks;
                        }
                    }
                }
                // Uniform choice among allowed tokens (= argmax of i.i.d. noise logits under the mask).
                int64_t count = 0;
                for (int32_t w = 0; w < vocab->mask_words(); ++w) count += __builtin_popcount(mask[w]);
                if (count == 0) break;
                int64_t r = std::uniform_int_distribution<int64_t>(0, count - 1)(rng);
                int32_t tok = -1;
                if (o->finish_after >= 0 && static_cast<int>(tokens.size()) >= o->finish_after) {
                    // Finishing: EOS if allowed, else the allowed single byte closest to an end.
                    int32_t best = INT32_MAX;
                    for (int32_t id : vocab->stop_ids())
                        if (mask[id >> 5] >> (id & 31) & 1u) tok = id, best = -1;
                    for (int32_t id = 0; id < vocab->size() && best >= 0; ++id) {
                        if (!(mask[id >> 5] >> (id & 31) & 1u) || vocab->token_bytes(id).size() != 1) continue;
                        m.accept_token(id);
                        int32_t d = m.min_bytes_to_end();
                        m.rollback(1);
                        if (d < best) best = d, tok = id;
                    }
                    r = tok >= 0 ? -1 : r;
                }
                for (int32_t w = 0; w < vocab->mask_words() && tok < 0 && r >= 0; ++w) {
                    int c = __builtin_popcount(mask[w]);
                    if (r >= c) {
                        r -= c;
                        continue;
                    }
                    uint32_t x = mask[w];
                    while (r-- > 0) x &= x - 1;
                    tok = w * 32 + __builtin_ctz(x);
                }
                if (!m.accept_token(tok)) {
                    std::fprintf(stderr, "matcher rejected a token its mask allowed (%d)\n", tok);
                    exit_code = 1;
                    return;
                }
                tokens.push_back(tok);
                if (vocab->is_stop(tok)) {
                    ended = true;
                    break;
                }
                text += vocab->token_bytes(tok);
                if (m.is_terminated()) {
                    ended = true;
                    break;
                }
            }
            nlohmann::json line = {{"text", text}, {"tokens", tokens}, {"complete", ended}};
            std::printf("%s\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
        }
        exit_code = bad_masks ? 1 : 0;
        if (bad_masks) std::fprintf(stderr, "%d mask mismatches\n", bad_masks);
    });
});

}  // namespace peregrine
