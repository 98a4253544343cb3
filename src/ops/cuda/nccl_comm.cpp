// Expert-parallel exchanges between GPUs over NCCL (point-to-point send/recv in one group call per
// exchange, as an all-to-all-v). libnccl is opened at run time, so the binary starts where NCCL is absent
// and only a multi-GPU group needs it. One communicator per GPU, all in this process (a thread per GPU);
// several hosts would create theirs with ncclCommInitRank from one shared unique id. Work goes to the
// calling thread's stream, as the backend's does.
#include "ops/comm.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/launch_check.h"
#include "util/error.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#include <mutex>

namespace peregrine {

namespace {

struct Nccl {
    decltype(&ncclCommInitAll) comm_init_all = nullptr;
    decltype(&ncclCommDestroy) comm_destroy = nullptr;
    decltype(&ncclCommAbort) comm_abort = nullptr;
    decltype(&ncclGetErrorString) error_string = nullptr;
    decltype(&ncclAllGather) all_gather = nullptr;
    decltype(&ncclSend) send = nullptr;
    decltype(&ncclRecv) recv = nullptr;
    decltype(&ncclGroupStart) group_start = nullptr;
    decltype(&ncclGroupEnd) group_end = nullptr;

    static Nccl& get() {
        static Nccl* n = [] {
            void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
            if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_GLOBAL);
            if (!h) fail("expert parallelism on several GPUs needs NCCL: libnccl.so.2 was not found ({})", dlerror());
            auto* api = new Nccl;
            auto sym = [&](const char* name) {
                void* p = dlsym(h, name);
                if (!p) fail("libnccl lacks {}", name);
                return p;
            };
            api->comm_init_all = reinterpret_cast<decltype(api->comm_init_all)>(sym("ncclCommInitAll"));
            api->comm_destroy = reinterpret_cast<decltype(api->comm_destroy)>(sym("ncclCommDestroy"));
            api->comm_abort = reinterpret_cast<decltype(api->comm_abort)>(sym("ncclCommAbort"));
            api->error_string = reinterpret_cast<decltype(api->error_string)>(sym("ncclGetErrorString"));
            api->all_gather = reinterpret_cast<decltype(api->all_gather)>(sym("ncclAllGather"));
            api->send = reinterpret_cast<decltype(api->send)>(sym("ncclSend"));
            api->recv = reinterpret_cast<decltype(api->recv)>(sym("ncclRecv"));
            api->group_start = reinterpret_cast<decltype(api->group_start)>(sym("ncclGroupStart"));
            api->group_end = reinterpret_cast<decltype(api->group_end)>(sym("ncclGroupEnd"));
            return api;
        }();
        return *n;
    }
    void check(ncclResult_t r, const char* what) const {
        if (r != ncclSuccess) fail("NCCL {} failed: {}", what, error_string(r));
    }
};

class NcclCommunicator : public Communicator {
public:
    NcclCommunicator(ncclComm_t comm, int rank, int n) : comm_(comm), rank_(rank), n_(n) {}
    ~NcclCommunicator() override {
        if (comm_) Nccl::get().comm_destroy(comm_);
    }
    int rank() const override { return rank_; }
    int size() const override { return n_; }
    void abort() override {
        std::lock_guard lk(abort_mu_);
        if (comm_ && !aborted_) Nccl::get().comm_abort(comm_);
        aborted_ = true;
        comm_ = nullptr;
    }

