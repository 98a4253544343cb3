// Engram hash rows against the official reference's (fixture prefill.engram_hashes.i64).
#include "model/engram_hash.h"
#include "model/fixture.h"
#include "model/variant.h"
#include "util/file.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

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

// A corrupt engram_tables.json names itself: numbers that are not integers (a float beyond int64, which the JSON
// library would convert with undefined behaviour; a fraction; a string that is not a number) and compressed ids out
// of range are refused with the file's path, never converted.
TEST(EngramHash, CorruptTablesNameTheFile) {
    const std::string dir = fixture_dir("dsv41-tiny-a");
    const ModelConfig cfg = load_model_config(dir);
    const nlohmann::json good = nlohmann::json::parse(read_file(dir + "/engram_tables.json"));
    const std::filesystem::path scratch =
        std::filesystem::temp_directory_path() / ("peregrine-engram-" + std::to_string(::getpid()));
    std::filesystem::create_directories(scratch);
    const std::string path = (scratch / "engram_tables.json").string();
    struct Case {
        std::function<void(nlohmann::json&)> edit;
        const char* says;
    };
    const std::vector<Case> cases = {
        {[](nlohmann::json& j) { j["token_map"][3] = 8.3e26; }, "token_map entries must be integers, not 8.3e+26"},
        {[](nlohmann::json& j) { j["token_map"][3] = 2.5; }, "token_map entries must be integers, not 2.5"},
        {[](nlohmann::json& j) { j["token_map"][3] = int64_t{1} << 40; }, "compressed id 1099511627776 outside"},
        {[](nlohmann::json& j) { j["multipliers"][0][0] = "12x"; }, "multipliers must be integers, not \"12x\""},
        {[](nlohmann::json& j) { j["multipliers"][0][0] = 1e300; }, "multipliers must be integers, not 1e+300"},
        {[](nlohmann::json& j) { j["primes"][0][0][0] = -1e40; }, "primes must be integers, not -1e+40"},
    };
    for (const Case& c : cases) {
        nlohmann::json j = good;
        c.edit(j);
        std::ofstream(path) << j.dump();
        std::string msg;
        try {
            load_engram_tables(cfg, scratch.string());
        } catch (const std::exception& e) {
            msg = e.what();
        }
        EXPECT_NE(msg.find(path), std::string::npos) << msg;
        EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
    }
    std::ofstream(path) << good.dump();  // the file as shipped loads
    EXPECT_EQ(load_engram_tables(cfg, scratch.string()).token_map.size(), good["token_map"].size());
    std::filesystem::remove_all(scratch);
}
