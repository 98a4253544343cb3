// CUDA graphs (CudaBackend::set_graphs) against eager launches: the same model with graphs off and on runs a
// batch of sequences through prefill and then a dozen decode steps (contexts growing across page boundaries
// and compressor groups), fed the same tokens (greedy on the eager logits); every step's logits must be bit for
// bit the same, and the graphs must actually have been replayed. So must the decode steps' attention with its
// tables worked out on the device (what the graphs capture) and the general path's, for decode steps and for verify
// steps (drafts, cut back after). Also checks that a sequence's
// device-resident carry survives a restore from a page snapshot (same logits as the uninterrupted sequence), with
// graphs on; that graphs are captured again when the GEMV scratch they hold on to moves; and the overlapped
// schedule's deferred ids: decode steps fed the previous step's samples where they are, on the device; and that
// kernels launched to overlap their predecessors (programmatic dependent launch) give the bits of plain launches.
#include "util/switches.h"
#include "cuda_test_util.h"
#include "kv/page_pool.h"
#include "model/fixture.h"
#include "model/model.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/kernels.h"
#include "engine/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <cstring>
#include <functional>
#include <vector>

using namespace peregrine;
using namespace peregrine::test;

namespace {

struct ModelRun {
    std::unique_ptr<Model> m;
    std::unique_ptr<PagePool> pool;
    std::vector<SeqState> seqs;
    cuda::CudaBackend& be() { return dynamic_cast<cuda::CudaBackend&>(m->backend()); }
};

ModelRun open_model(std::unique_ptr<Model> m, bool graphs, int n_seqs, int64_t tokens) {
    ModelRun r;
    r.m = std::move(m);
    r.be().set_graphs(graphs);
    r.pool = std::make_unique<PagePool>(r.m->backend().state_memory(), r.m->layout(), n_seqs * (r.m->layout().pages_for(tokens) + 1));
    r.seqs.resize(static_cast<size_t>(n_seqs));
    for (auto& s : r.seqs) {
        r.pool->init(s);
        EXPECT_TRUE(r.pool->reserve(s, tokens));
    }
    return r;
}

ModelRun open(const std::string& fx, bool graphs, int n_seqs, int64_t tokens) {
    ModelOptions o;
    o.device = "cuda";
    return open_model(Model::load(fixture_dir(fx), o), graphs, n_seqs, tokens);
}

// One step: sequence i feeds feeds[i] (empty: not in the batch); logits of every sequence's last row (in host
// memory, or left on the device).
Tensor step(ModelRun& r, const std::vector<std::vector<int32_t>>& feeds, bool logits_to_host = true) {
    ForwardBatch b;
    std::vector<int> rows;
    for (size_t i = 0; i < feeds.size(); ++i) {
        if (feeds[i].empty()) continue;
        SeqState& s = r.seqs[i];
        b.seqs.push_back({&s, s.n_cached, static_cast<int>(feeds[i].size()), b.rows()});
        b.token_ids.insert(b.token_ids.end(), feeds[i].begin(), feeds[i].end());
        rows.push_back(b.rows() - 1);
    }
    b.mode = batch_mode_of(b);
    return r.m->forward(b, rows, logits_to_host);
}

int32_t argmax(const float* row, int n) {
    int32_t best = 0;
    for (int v = 1; v < n; ++v)
        if (row[v] > row[best]) best = v;
    return best;
}

// Prompts of `n` sequences from a fixture's ids, of different lengths (rows at different positions): sequence i
// starts at id i and ends at id 5 + 6i (or the last).
std::vector<std::vector<int32_t>> prompts_of(const std::vector<int32_t>& ids, int n) {
    std::vector<std::vector<int32_t>> p(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i)
        p[static_cast<size_t>(i)].assign(ids.begin() + i,
                                         ids.begin() + std::min(ids.size(), static_cast<size_t>(5 + 6 * i)));
    return p;
}

}  // namespace
namespace peregrine::cuda {
void* gemv_scratch(int which, size_t bytes, bool zero, int set);  // linear_gemv.cu
}
namespace {

// Three runs of the same steps: the general attention path (the host lists its tables), the decode form (tables
// worked out on the device, attention_decode.cpp) eagerly, and the decode form with graphs, whose cap of 8 tokens
// moves every 8 positions (new graphs each time). grow_scratch: halfway through the decode steps, grow the side
// stream's GEMV staged-activation scratch (as a larger call there would): the graphs captured with the old buffer
// must be dropped and captured again.
void compare_decode(const char* fx, int n_seqs, bool grow_scratch = false) {
    auto ids = read_ids(fixture_dir(fx) + "/cases/prefill.ids");
    const int decode_steps = 12;
    const int64_t cap = static_cast<int64_t>(ids.size()) + decode_steps + 1;
    ModelRun general = open(fx, false, n_seqs, cap), eager = open(fx, false, n_seqs, cap),
             graph = open(fx, true, n_seqs, cap);
    general.be().set_decode_tables(false);
    graph.be().set_graph_cap_tokens(8);
    const int vocab = eager.m->config().vocab_size;
    std::vector<std::vector<int32_t>> feeds = prompts_of(ids, n_seqs);
    int64_t differing = 0, form_differing = 0, captures_before_growth = -1;
    for (int st = 0; st <= decode_steps; ++st) {
        if (grow_scratch && st == decode_steps / 2) {
            captures_before_growth = graph.be().graph_captures();
            ASSERT_GT(captures_before_growth, 0) << "no graph captured before the growth";
            cuda::gemv_scratch(2, size_t(64) << 20, false, 1);  // the side stream's set
        }
        Tensor g = step(general, feeds), a = step(eager, feeds), b = step(graph, feeds);
        ASSERT_EQ(a.numel(), b.numel());
        ASSERT_EQ(a.numel(), g.numel());
        const size_t bytes = sizeof(float) * static_cast<size_t>(a.numel());
        const bool same = std::memcmp(a.f32(), b.f32(), bytes) == 0;
        const bool same_form = std::memcmp(g.f32(), a.f32(), bytes) == 0;
        differing += !same;
        form_differing += !same_form;
        EXPECT_TRUE(same) << fx << " step " << st << " (" << n_seqs << " sequences): graph logits differ from eager";
        EXPECT_TRUE(same_form) << fx << " step " << st << " (" << n_seqs
                               << " sequences): decode-form logits differ from the general path's";
        for (int i = 0; i < n_seqs; ++i)
            feeds[static_cast<size_t>(i)] = {argmax(a.f32() + static_cast<int64_t>(i) * vocab, vocab)};
    }
    const int64_t replays = graph.be().graph_replays(), captures = graph.be().graph_captures();
    EXPECT_GT(replays, 0) << "no graph was replayed";
    EXPECT_EQ(eager.be().graph_replays(), 0);
    if (grow_scratch) {
        EXPECT_GT(captures, captures_before_growth) << fx << ": graphs kept after their scratch moved";
    }
    std::printf("PARITY graphs %-14s %d seqs: prefill + %d decode steps, graph vs eager logits bit-identical in %d of "
                "%d steps, decode form vs general path in %d (%lld graph replays, %lld captures)\n",
                fx, n_seqs, decode_steps, decode_steps + 1 - static_cast<int>(differing), decode_steps + 1,
                decode_steps + 1 - static_cast<int>(form_differing), static_cast<long long>(replays),
                static_cast<long long>(captures));
}

TEST(CudaGraphs, DecodeMatchesEagerBitForBit) {
    REQUIRE_GPU();
    for (const char* fx : {"dsv41-tiny-a", "dsv4-tiny-a"})
        for (int n : {1, 3, 24}) compare_decode(fx, n);  // 24 rows: the FP8 linears on linear_wgmma, not the GEMV
}

// Three sequences: the shared expert's GEMVs stage their activations in the scratch the graphs hold on to.
TEST(CudaGraphs, RecapturedWhenScratchGrows) {
    REQUIRE_GPU();
    compare_decode("dsv41-tiny-a", 3, /*grow_scratch=*/true);
}

// A sequence restored from its page snapshot (device carry copied from the page) continues exactly as the
// sequence that was never interrupted.
TEST(CudaGraphs, RestoredCarryContinuesExactly) {
    REQUIRE_GPU();
    for (const char* fx : {"dsv41-tiny-a", "dsv4-tiny-a"}) {
        auto ids = read_ids(fixture_dir(fx) + "/cases/prefill.ids");
        ModelRun r = open(fx, true, 2, static_cast<int64_t>(ids.size()) + 8);
        const int P = r.m->layout().page_tokens;
        const int n = std::min<int>(static_cast<int>(ids.size()), 2 * P + 7);
        ASSERT_GT(n, P);
        std::vector<int32_t> prompt(ids.begin(), ids.begin() + n);
        step(r, {prompt, {}});
        // Sequence 1 shares sequence 0's first page and resumes after it.
        SeqState& c = r.seqs[1];
        r.pool->release(c);
        c = SeqState();
        c.pages.assign(r.seqs[0].pages.begin(), r.seqs[0].pages.begin() + 1);
        c.tokens = r.seqs[0].tokens;
        r.pool->restore(c, P);
        for (int64_t p = 1; p < r.m->layout().pages_for(n + 8); ++p) c.pages.push_back(r.pool->alloc());
        Tensor a = step(r, {{}, std::vector<int32_t>(prompt.begin() + P, prompt.end())});
        // The uninterrupted sequence's logits at its last prompt row come from a fresh run of the whole prompt.
        ModelRun ref = open(fx, false, 1, static_cast<int64_t>(ids.size()) + 8);
        Tensor b = step(ref, {prompt});
        const int vocab = r.m->config().vocab_size;
        float worst = 0.0f;
        for (int v = 0; v < vocab; ++v) worst = std::max(worst, std::fabs(a.f32()[v] - b.f32()[v]));
        // The resumed step runs the rows after the page as their own batch (a different GEMM shape than the
        // one-shot prefill): Fast numerics may differ by rounding noise (the bound test_cuda_backend allows
        // between batch shapes); a stale or wrong carry moves logits by far more.
        const float bound = switch_is("PEREGRINE_CUDA_NUMERICS", "fast") ? 1e-3f : 1e-5f;
        EXPECT_LE(worst, bound) << fx << ": resumed sequence differs from the uninterrupted one";
        std::printf("PARITY graphs %-14s resume after page %d (device carry from the snapshot) max|d| %.3g\n", fx, P,
                    worst);
        // The shared page is sequence 0's: give it back only once.
        c.pages.erase(c.pages.begin());
    }
}

// Each decode step fed the previous step's samples as deferred ids (read on the device by the embedding, the hash
// routing and the engram hashing of V4.1) gives bit for bit the logits, and so the tokens, of the same steps fed the
// ids from the host. Sequence i samples greedily (even i) or seeded (odd i); the token histories are patched once
// the ids arrive, as the engine does.
void compare_deferred(const char* fx, int n_seqs) {
    auto ids = read_ids(fixture_dir(fx) + "/cases/prefill.ids");
    const int decode_steps = 12;
    const int64_t cap = static_cast<int64_t>(ids.size()) + decode_steps + 1;
    ModelRun host = open(fx, true, n_seqs, cap), dev = open(fx, true, n_seqs, cap);
    std::vector<Sampler> sh, sd;
    for (int i = 0; i < n_seqs; ++i) {
        SamplingParams p;
        p.temperature = i % 2 ? 0.9f : 0.0f;
        p.seed = 11 + i;
        sh.emplace_back(p);
        sd.emplace_back(p);
    }
    auto rows_of = [&](std::vector<Sampler>& s) {
        std::vector<SampleRow> rows(static_cast<size_t>(n_seqs));
        for (int i = 0; i < n_seqs; ++i) {
            SampleRow& r = rows[static_cast<size_t>(i)];
            r.row = i;
            r.config = s[static_cast<size_t>(i)].config();
            r.seed = s[static_cast<size_t>(i)].seed();
            r.index = s[static_cast<size_t>(i)].take_index();
        }
        return rows;
    };
    std::vector<std::vector<int32_t>> feeds = prompts_of(ids, n_seqs), dfeeds = feeds;
    int same_steps = 0, deferred_tokens = 0;
    std::vector<int64_t> fed_pos(static_cast<size_t>(n_seqs), -1);
    for (int st = 0; st <= decode_steps; ++st) {
        Tensor a = step(host, feeds, false);  // logits stay on the device
        std::vector<SampleResult> ha = host.be().sampler().sample(a, rows_of(sh));
        Tensor b = step(dev, dfeeds, false);
        dev.be().sampler().start(b, rows_of(sd));
        if (st > 0) {  // the previous step's samples arrive: patch the histories that hold them as deferred ids
            std::vector<SampleResult> prev = dev.be().sampler().finish();
            for (int i = 0; i < n_seqs; ++i) {
                EXPECT_EQ(prev[static_cast<size_t>(i)].id, feeds[static_cast<size_t>(i)][0]) << fx << " step " << st;
                dev.seqs[static_cast<size_t>(i)].tokens.at(static_cast<size_t>(fed_pos[static_cast<size_t>(i)])) =
                    prev[static_cast<size_t>(i)].id;
                ++deferred_tokens;
            }
        }
        Tensor ah = cuda::to_host(a), bh = cuda::to_host(b);
        const bool same = ah.numel() == bh.numel() &&
                          std::memcmp(ah.f32(), bh.f32(), sizeof(float) * static_cast<size_t>(ah.numel())) == 0;
        same_steps += same;
        EXPECT_TRUE(same) << fx << " step " << st << ": logits of deferred ids differ from host ids";
        for (int i = 0; i < n_seqs; ++i) {
            feeds[static_cast<size_t>(i)] = {ha[static_cast<size_t>(i)].id};
            dfeeds[static_cast<size_t>(i)] = {DeviceSampler::deferred_id(i)};
            fed_pos[static_cast<size_t>(i)] = dev.seqs[static_cast<size_t>(i)].n_cached;
        }
    }
    std::vector<SampleResult> last = dev.be().sampler().finish();
    for (int i = 0; i < n_seqs; ++i) EXPECT_EQ(last[static_cast<size_t>(i)].id, feeds[static_cast<size_t>(i)][0]);
    std::printf(
        "PARITY deferred ids %-14s %d seqs: %d decode steps fed on the device (%d tokens), logits bit-identical "
        "to host-fed ids in %d of %d steps\n",
        fx, n_seqs, decode_steps, deferred_tokens, same_steps, decode_steps + 1);
}

}  // namespace