    std::vector<std::vector<uint8_t>> exchange_bytes(const std::vector<std::vector<uint8_t>>& send) override {
        PEREGRINE_CHECK(static_cast<int>(send.size()) == n_, "exchange_bytes: {} messages for {} ranks", send.size(),
                        n_);
        PG_CUDA(cudaSetDevice(rank_));
        std::vector<int64_t> out_sizes(static_cast<size_t>(n_));
        size_t total = 0;
        for (int r = 0; r < n_; ++r)
            total += out_sizes[static_cast<size_t>(r)] = static_cast<int64_t>(send[static_cast<size_t>(r)].size());
        const auto sizes = all_gather_sizes(out_sizes);  // [source][destination]
        std::vector<uint8_t> packed;
        packed.reserve(total);
        for (const auto& m : send) packed.insert(packed.end(), m.begin(), m.end());
        std::vector<int64_t> in_sizes(static_cast<size_t>(n_));
        for (int s = 0; s < n_; ++s) in_sizes[static_cast<size_t>(s)] = sizes[static_cast<size_t>(s * n_ + rank_)];
        auto out_d = cuda::device_alloc(std::max<size_t>(total, 1));
        if (total) PG_CUDA(cudaMemcpy(out_d.get(), packed.data(), total, cudaMemcpyHostToDevice));
        size_t in_total = 0;
        for (int64_t v : in_sizes) in_total += static_cast<size_t>(v);
        auto in_d = cuda::device_alloc(std::max<size_t>(in_total, 1));
        all_to_all(static_cast<const uint8_t*>(out_d.get()), out_sizes, static_cast<uint8_t*>(in_d.get()), in_sizes);
        std::vector<uint8_t> in(in_total);
        if (in_total) PG_CUDA(cudaMemcpy(in.data(), in_d.get(), in_total, cudaMemcpyDeviceToHost));
        std::vector<std::vector<uint8_t>> got(static_cast<size_t>(n_));
        size_t at = 0;
        for (int s = 0; s < n_; ++s) {
            got[static_cast<size_t>(s)].assign(
                in.begin() + static_cast<int64_t>(at),
                in.begin() + static_cast<int64_t>(at + in_sizes[static_cast<size_t>(s)]));
            at += static_cast<size_t>(in_sizes[static_cast<size_t>(s)]);
        }
        return got;
    }

    Tensor exchange_rows(Backend& be, const Tensor& send, const std::vector<int64_t>& counts,
                         std::vector<int64_t>& recv_counts) override {
        PEREGRINE_CHECK(static_cast<int>(counts.size()) == n_, "exchange_rows: {} counts for {} ranks", counts.size(),
                        n_);
        PG_CUDA(cudaSetDevice(rank_));
        Tensor src = send.device() == Device::CUDA ? send : be.from_host_copy(send);
        std::vector<int64_t> shape = src.shape();
        int64_t row_elems = 1;
        for (size_t i = 1; i < shape.size(); ++i) row_elems *= shape[i];
        const int64_t rb = row_elems * static_cast<int64_t>(dtype_size(src.dtype()));
        const auto all = all_gather_sizes(counts);
        recv_counts.assign(static_cast<size_t>(n_), 0);
        int64_t rows = 0;
        for (int s = 0; s < n_; ++s)
            rows += recv_counts[static_cast<size_t>(s)] = all[static_cast<size_t>(s * n_ + rank_)];
        shape[0] = rows;
        Tensor out = cuda::empty(src.dtype(), shape);
        std::vector<int64_t> out_bytes(static_cast<size_t>(n_)), in_bytes(static_cast<size_t>(n_));
        for (int r = 0; r < n_; ++r) {
            out_bytes[static_cast<size_t>(r)] = counts[static_cast<size_t>(r)] * rb;
            in_bytes[static_cast<size_t>(r)] = recv_counts[static_cast<size_t>(r)] * rb;
        }
        all_to_all(static_cast<const uint8_t*>(src.raw()), out_bytes, static_cast<uint8_t*>(out.raw()), in_bytes);
        return out;
    }

private:
    // Every rank's n values -> [n * n] on the host (rank-major).
    std::vector<int64_t> all_gather_sizes(const std::vector<int64_t>& mine) {
        const Nccl& api = Nccl::get();
        auto d = cuda::device_alloc(sizeof(int64_t) * static_cast<size_t>(n_ * (n_ + 1)));
        auto* base = static_cast<int64_t*>(d.get());
        PG_CUDA(cudaMemcpy(base, mine.data(), sizeof(int64_t) * static_cast<size_t>(n_), cudaMemcpyHostToDevice));
        api.check(api.all_gather(base, base + n_, static_cast<size_t>(n_), ncclInt64, live(), cudaStreamPerThread),
                  "all-gather");
        std::vector<int64_t> all(static_cast<size_t>(n_ * n_));
        PG_CUDA(cudaMemcpy(all.data(), base + n_, sizeof(int64_t) * all.size(), cudaMemcpyDeviceToHost));
        return all;
    }

