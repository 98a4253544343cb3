#pragma once
// Engram n-gram hashing (tokenizer-dependent preprocessing of DeepSeek-V4.1): each position maps to one
// table row per (n-gram size, head), from the compressed ids of the tokens ending there.
#include "io/model_config.h"
#include "ops/backend.h"

#include <cstdint>
#include <string>
#include <vector>

namespace peregrine {

struct EngramTables {
    int max_ngram = 0, n_heads = 0;
    std::vector<std::vector<int64_t>> primes;       // [layer][(n-2)*heads + head]
    std::vector<std::vector<int64_t>> offsets;      // same layout, exclusive cumsum
    std::vector<std::vector<int64_t>> multipliers;  // [layer][k], k = 0..max_ngram-1
    std::vector<int32_t> token_map;                 // token id -> compressed id
    int64_t pad = 0;                                // compressed id of engram_pad_id
    int n_cols() const { return (max_ngram - 1) * n_heads; }
};

// Primes, offsets and hash multipliers are derived from the config (the multipliers from NumPy's PCG64
// stream, as the reference draws them); the compressed token map from the model's tokenizer.json. An
// `engram_tables.json` in the model directory may supply the multipliers and token map instead (tiny test
// models have no real tokenizer); derived values are cross-checked against it.
EngramTables load_engram_tables(const ModelConfig& cfg, const std::string& model_dir);

// A synthetic model's hashing: the derived primes and multipliers, token id i in class i mod the compressed vocabulary.
EngramTables synthetic_engram_tables(const ModelConfig& cfg);

// The reference's hash multipliers of one engram layer: odd, bounded so that id * multiplier fits int64.
std::vector<int64_t> engram_multipliers(int layer_id, int max_ngram, int64_t compressed_vocab);

// Row ids [n_cols] for layer `layer_index` (index into engram_layer_ids) at position `pos` of `tokens`.
void engram_rows(const EngramTables& t, int layer_index, const std::vector<int32_t>& tokens, int64_t pos,
                 int64_t* out);

// The hashing of layer `layer_index` for backends that hash themselves (pointers into `t`, which must outlive it).
EngramHash engram_hash(const EngramTables& t, int layer_index);

// The engram primes: per layer, per n-gram size, per head, the next unused prime above the last one,
// restarting from vocab_size - 1 for each n-gram size.
std::vector<std::vector<int64_t>> engram_primes(const ModelConfig& cfg);

}  // namespace peregrine
