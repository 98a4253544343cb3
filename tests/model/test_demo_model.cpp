// The embedded demo model (models/peregrine-demo-v4) through the normal loader: greedy continuations equal
// the training script's engine-exact torch evaluation, held-out perplexity is the one torch measured, and a
// held-out prefill's logits are DeepSeek's official V4 model.py's (tools/reference/run_official_v4.py).
#include "engine/sequence_runner.h"

#include <cmath>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using namespace peregrine;

namespace {

const std::string kModel = std::string(PEREGRINE_SOURCE_DIR) + "/models/peregrine-demo-v4";
const std::string kRef = std::string(PEREGRINE_TEST_DATA) + "/demo-v4";

std::vector<double> token_nll(const std::vector<float>& logits, const std::vector<int32_t>& ids, int vocab) {
    std::vector<double> nll;
    for (size_t t = 0; t + 1 < ids.size(); ++t) {
        const float* row = logits.data() + t * vocab;
        double mx = row[0], sum = 0.0;
        for (int v = 1; v < vocab; ++v) mx = std::max<double>(mx, row[v]);
        for (int v = 0; v < vocab; ++v) sum += std::exp(row[v] - mx);
        nll.push_back(std::log(sum) + mx - row[ids[t + 1]]);
    }
    return nll;
}

}  // namespace

TEST(DemoModel, LoadsAsAReleasedV4Checkpoint) {
    auto model = Model::load(kModel);
    EXPECT_EQ(model->config().arch, ModelArch::DeepseekV4);
    EXPECT_EQ(model->config().vocab_size, 4096);
    EXPECT_EQ(model->config().n_mtp_layers, 1);
}

TEST(DemoModel, GreedyMatchesTorch) {
    auto model = Model::load(kModel);
    const int vocab = model->config().vocab_size;
    auto ref = nlohmann::json::parse(read_file(kRef + "/demo_greedy.json"));
    for (const auto& c : ref["cases"]) {
        auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
        auto expect = c["greedy_ids"].get<std::vector<int32_t>>();
        SequenceRunner run(*model, static_cast<int64_t>(prompt.size() + expect.size()));
        std::vector<float> logits = run.feed(prompt);
        std::vector<int32_t> got;
        for (size_t i = 0; i < expect.size(); ++i) {
            int32_t next = 0;
            for (int v = 1; v < vocab; ++v)
                if (logits[v] > logits[next]) next = v;
            got.push_back(next);
            logits = run.feed({next});
        }
        EXPECT_EQ(got, expect) << "prompt " << c["prompt"];
    }
}

TEST(DemoModel, HeldOutPerplexityMatchesTorch) {
    auto model = Model::load(kModel);
    const int vocab = model->config().vocab_size;
    auto ref = nlohmann::json::parse(read_file(kRef + "/demo_heldout.json"));
    double ours = 0.0, theirs = 0.0, worst = 0.0;
    size_t n = 0;
    const size_t chunks = 2;  // of 34; the full set is measured in the closing figures
    for (size_t ci = 0; ci < chunks; ++ci) {
        const auto& c = ref["chunks"][ci];
        auto ids = c["ids"].get<std::vector<int32_t>>();
        auto nll_ref = c["nll"].get<std::vector<double>>();
        SequenceRunner run(*model, static_cast<int64_t>(ids.size()));
        auto nll = token_nll(run.feed(ids, 0, true), ids, vocab);
        ASSERT_EQ(nll.size(), nll_ref.size());
        for (size_t i = 0; i < nll.size(); ++i) {
            ours += nll[i];
            theirs += nll_ref[i];
            worst = std::max(worst, std::abs(nll[i] - nll_ref[i]));
        }
        n += nll.size();
    }
    const double ppl = std::exp(ours / n), ppl_ref = std::exp(theirs / n);
    std::printf("held-out perplexity over %zu tokens: peregrine %.3f, torch %.3f (worst token nll diff %.3f)\n", n, ppl,
                ppl_ref, worst);
    EXPECT_NEAR(ppl / ppl_ref, 1.0, 0.01);
}

// official_v4_prefill.json: 160 held-out ids through the official model.py (our kernel port, exact sums, CPU), each
// row's top 8 logits. Measured: rows 0-59 within 2.6e-3 (one row; the rest 3e-6), every row's top-1 the same; an
// fp32 index-order sum of the attention probabilities gave 0.02-0.07 from row 34 on and 98.8% top-1. Later rows
// may depart by up to ~0.1: the CPU torch reference breaks indexer top-k ties the other way (rows 146+).
TEST(DemoModel, PrefillMatchesTheOfficialV4Code) {
    auto model = Model::load(kModel);
    const int vocab = model->config().vocab_size;
    auto ref = nlohmann::json::parse(read_file(kRef + "/official_v4_prefill.json"));
    auto ids = ref["ids"].get<std::vector<int32_t>>();
    auto top_ids = ref["top_ids"].get<std::vector<std::vector<int>>>();
    auto top_logits = ref["top_logits"].get<std::vector<std::vector<float>>>();
    SequenceRunner run(*model, static_cast<int64_t>(ids.size()));
    std::vector<float> logits = run.feed(ids, 0, true);
    ASSERT_EQ(logits.size(), ids.size() * static_cast<size_t>(vocab));
    double early = 0.0;
    size_t same_top1 = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
        const float* row = logits.data() + t * vocab;
        if (t < 60)
            for (size_t k = 0; k < top_ids[t].size(); ++k)
                early = std::max(early, static_cast<double>(std::abs(row[top_ids[t][k]] - top_logits[t][k])));
        same_top1 += std::max_element(row, row + vocab) - row == top_ids[t][0];
    }
    std::printf("official V4 code: rows 0-59 max|d| %.3g over each row's top 8, top-1 %zu of %zu\n", early, same_top1,
                ids.size());
    EXPECT_LE(early, 1e-2);
    EXPECT_GE(same_top1, ids.size() * 99 / 100);
}
