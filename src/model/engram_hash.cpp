#include "model/engram_hash.h"
#include "ops/engram_hash_math.h"
#include "util/error.h"
#include "tokenizer/engram_token_map.h"
#include "util/file.h"
#include "util/numpy_random.h"

#include <nlohmann/json.hpp>
#include <algorithm>
#include <charconv>
#include <climits>
#include <set>

namespace peregrine {

namespace {

uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m) { return static_cast<uint64_t>((__uint128_t)a * b % m); }

uint64_t powmod(uint64_t a, uint64_t e, uint64_t m) {
    uint64_t r = 1;
    a %= m;
    while (e) {
        if (e & 1) r = mulmod(r, a, m);
        a = mulmod(a, a, m);
        e >>= 1;
    }
    return r;
}

// Deterministic Miller-Rabin for 64-bit integers.
bool is_prime(uint64_t n) {
    if (n < 2) return false;
    for (uint64_t p : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37})
        if (n % p == 0) return n == p;
    uint64_t d = n - 1;
    int s = 0;
    while ((d & 1) == 0) {
        d >>= 1;
        ++s;
    }
    for (uint64_t a : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}) {
        uint64_t x = powmod(a, d, n);
        if (x == 1 || x == n - 1) continue;
        bool composite = true;
        for (int i = 1; i < s && composite; ++i) {
            x = mulmod(x, x, n);
            if (x == n - 1) composite = false;
        }
        if (composite) return false;
    }
    return true;
}

}  // namespace

std::vector<int64_t> engram_multipliers(int layer_id, int max_ngram, int64_t compressed_vocab) {
    const int64_t bound = std::max<int64_t>(1, (INT64_MAX / compressed_vocab) / 2);
    NumpyPcg64 rng(static_cast<uint64_t>(10007) * static_cast<uint64_t>(layer_id));
    std::vector<int64_t> m = rng.integers(0, bound, max_ngram);
    for (auto& v : m) v = v * 2 + 1;
    return m;
}

std::vector<std::vector<int64_t>> engram_primes(const ModelConfig& cfg) {
    std::set<int64_t> seen;
    std::vector<std::vector<int64_t>> primes;
    for (size_t l = 0; l < cfg.engram_layer_ids.size(); ++l) {
        std::vector<int64_t> layer;
        for (int n = 0; n < cfg.engram_max_ngram_size - 1; ++n) {
            int64_t current = cfg.engram_vocab_size - 1;
            for (int h = 0; h < cfg.engram_n_heads; ++h) {
                int64_t c = current + 1;
                while (!is_prime(static_cast<uint64_t>(c)) || seen.count(c)) ++c;
                seen.insert(c);
                layer.push_back(c);
                current = c;
            }
        }
        primes.push_back(layer);
    }
    return primes;
}

namespace {

// Primes, offsets and multipliers, all derived from the config.
EngramTables derived_tables(const ModelConfig& cfg) {
    EngramTables t;
    t.max_ngram = cfg.engram_max_ngram_size;
    t.n_heads = cfg.engram_n_heads;
    t.primes = engram_primes(cfg);
    for (size_t l = 0; l < t.primes.size(); ++l) {
        std::vector<int64_t> off;
        int64_t sum = 0;
        for (int64_t p : t.primes[l]) {
            off.push_back(sum);
            sum += p;
        }
        if (sum != cfg.engram_num_embeddings.at(l))
            fail("engram layer {}: the primes sum to {} rows but engram_num_embeddings says {}",
                 cfg.engram_layer_ids[l], sum, cfg.engram_num_embeddings[l]);
        t.offsets.push_back(off);
    }
    for (int layer : cfg.engram_layer_ids)
        t.multipliers.push_back(engram_multipliers(layer, t.max_ngram, cfg.engram_compressed_vocab_size));
    return t;
}

}  // namespace

EngramTables synthetic_engram_tables(const ModelConfig& cfg) {
    EngramTables t = derived_tables(cfg);
    t.token_map.resize(static_cast<size_t>(cfg.vocab_size));
    for (size_t i = 0; i < t.token_map.size(); ++i)
        t.token_map[i] = static_cast<int32_t>(i % static_cast<size_t>(cfg.engram_compressed_vocab_size));
    t.pad = t.token_map.at(static_cast<size_t>(cfg.engram_pad_id));
    return t;
}