TEST(CudaGraphs, DeferredIdsMatchHostIds) {
    REQUIRE_GPU();
    for (const char* fx : {"dsv41-tiny-a", "dsv4-tiny-a"})
        for (int n : {1, 3}) compare_deferred(fx, n);
}

namespace {

// Runs the same steps on `a` and `b` (greedy on a's logits; before(true) ahead of a's step, before(false) ahead of
// b's) and expects the logits bit for bit the same; prints how many steps were.
void compare_runs(ModelRun& a, ModelRun& b, std::vector<std::vector<int32_t>> feeds, int decode_steps,
                  const std::function<void(bool)>& before, const std::string& what, const std::string& label) {
    const int vocab = a.m->config().vocab_size, n = static_cast<int>(feeds.size());
    int same_steps = 0;
    for (int st = 0; st <= decode_steps; ++st) {
        before(true);
        Tensor x = step(a, feeds);
        before(false);
        Tensor y = step(b, feeds);
        ASSERT_EQ(x.numel(), y.numel());
        const bool same = std::memcmp(x.f32(), y.f32(), sizeof(float) * static_cast<size_t>(x.numel())) == 0;
        same_steps += same;
        EXPECT_TRUE(same) << what << " step " << st << ": logits differ (" << label << ")";
        for (int i = 0; i < n; ++i)
            feeds[static_cast<size_t>(i)] = {argmax(x.f32() + static_cast<int64_t>(i) * vocab, vocab)};
    }
    EXPECT_EQ(a.be().graph_failed_captures(), 0) << what << ": a graph capture failed (stderr says why)";
    EXPECT_EQ(b.be().graph_failed_captures(), 0) << what << ": a graph capture failed (stderr says why)";
    std::printf("PARITY %-36s %d seqs: prefill + %d decode steps, %s bit-identical in %d of %d steps (graph "
                "replays %lld / %lld)\n",
                what.c_str(), n, decode_steps, label.c_str(), same_steps, decode_steps + 1,
                static_cast<long long>(a.be().graph_replays()), static_cast<long long>(b.be().graph_replays()));
}

// Both fixtures (3 sequences, 12 steps) and V4.1-Flash's dimensions (4 layers, 8 experts, 8 sequences: split-K
// tickets, staged activations, routed tiles), each as two runs with graphs, setup(run, true) for the first.
void compare_models(const std::function<void(bool)>& before, const std::function<void(ModelRun&, bool)>& setup,
                    const std::string& what, const std::string& label) {
    for (const char* fx : {"dsv41-tiny-a", "dsv4-tiny-a"}) {
        auto ids = read_ids(fixture_dir(fx) + "/cases/prefill.ids");
        const int n = 3, steps = 12;
        const int64_t cap = static_cast<int64_t>(ids.size()) + steps + 1;
        ModelRun a = open(fx, true, n, cap), b = open(fx, true, n, cap);
        setup(a, true);
        setup(b, false);
        compare_runs(a, b, prompts_of(ids, n), steps, before, what + " " + fx, label);
    }
    ModelConfig cfg = synthetic_v41_flash_config(4, 8);
    ModelOptions o;
    o.device = "cuda";
    const int n = 8, steps = 6;
    ModelRun a = open_model(Model::synthetic(cfg, o, 3), true, n, 64),
             b = open_model(Model::synthetic(cfg, o, 3), true, n, 64);
    setup(a, true);
    setup(b, false);
    std::vector<std::vector<int32_t>> feeds(n);
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < 17 + 3 * i; ++j)
            feeds[static_cast<size_t>(i)].push_back((j * 7919 + 131 * i + 5) % cfg.vocab_size);
    compare_runs(a, b, feeds, steps, before, what + " synthetic v41-flash dims", label);
}

}  // namespace

