// Speculative steps: a sequence fed its next token and drafts, then cut back to the drafts it accepted
// (PagePool::cut), goes on exactly as one fed only those tokens. Rejected drafts leave nothing behind: not in the
// compressors' carry (partial groups, the overlapping window), the compressed entries and indexer keys of groups they
// completed, the window K=V, the token history (engram), the page snapshots. Checked bit for bit on every fixture,
// with cuts inside and across compressor groups and pages.
#include "engine/sequence_runner.h"
#include "model/draft_run.h"
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
    std::vector<float> want;  // logits after position p, p >= n0
    for (int64_t p = n0; p < n; ++p) {
        const std::vector<float> l = ref.feed({ids[static_cast<size_t>(p)]}, 0, true);
        want.insert(want.end(), l.begin(), l.end());
    }
    const std::vector<float> got = test::verify_and_cut(*m, ids, n0, n, false);
    ASSERT_EQ(got.size(), want.size());
    for (int64_t r = 0; r < n - n0; ++r)  // bit for bit
        ASSERT_EQ(std::memcmp(got.data() + r * vocab, want.data() + r * vocab, sizeof(float) * vocab), 0)
            << GetParam() << ": position " << n0 + r;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DraftCut, ::testing::Values("dsv41-tiny-a", "dsv4-tiny-a", "dsv4-tiny-b"),
                         [](const auto& info) { return test::fixture_test_name(info.param); });

}  // namespace
