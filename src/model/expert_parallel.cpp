#include "model/expert_parallel.h"
#include "util/error.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace peregrine {

ExpertPlacement ExpertPlacement::contiguous(int n_experts, int n_ranks) {
    PEREGRINE_CHECK(n_ranks >= 1 && n_experts % n_ranks == 0, "{} experts do not divide over {} ranks", n_experts,
                    n_ranks);
    ExpertPlacement p;
    p.n_experts = n_experts;
    p.n_ranks = n_ranks;
    const int per = n_experts / n_ranks;
    for (int e = 0; e < n_experts; ++e) p.replicas.push_back({e / per});
    return p;
}

ExpertPlacement ExpertPlacement::balanced(const std::vector<double>& load, int n_ranks, int redundant) {
    const int E = static_cast<int>(load.size());
    PEREGRINE_CHECK(n_ranks >= 1 && E % n_ranks == 0, "{} experts do not divide over {} ranks", E, n_ranks);
    PEREGRINE_CHECK(redundant >= 0 && redundant <= E / n_ranks * (n_ranks - 1),
                    "{} redundant experts per rank do not fit", redundant);
    // Copies per expert: each extra copy to the expert with the most load per copy.
    std::vector<int> copies(static_cast<size_t>(E), 1);
    for (int i = 0; i < redundant * n_ranks; ++i) {
        int best = -1;
        for (int e = 0; e < E; ++e) {
            if (copies[static_cast<size_t>(e)] >= n_ranks) continue;
            if (best < 0 || load[static_cast<size_t>(e)] / copies[static_cast<size_t>(e)] >
                                load[static_cast<size_t>(best)] / copies[static_cast<size_t>(best)])
                best = e;
        }
        ++copies[static_cast<size_t>(best)];
    }
    // Copies heaviest first, each to the least loaded rank with a free slot that lacks that expert.
    struct Copy {
        int expert;
        double load;
    };
    std::vector<Copy> all;
    for (int e = 0; e < E; ++e)
        for (int c = 0; c < copies[static_cast<size_t>(e)]; ++c)
            all.push_back({e, load[static_cast<size_t>(e)] / copies[static_cast<size_t>(e)]});
    std::stable_sort(all.begin(), all.end(), [](const Copy& a, const Copy& b) { return a.load > b.load; });
    const int slots = E / n_ranks + redundant;
    std::vector<double> rank_load(static_cast<size_t>(n_ranks), 0.0);
    std::vector<int> used(static_cast<size_t>(n_ranks), 0);
    ExpertPlacement p;
    p.n_experts = E;
    p.n_ranks = n_ranks;
    p.replicas.resize(static_cast<size_t>(E));
    for (const Copy& c : all) {
        auto& reps = p.replicas[static_cast<size_t>(c.expert)];
        int best = -1;
        for (int r = 0; r < n_ranks; ++r) {
            if (used[static_cast<size_t>(r)] >= slots || std::find(reps.begin(), reps.end(), r) != reps.end()) continue;
            if (best < 0 || rank_load[static_cast<size_t>(r)] < rank_load[static_cast<size_t>(best)]) best = r;
        }
        PEREGRINE_CHECK(best >= 0, "no rank has room for a copy of expert {}", c.expert);
        reps.push_back(best);
        ++used[static_cast<size_t>(best)];
        rank_load[static_cast<size_t>(best)] += c.load;
    }
    for (auto& reps : p.replicas) std::sort(reps.begin(), reps.end());
    return p;
}

bool ExpertPlacement::holds(int rank, int expert) const {
    const auto& reps = replicas.at(static_cast<size_t>(expert));
    return std::find(reps.begin(), reps.end(), rank) != reps.end();
}

int ExpertPlacement::serving_rank(int expert, uint64_t key) const {
    const auto& reps = replicas.at(static_cast<size_t>(expert));
    return reps[static_cast<size_t>(key % reps.size())];
}

std::vector<double> ExpertPlacement::rank_loads(const std::vector<double>& load) const {
    std::vector<double> out(static_cast<size_t>(n_ranks), 0.0);
    for (int e = 0; e < n_experts; ++e) {
        const auto& reps = replicas[static_cast<size_t>(e)];
        for (int r : reps)
            out[static_cast<size_t>(r)] += load[static_cast<size_t>(e)] / static_cast<double>(reps.size());
    }
    return out;
}

ExpertParallel::ExpertParallel(Communicator& comm, ExpertPlacement placement)
    : comm_(comm), placement_(std::move(placement)) {
    PEREGRINE_CHECK(placement_.n_ranks == comm_.size(), "placement for {} ranks in a group of {}", placement_.n_ranks,
                    comm_.size());
}

