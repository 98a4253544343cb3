// Speculative steps: a sequence fed its next token and drafts, then cut back to the drafts it accepted
// (PagePool::cut), goes on exactly as one fed only those tokens. Rejected drafts leave nothing behind: not in the
// compressors' carry (partial groups, the overlapping window), the compressed entries and indexer keys of groups they
// completed, the window K=V, the token history (engram), the page snapshots. Checked bit for bit on every fixture,
// with cuts inside and across compressor groups and pages.
#include "engine/sequence_runner.h"
#include "kv/page_pool.h"
#include "model/fixture.h"
#include "model/model.h"
#include "util/error.h"

#include <gtest/gtest.h>

#include <cstring>

using namespace peregrine;

namespace {

class DraftCut : public ::testing::TestWithParam<const char*> {};

TEST_P(DraftCut, RejectedDraftsLeaveNothingBehind) {
    auto m = Model::load(test::fixture_dir(GetParam()));
    const int vocab = m->config().vocab_size;
    const std::vector<int32_t> ids = test::read_ids(test::fixture_dir(GetParam()) + "/cases/prefill.ids");
    const int64_t n0 = 13, n = std::min<int64_t>(static_cast<int64_t>(ids.size()), 13 + 56);
    ASSERT_GT(n, n0 + 20);

    // Reference: the prompt, then one token at a time.
    SequenceRunner ref(*m, n);
    ref.feed({ids.begin(), ids.begin() + n0});
    std::vector<std::vector<float>> want;  // logits after position p, p >= n0
    for (int64_t p = n0; p < n; ++p) want.push_back(ref.feed({ids[static_cast<size_t>(p)]}, 0, true));

    PagePool pool(m->backend().state_memory(), m->layout(), m->layout().pages_for(n + 8));
    SeqState s;
    pool.init(s);
    ASSERT_TRUE(pool.reserve(s, n0));
    ForwardBatch pre;
    pre.seqs.push_back({&s, 0, static_cast<int>(n0), 0});
    pre.token_ids.assign(ids.begin(), ids.begin() + n0);
    pre.mode = BatchMode::prefill;
    m->forward(pre, {});

    int step = 0, compared = 0;
    for (int64_t p = n0; p < n; ++step) {
        const int k = 1 + step % 5;                                        // drafts this step
        const int j = static_cast<int>(std::min<int64_t>(step % (k + 1), n - p - 1));  // of them right
        std::vector<int32_t> fed{ids[static_cast<size_t>(p)]};
        for (int d = 0; d < k; ++d)
            fed.push_back(d < j ? ids[static_cast<size_t>(p + 1 + d)]
                                : (ids[static_cast<size_t>(std::min<int64_t>(p + 1 + d, n - 1))] + 7 + d) % vocab);
        ASSERT_TRUE(pool.reserve(s, p + 1 + k));
        ASSERT_TRUE(pool.keep_step_carries(s, 1 + k));
        ForwardBatch b;
        b.seqs.push_back({&s, p, 1 + k, 0});
        b.seqs.back().speculative = true;
        b.token_ids = fed;
        b.mode = BatchMode::prefill;
        std::vector<int> rows;
        for (int i = 0; i <= j; ++i) rows.push_back(i);
        Tensor logits = m->forward(b, rows);
        for (int i = 0; i <= j; ++i) {  // the rows of accepted positions: as if fed alone
            const std::vector<float>& w = want[static_cast<size_t>(p - n0 + i)];
            ASSERT_EQ(std::memcmp(logits.f32() + static_cast<int64_t>(i) * vocab, w.data(), sizeof(float) * vocab), 0)
                << GetParam() << ": position " << p + i << " (step " << step << ", " << j << " of " << k
                << " drafts right)";
            ++compared;
        }
        pool.cut(s, p + 1 + j);
        EXPECT_EQ(s.n_cached, p + 1 + j);
        EXPECT_EQ(static_cast<int64_t>(s.tokens.size()), p + 1 + j);
        p += 1 + j;
    }
    EXPECT_EQ(compared, n - n0);
    EXPECT_THROW(pool.cut(s, s.n_cached - 1), Error) << "a cut needs a speculative step just before";
    pool.release(s);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DraftCut, ::testing::Values("dsv41-tiny-a", "dsv4-tiny-a", "dsv4-tiny-b"),
                         [](const auto& info) { return test::fixture_test_name(info.param); });

}  // namespace
