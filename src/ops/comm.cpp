#include "ops/comm.h"
#include "util/error.h"

#include <condition_variable>
#include <cstring>
#include <mutex>

namespace peregrine {

namespace {

// State shared by a loopback group: each exchange is two barrier phases (post, then collect), so a rank's
// posted messages stay valid until every rank has taken its part.
struct LoopbackShared {
    explicit LoopbackShared(int n) : n(n), posted(static_cast<size_t>(n)) {}
    const int n;
    std::mutex mu;
    std::condition_variable cv;
    int arrived = 0;
    uint64_t generation = 0;
    bool aborted = false;
    std::vector<std::vector<std::vector<uint8_t>>> posted;  // [source][destination] bytes

    void barrier() {
        std::unique_lock lk(mu);
        if (aborted) fail("a rank of the group failed");
        const uint64_t gen = generation;
        if (++arrived == n) {
            arrived = 0;
            ++generation;
            cv.notify_all();
        } else {
            cv.wait(lk, [&] { return generation != gen || aborted; });
            if (generation == gen) fail("a rank of the group failed");
        }
    }
    void abort() {
        std::lock_guard lk(mu);
        aborted = true;
        cv.notify_all();
    }
};

class LoopbackCommunicator : public Communicator {
public:
    LoopbackCommunicator(std::shared_ptr<LoopbackShared> s, int rank) : s_(std::move(s)), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return s_->n; }
    void abort() override { s_->abort(); }

    std::vector<std::vector<uint8_t>> exchange_bytes(const std::vector<std::vector<uint8_t>>& send) override {
        PEREGRINE_CHECK(static_cast<int>(send.size()) == s_->n, "exchange_bytes: {} messages for {} ranks", send.size(),
                        s_->n);
        {
            std::lock_guard lk(s_->mu);
            s_->posted[static_cast<size_t>(rank_)] = send;
        }
        s_->barrier();
        std::vector<std::vector<uint8_t>> got(static_cast<size_t>(s_->n));
        {
            std::lock_guard lk(s_->mu);
            for (int src = 0; src < s_->n; ++src)
                got[static_cast<size_t>(src)] = s_->posted[static_cast<size_t>(src)][static_cast<size_t>(rank_)];
        }
        s_->barrier();
        return got;
    }

    Tensor exchange_rows(Backend& be, const Tensor& send, const std::vector<int64_t>& counts,
                         std::vector<int64_t>& recv_counts) override {
        PEREGRINE_CHECK(static_cast<int>(counts.size()) == s_->n, "exchange_rows: {} counts for {} ranks",
                        counts.size(), s_->n);
        std::vector<int64_t> shape = send.shape();
        PEREGRINE_CHECK(!shape.empty(), "exchange_rows: a tensor of rows");
        int64_t total = 0;
        for (int64_t c : counts) total += c;
        PEREGRINE_CHECK(total == shape[0], "exchange_rows: counts cover {} rows of {}", total, shape[0]);
        int64_t row_elems = 1;
        for (size_t i = 1; i < shape.size(); ++i) row_elems *= shape[i];
        const size_t rb = static_cast<size_t>(row_elems) * dtype_size(send.dtype());
        Tensor host = be.to_host_copy(send);
        std::vector<std::vector<uint8_t>> out(static_cast<size_t>(s_->n));
        const auto* p = static_cast<const uint8_t*>(host.raw());
        for (int r = 0; r < s_->n; ++r) {
            const size_t bytes = static_cast<size_t>(counts[static_cast<size_t>(r)]) * rb;
            out[static_cast<size_t>(r)].assign(p, p + bytes);
            p += bytes;
        }
        auto got = exchange_bytes(out);
        recv_counts.assign(static_cast<size_t>(s_->n), 0);
        size_t total_bytes = 0;
        for (auto& g : got) total_bytes += g.size();
        shape[0] = rb ? static_cast<int64_t>(total_bytes / rb) : 0;
        Tensor recv = Tensor::zeros(send.dtype(), shape);
        auto* q = static_cast<uint8_t*>(recv.raw());
        for (int r = 0; r < s_->n; ++r) {
            const auto& g = got[static_cast<size_t>(r)];
            PEREGRINE_CHECK(rb == 0 || g.size() % rb == 0, "exchange_rows: rank {} sent rows of another width", r);
            recv_counts[static_cast<size_t>(r)] = rb ? static_cast<int64_t>(g.size() / rb) : 0;
            if (!g.empty()) std::memcpy(q, g.data(), g.size());
            q += g.size();
        }
        return be.from_host_copy(recv);
    }

private:
    std::shared_ptr<LoopbackShared> s_;
    int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_loopback_group(int n) {
    PEREGRINE_CHECK(n >= 1, "a group needs at least one rank");
    auto s = std::make_shared<LoopbackShared>(n);
    std::vector<std::unique_ptr<Communicator>> out;
    for (int r = 0; r < n; ++r) out.push_back(std::make_unique<LoopbackCommunicator>(s, r));
    return out;
}

}  // namespace peregrine