void ExpertParallel::keep_local(MoEWeight& w) const {
    PEREGRINE_CHECK(static_cast<int>(w.experts.size()) == placement_.n_experts,
                    "placement for {} experts, layer has {}", placement_.n_experts, w.experts.size());
    for (int e = 0; e < placement_.n_experts; ++e)
        if (!placement_.holds(comm_.rank(), e)) w.experts[static_cast<size_t>(e)] = ExpertWeight{};
}

namespace {

template <typename T>
void append_bytes(std::vector<uint8_t>& out, const T* p, size_t n) {
    const auto* b = reinterpret_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n * sizeof(T));
}

}  // namespace

Tensor ExpertParallel::moe(Backend& be, const Tensor& x, const MoEWeight& w, const std::vector<int32_t>& ids) {
    const int n = comm_.size(), K = w.top_k;
    const int64_t T = x.numel() ? x.dim(0) : 0, P = T * K;
    const int64_t D = static_cast<int64_t>(w.shared.w2.out);

    // Route, then order the pairs by the rank that serves them (pair order within a rank).
    MoeRoute route;
    std::vector<int32_t> sel;
    std::vector<float> wsel;
    if (T) {
        route = be.moe_route(x, w, ids);
        Tensor s = be.to_host_copy(route.experts), ws = be.to_host_copy(route.weights);
        sel.assign(s.data<int32_t>(), s.data<int32_t>() + P);
        wsel.assign(ws.f32(), ws.f32() + P);
    }
    std::vector<int> dest(static_cast<size_t>(P));
    for (int64_t p = 0; p < P; ++p)
        dest[static_cast<size_t>(p)] = placement_.serving_rank(sel[static_cast<size_t>(p)], static_cast<uint64_t>(p));
    std::vector<int> order(static_cast<size_t>(P));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return dest[static_cast<size_t>(a)] < dest[static_cast<size_t>(b)]; });
    std::vector<int64_t> counts(static_cast<size_t>(n), 0);
    for (int d : dest) ++counts[static_cast<size_t>(d)];

    // Dispatch: each pair's expert id and weight (host), and its token row.
    std::vector<std::vector<uint8_t>> meta(static_cast<size_t>(n));
    for (int p : order) {
        auto& m = meta[static_cast<size_t>(dest[static_cast<size_t>(p)])];
        append_bytes(m, &sel[static_cast<size_t>(p)], 1);
        append_bytes(m, &wsel[static_cast<size_t>(p)], 1);
    }
    std::vector<int> pair_rows(order.size());
    for (size_t i = 0; i < order.size(); ++i) pair_rows[i] = order[i] / K;
    Tensor xs = P ? be.gather_rows(x, pair_rows) : be.from_host_copy(Tensor::zeros(DType::F32, {0, D}));
    auto got = comm_.exchange_bytes(meta);
    std::vector<int64_t> recv_counts;
    Tensor xr = comm_.exchange_rows(be, xs, counts, recv_counts);

    // The experts of this rank over the pairs it received, in arrival order.
    const int64_t R = xr.dim(0);
    Tensor experts = Tensor::zeros(DType::I32, {R}), weights = Tensor::zeros(DType::F32, {R});
    int64_t at = 0;
    for (int src = 0; src < n; ++src) {
        const auto& m = got[static_cast<size_t>(src)];
        const size_t rec = sizeof(int32_t) + sizeof(float);
        PEREGRINE_CHECK(m.size() == static_cast<size_t>(recv_counts[static_cast<size_t>(src)]) * rec,
                        "rank {} sent {} pair records for {} rows", src, m.size() / rec,
                        recv_counts[static_cast<size_t>(src)]);
        for (size_t i = 0; i < m.size(); i += rec, ++at) {
            std::memcpy(experts.data<int32_t>() + at, m.data() + i, sizeof(int32_t));
            std::memcpy(weights.f32() + at, m.data() + i + sizeof(int32_t), sizeof(float));
        }
    }
    Tensor yr = R ? be.moe_experts(xr, w, be.from_host_copy(experts), be.from_host_copy(weights))
                  : be.from_host_copy(Tensor::zeros(DType::F32, {0, D}));

    // Combine: results go back to their senders in the order they came, then to pair order.
    std::vector<int64_t> back_counts;
    Tensor yb = comm_.exchange_rows(be, yr, recv_counts, back_counts);
    PEREGRINE_CHECK(back_counts == counts, "expert results came back in other numbers than the pairs sent");
    if (!T) return be.from_host_copy(Tensor::zeros(DType::F32, {0, D}));
    std::vector<int> inverse(static_cast<size_t>(P));
    for (size_t i = 0; i < order.size(); ++i) inverse[static_cast<size_t>(order[i])] = static_cast<int>(i);
    Tensor ye = be.gather_rows(yb, inverse);
    return be.moe_combine(x, w, ye, route.experts);
}

}  // namespace peregrine