// Decode steps' attention with its tables worked out on the device, in layer graphs whose cap moves every 8 tokens,
// against the general path (the host lists the tables; MoE graphs only), also at V4.1-Flash's dimensions (its
// ratio-1 layer and candidate blocks, 8 sequences).
TEST(CudaGraphs, DecodeLayerGraphsMatchGeneralPath) {
    REQUIRE_GPU();
    compare_models([](bool) {},
                   [](ModelRun& r, bool general) {
                       if (general) r.be().set_decode_tables(false);
                       else r.be().set_graph_cap_tokens(8);
                   },
                   "decode form", "layer graphs vs the general path");
}

// Verify steps (each sequence its token and 0-3 drafts, speculative, cut back to an accepted prefix after) with their
// attention in the decode form, eagerly and in layer graphs whose cap moves every 16 tokens, against the general path
// (the host lists the tables, the compressor keeps its carry slots from the host's list): every row's logits bit for
// bit, step after step, so the carries each cut leaves are the same too.
void compare_verify(const char* fx) {
    auto ids = read_ids(fixture_dir(fx) + "/cases/prefill.ids");
    const int n = 3, steps = 14, most_drafts = 3;
    const int64_t cap = static_cast<int64_t>(ids.size()) + steps * (most_drafts + 1) + 1;
    ModelRun general = open(fx, false, n, cap), eager = open(fx, false, n, cap), graph = open(fx, true, n, cap);
    general.be().set_decode_tables(false);
    graph.be().set_graph_cap_tokens(16);
    const int vocab = general.m->config().vocab_size;
    const std::vector<std::vector<int32_t>> prompts = prompts_of(ids, n);
    std::vector<int32_t> next(n);
    for (ModelRun* r : {&general, &eager, &graph}) {
        Tensor x = step(*r, prompts);
        for (int i = 0; i < n; ++i)
            next[static_cast<size_t>(i)] = peregrine::argmax(x.f32() + int64_t{i} * vocab, vocab);
    }
    int same_steps = 0;
    for (int st = 0; st < steps; ++st) {
        // The first half: three drafts each (12 rows, graphs replayed); then 0-3 drafts by sequence.
        ForwardBatch b;
        std::vector<int> drafts(n), rows;
        for (int i = 0; i < n; ++i) {
            const int k = st < steps / 2 ? most_drafts : (st + 2 * i) % (most_drafts + 1);
            drafts[static_cast<size_t>(i)] = k;
            BatchSeq s{nullptr, general.seqs[static_cast<size_t>(i)].n_cached, 1 + k, b.rows()};
            s.speculative = k > 0;
            b.seqs.push_back(s);
            b.token_ids.push_back(next[static_cast<size_t>(i)]);
            for (int j = 0; j < k; ++j) b.token_ids.push_back((next[static_cast<size_t>(i)] * 31 + 7 * j + st) % vocab);
        }
        for (int t = 0; t < b.rows(); ++t) rows.push_back(t);
        b.mode = batch_mode_of(b);
        std::vector<Tensor> out;
        for (ModelRun* r : {&general, &eager, &graph}) {
            ForwardBatch rb = b;
            for (int i = 0; i < n; ++i) {
                SeqState& s = r->seqs[static_cast<size_t>(i)];
                rb.seqs[static_cast<size_t>(i)].state = &s;
                if (drafts[static_cast<size_t>(i)] > 0) {
                    ASSERT_TRUE(r->pool->keep_step_carries(s, 1 + drafts[static_cast<size_t>(i)]));
                }
            }
            out.push_back(r->m->forward(rb, rows));
        }
        const size_t bytes = sizeof(float) * static_cast<size_t>(out[0].numel());
        const bool same_eager = std::memcmp(out[0].f32(), out[1].f32(), bytes) == 0;
        const bool same_graph = std::memcmp(out[0].f32(), out[2].f32(), bytes) == 0;
        same_steps += same_eager && same_graph;
        EXPECT_TRUE(same_eager) << fx << " verify step " << st << ": decode-form logits differ from the general path's";
        EXPECT_TRUE(same_graph) << fx << " verify step " << st << ": graph logits differ from the general path's";
        // Sequence i keeps its token and `kept` drafts; the next token is the general path's at the last kept row.
        for (int i = 0; i < n; ++i) {
            const BatchSeq& s = b.seqs[static_cast<size_t>(i)];
            const int kept = (st + i) % (drafts[static_cast<size_t>(i)] + 1);
            if (s.speculative)
                for (ModelRun* r : {&general, &eager, &graph})
                    r->pool->cut(r->seqs[static_cast<size_t>(i)], s.start_pos + 1 + kept);
            next[static_cast<size_t>(i)] = peregrine::argmax(out[0].f32() + int64_t{s.row0 + kept} * vocab, vocab);
        }
    }
    EXPECT_GT(graph.be().graph_replays(), 0) << fx << ": no verify step replayed a graph";
    std::printf("PARITY verify steps %-14s %d seqs, %d steps of 0-3 drafts cut back: decode form eager and in graphs "
                "vs the general path bit-identical in %d of %d steps (%lld graph replays, %lld captures)\n",
                fx, n, steps, same_steps, steps, static_cast<long long>(graph.be().graph_replays()),
                static_cast<long long>(graph.be().graph_captures()));
}