namespace {
// An integer of engram_tables.json: a JSON integer or a decimal string (the multipliers pass 2^53); a fraction, a
// float beyond the range or anything else names the file (the JSON library would convert a float with undefined
// behaviour).
int64_t table_integer(const nlohmann::json& v, const std::string& path, const char* what) {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_string()) {
        const std::string& s = v.get_ref<const std::string&>();
        int64_t x = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
        if (ec == std::errc() && end == s.data() + s.size() && !s.empty()) return x;
    }
    fail("'{}': {} must be integers, not {}", path, what, v.dump());
}
}  // namespace

EngramTables load_engram_tables(const ModelConfig& cfg, const std::string& model_dir) {
    EngramTables t = derived_tables(cfg);
    const std::string path = model_dir + "/engram_tables.json";
    if (file_exists(path)) {
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(read_file(path));
            const auto& jm = j.at("multipliers");
            for (size_t l = 0; l < jm.size(); ++l)
                for (size_t k = 0; k < jm[l].size(); ++k) {
                    const int64_t m = table_integer(jm[l][k], path, "multipliers");
                    if (l >= t.multipliers.size() || k >= t.multipliers[l].size() || m != t.multipliers[l][k])
                        fail("'{}': multiplier [{}][{}] = {} differs from the derived one", path, l, k, m);
                }
            t.token_map.clear();
            for (const auto& v : j.at("token_map")) {
                const int64_t c = table_integer(v, path, "token_map entries");
                if (c < 0 || c >= cfg.engram_compressed_vocab_size)
                    fail("'{}': compressed id {} outside 0..{}", path, c, cfg.engram_compressed_vocab_size - 1);
                t.token_map.push_back(static_cast<int32_t>(c));
            }
            if (j.contains("primes")) {
                const auto& jp = j["primes"];
                for (size_t l = 0; l < jp.size() && l < t.primes.size(); ++l) {
                    std::vector<int64_t> flat;
                    for (auto& n : jp[l])
                        for (auto& p : n) flat.push_back(table_integer(p, path, "primes"));
                    if (flat != t.primes[l])
                        fail("'{}': primes of engram layer {} differ from the derived ones", path, l);
                }
            }
        } catch (const nlohmann::json::exception& e) {
            fail("'{}' is malformed: {}", path, e.what());
        }
    } else if (file_exists(model_dir + "/tokenizer.json")) {
        EngramTokenMap map = build_engram_token_map(Tokenizer::from_model_dir(model_dir));
        if (map.num_classes != cfg.engram_compressed_vocab_size)
            fail("the tokenizer of '{}' yields {} compressed engram classes, the config expects {}", model_dir,
                 map.num_classes, cfg.engram_compressed_vocab_size);
        t.token_map = map.id_to_class;
    } else {
        fail(
            "model '{}' has engram layers but neither tokenizer.json nor engram_tables.json (the compressed token map)",
            model_dir);
    }
    if (t.multipliers.size() != cfg.engram_layer_ids.size())
        fail("'{}': one multiplier row per engram layer expected", path);
    if (static_cast<int>(t.token_map.size()) < cfg.vocab_size)
        fail("'{}': token_map needs {} entries", path, cfg.vocab_size);
    for (int32_t c : t.token_map)
        if (c < 0 || c >= cfg.engram_compressed_vocab_size)
            fail("'{}': compressed id {} outside 0..{}", path, c, cfg.engram_compressed_vocab_size - 1);
    t.pad = t.token_map.at(static_cast<size_t>(cfg.engram_pad_id));
    return t;
}

void engram_rows(const EngramTables& t, int li, const std::vector<int32_t>& tokens, int64_t pos, int64_t* out) {
    std::vector<int64_t> comp(static_cast<size_t>(t.max_ngram));
    for (int k = 0; k < t.max_ngram; ++k)
        comp[static_cast<size_t>(k)] =
            pos - k < 0 ? t.pad : t.token_map.at(static_cast<size_t>(tokens.at(static_cast<size_t>(pos - k))));
    const size_t l = static_cast<size_t>(li);
    engram_hash_window(comp.data(), t.max_ngram, t.n_heads, t.multipliers[l].data(), t.primes[l].data(),
                       t.offsets[l].data(), out);
}

EngramHash engram_hash(const EngramTables& t, int li) {
    const size_t l = static_cast<size_t>(li);
    EngramHash h;
    h.max_ngram = t.max_ngram;
    h.n_heads = t.n_heads;
    h.primes = t.primes[l].data();
    h.offsets = t.offsets[l].data();
    h.multipliers = t.multipliers[l].data();
    h.token_map = &t.token_map;
    h.pad = t.pad;
    return h;
}

}  // namespace peregrine
