// Feeds a config.json text to the model configuration reader as load_model_config does (the variant picked by
// model_type, its own keys and checks), then derives what a model is set up from: its description, the op format,
// every layer's attention role, the state layout of 16-token pages, the engram primes and hash multipliers.
// Refusals are expected; any other escape, a crash, a hang, or an accepted configuration with an id the runtime
// would index out of range is a finding.
#include "kv/state_layout.h"
#include "model/engram_hash.h"
#include "model/variant.h"
#include "util/error.h"

#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace peregrine;

bool in_range(int64_t v, int64_t lo, int64_t hi) { return v >= lo && v < hi; }

// What the runtime indexes with, for an accepted configuration.
void check_ids(const ModelConfig& c) {
    for (int l : c.kv_source_layers)
        if (!in_range(l, 0, c.n_layers)) std::abort();
    for (int l : c.index_source_layers)
        if (!in_range(l, 0, c.n_layers)) std::abort();
    for (int l : c.engram_layer_ids)
        if (!in_range(l, 0, c.n_layers)) std::abort();
    if (c.engram_layer_ids.size() != c.engram_num_embeddings.size()) std::abort();
    if (!c.engram_layer_ids.empty() &&
        (!in_range(c.engram_pad_id, 0, c.vocab_size) || c.engram_compressed_vocab_size < 1))
        std::abort();
    if (c.candidate_source_layer >= 0 && c.candidate_block_size < 1) std::abort();
    if (c.arch == ModelArch::DeepseekV41 && c.n_mtp_layers > 0 && c.dspark_block_size > 0) {
        if (!in_range(c.dspark_noise_token_id, 0, c.vocab_size)) std::abort();
        for (int l : c.dspark_target_layer_ids)
            if (!in_range(l, 0, c.n_layers)) std::abort();
    }
    if (!in_range(c.bos_token_id, 0, c.vocab_size) || !in_range(c.eos_token_id, 0, c.vocab_size)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    try {
        const ModelConfig c = parse_model_config(text);
        check_ids(c);
        const std::string d = describe_model(c);
        const ModelFormat f = model_format(c);
        const std::vector<AttentionLayerInfo> roles = attention_layer_infos(c);
        if (d.empty() || static_cast<int>(roles.size()) != c.n_layers) std::abort();
        (void)f;
        const StateLayout layout = make_state_layout(c, 16);
        if (layout.layers.size() < roles.size()) std::abort();
        // The primes search walks past every prime earlier layers took, so its cost grows with the square of the
        // table count; real configurations have a few dozen tables.
        const int64_t tables = static_cast<int64_t>(c.engram_layer_ids.size()) * (c.engram_max_ngram_size - 1);
        if (!c.engram_layer_ids.empty() && tables * tables * c.engram_n_heads <= (1 << 16)) {
            const auto primes = engram_primes(c);
            for (int l : c.engram_layer_ids)
                if (engram_multipliers(l, c.engram_max_ngram_size, c.engram_compressed_vocab_size).empty())
                    std::abort();
            if (primes.size() != c.engram_layer_ids.size()) std::abort();
        }
    } catch (const Error&) {
    }
    return 0;
}