TEST(CudaGraphs, VerifyStepsMatchGeneralPath) {
    REQUIRE_GPU();
    for (const char* fx : {"dsv41-tiny-a", "dsv4-tiny-a"}) compare_verify(fx);
}

// Programmatic dependent launch (ops/cuda/pdl.cuh) lets a kernel's blocks start before the previous kernel ends;
// until its pdl_wait a kernel may only read what no kernel of the step writes (the GEMV streams its first weight
// stages there). The same steps with plain and with overlapping launches must give the same logits bit for bit.
TEST(CudaGraphs, OverlappingLaunchesMatchPlain) {
    REQUIRE_GPU();
    const bool was = cuda::set_pdl(true);
    compare_models([](bool plain) { cuda::set_pdl(!plain); }, [](ModelRun&, bool) {}, "pdl",
                   "overlapping vs plain launches");
    cuda::set_pdl(was);
}

// Launches captured into a graph keep their programmatic dependencies (pdl.cuh): with overlapping launches on, the
// captured graphs' kernel-to-kernel edges include programmatic ones; with them off, none is. (A graph whose edges
// are all full would start each kernel of a decode step only after the previous one ended.)
TEST(CudaGraphs, CapturedLaunchesKeepProgrammaticEdges) {
    REQUIRE_GPU();
    const bool was = cuda::set_pdl(true);
    Diagnostics::GraphCensus census[2];
    for (bool pdl : {true, false}) {
        cuda::set_pdl(pdl);
        const char* fx = "dsv41-tiny-a";
        auto ids = read_ids(fixture_dir(fx) + "/cases/prefill.ids");
        const int n = 3, steps = 4;
        ModelRun r = open(fx, true, n, static_cast<int64_t>(ids.size()) + steps + 1);
        const int vocab = r.m->config().vocab_size;
        std::vector<std::vector<int32_t>> feeds = prompts_of(ids, n);
        for (int st = 0; st <= steps; ++st) {
            Tensor x = step(r, feeds);
            for (int i = 0; i < n; ++i)
                feeds[static_cast<size_t>(i)] = {peregrine::argmax(x.f32() + int64_t{i} * vocab, vocab)};
        }
        EXPECT_EQ(r.be().graph_failed_captures(), 0);
        census[pdl ? 0 : 1] = r.be().graph_census();
    }
    cuda::set_pdl(was);
    EXPECT_GT(census[0].kernel_edges, 0) << "no graph with two kernels was captured";
    EXPECT_GT(census[0].programmatic_edges, 0) << "overlapping launches lost their programmatic edges in the graphs";
    EXPECT_EQ(census[1].programmatic_edges, 0) << "plain launches captured with programmatic edges";
    for (int i = 0; i < 2; ++i)
        std::printf("PARITY graph census %-8s %lld kernel nodes, %lld other nodes, %lld of %lld kernel-to-kernel "
                    "edges programmatic\n",
                    i == 0 ? "pdl" : "plain", static_cast<long long>(census[i].kernels),
                    static_cast<long long>(census[i].other_nodes), static_cast<long long>(census[i].programmatic_edges),
                    static_cast<long long>(census[i].kernel_edges));
}

// The hc mixes of decode steps on a side stream, joined where their outputs are first read (cuda_backend.cpp): the
// same kernels on the same inputs, so the same logits bit for bit as on the thread's own stream, through the small-T
// path (3 rows) and the FP64 tensor-core one (8 rows), with the MoE graphs captured and replayed meanwhile.
TEST(CudaGraphs, SideStreamMixesMatchInline) {
    REQUIRE_GPU();
    compare_models([](bool) {}, [](ModelRun& r, bool inline_mixes) { r.be().set_side_mixes(!inline_mixes); }, "hc side",
                   "side-stream vs inline mixes");
}

// The shared expert beside the routed experts on its own stream (and GEMV scratch) against inline, with graphs.
TEST(CudaGraphs, SideStreamSharedExpertMatchesInline) {
    REQUIRE_GPU();
    compare_models([](bool) {}, [](ModelRun& r, bool inline_shared) { r.be().set_side_shared(!inline_shared); },
                   "shared side", "side-stream vs inline shared expert");
}