    // out_bytes[r] bytes (consecutive from `out`) to rank r; in_bytes[s] from rank s into `in`, in rank order.
    void all_to_all(const uint8_t* out, const std::vector<int64_t>& out_bytes, uint8_t* in,
                    const std::vector<int64_t>& in_bytes) {
        const Nccl& api = Nccl::get();
        ncclComm_t c = live();
        std::vector<size_t> out_at(static_cast<size_t>(n_) + 1, 0), in_at(static_cast<size_t>(n_) + 1, 0);
        for (int r = 0; r < n_; ++r) {
            out_at[static_cast<size_t>(r) + 1] =
                out_at[static_cast<size_t>(r)] + static_cast<size_t>(out_bytes[static_cast<size_t>(r)]);
            in_at[static_cast<size_t>(r) + 1] =
                in_at[static_cast<size_t>(r)] + static_cast<size_t>(in_bytes[static_cast<size_t>(r)]);
        }
        // This rank's own share is a device copy.
        const size_t self = static_cast<size_t>(in_bytes[static_cast<size_t>(rank_)]);
        if (self)
            PG_CUDA(cudaMemcpyAsync(in + in_at[static_cast<size_t>(rank_)], out + out_at[static_cast<size_t>(rank_)],
                                    self, cudaMemcpyDeviceToDevice, cudaStreamPerThread));
        api.check(api.group_start(), "group start");
        for (int r = 0; r < n_; ++r) {
            if (r == rank_) continue;
            if (out_bytes[static_cast<size_t>(r)])
                api.check(api.send(out + out_at[static_cast<size_t>(r)],
                                   static_cast<size_t>(out_bytes[static_cast<size_t>(r)]), ncclUint8, r, c,
                                   cudaStreamPerThread),
                          "send");
            if (in_bytes[static_cast<size_t>(r)])
                api.check(
                    api.recv(in + in_at[static_cast<size_t>(r)], static_cast<size_t>(in_bytes[static_cast<size_t>(r)]),
                             ncclUint8, r, c, cudaStreamPerThread),
                    "recv");
        }
        api.check(api.group_end(), "group end");
    }

    ncclComm_t live() {
        std::lock_guard lk(abort_mu_);
        if (aborted_ || !comm_) fail("a rank of the group failed");
        return comm_;
    }

    ncclComm_t comm_;
    int rank_, n_;
    std::mutex abort_mu_;
    bool aborted_ = false;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_group(int n) {
    int visible = 0;
    PG_CUDA(cudaGetDeviceCount(&visible));
    PEREGRINE_CHECK(n >= 1 && n <= visible, "a group of {} GPUs asked for, {} visible", n, visible);
    const Nccl& api = Nccl::get();
    std::vector<ncclComm_t> comms(static_cast<size_t>(n));
    std::vector<int> devs(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) devs[static_cast<size_t>(i)] = i;
    api.check(api.comm_init_all(comms.data(), n, devs.data()), "init");
    std::vector<std::unique_ptr<Communicator>> out;
    for (int r = 0; r < n; ++r) out.push_back(std::make_unique<NcclCommunicator>(comms[static_cast<size_t>(r)], r, n));
    return out;
}

}  // namespace peregrine
