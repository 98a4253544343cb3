// Engram hash rows against the official reference's (fixture prefill.engram_hashes.i64).
#include "model/engram_hash.h"
#include "model/fixture.h"
#include "model/variant.h"

#include <gtest/gtest.h>

using namespace peregrine;
using namespace peregrine::test;

TEST(EngramHash, MatchesOfficialRows) {
    const std::string dir = fixture_dir("dsv41-tiny-a");
    ModelConfig cfg = load_model_config(dir);
    EngramTables t = load_engram_tables(cfg, dir);
    auto ids = read_ids(dir + "/cases/prefill.ids");
    auto golden = read_raw<int64_t>(dir + "/cases/prefill.engram_hashes.i64");
    const size_t L = cfg.engram_layer_ids.size(), nc = static_cast<size_t>(t.n_cols());
    ASSERT_EQ(golden.size(), ids.size() * L * nc);
    std::vector<int64_t> row(nc);
    for (size_t p = 0; p < ids.size(); ++p)
        for (size_t l = 0; l < L; ++l) {
            engram_rows(t, static_cast<int>(l), ids, static_cast<int64_t>(p), row.data());
            for (size_t c = 0; c < nc; ++c)
                ASSERT_EQ(row[c], golden[(p * L + l) * nc + c]) << "pos " << p << " layer " << l;
        }
}

TEST(EngramHash, PrimesMatchTheReleasedTableSizes) {
    // DeepSeek-V4.1-Flash: 8 heads x 3 n-gram sizes per layer, primes from 16,000,000 up, unique.
    ModelConfig cfg;
    cfg.engram_layer_ids = {1, 14};
    cfg.engram_max_ngram_size = 4;
    cfg.engram_n_heads = 8;
    cfg.engram_vocab_size = 16000000;
    auto primes = engram_primes(cfg);
    ASSERT_EQ(primes.size(), 2u);
    int64_t rows[2] = {0, 0};
    for (int l = 0; l < 2; ++l)
        for (int64_t p : primes[static_cast<size_t>(l)]) rows[l] += p;
    EXPECT_EQ(rows[0], 384006168);
    EXPECT_EQ(rows[1], 384016682);
}

TEST(EngramHash, MultipliersFollowNumpysStream) {
    // DeepSeek-V4.1-Flash: layers 1 and 14, compressed vocab 99,092 (values from numpy.random.default_rng).
    EXPECT_EQ(engram_multipliers(1, 4, 99092),
              (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
    EXPECT_EQ(engram_multipliers(14, 4, 99092),
              (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
}
