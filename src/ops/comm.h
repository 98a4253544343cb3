#pragma once
// Collective exchanges between the ranks of a parallel group (one rank per GPU): what expert parallelism
// needs to move token rows to the ranks holding their experts and the results back. `LoopbackGroup` runs
// every rank in one process (threads), so the dispatch and combine logic is checked without several GPUs;
// the NCCL communicator (cuda/nccl_comm) moves device rows between GPUs.
#include "ops/backend.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace peregrine {

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    // Every rank calls this together. `send` [n, ...] holds rows grouped by destination: counts[r] rows for
    // rank r, ranks in order. Returns the rows sent to this rank grouped by source rank in rank order
    // (`recv_counts` gets how many from each), in the memory `be` computes in.
    virtual Tensor exchange_rows(Backend& be, const Tensor& send, const std::vector<int64_t>& counts,
                                 std::vector<int64_t>& recv_counts) = 0;
    // Small host-side messages: bytes for each rank -> bytes from each rank.
    virtual std::vector<std::vector<uint8_t>> exchange_bytes(const std::vector<std::vector<uint8_t>>& send) = 0;
    // A rank failed: every rank waiting in an exchange now, or entering one later, gets an error instead of
    // waiting for it forever.
    virtual void abort() = 0;
};

// `n` communicators of one in-process group, to be used by n threads (one per rank). Exchanges go through
// host memory.
std::vector<std::unique_ptr<Communicator>> make_loopback_group(int n);
// One communicator per GPU 0..n-1 of this host, over NCCL (opened at run time); rank r drives GPU r. Only
// in builds with the CUDA backend.
std::vector<std::unique_ptr<Communicator>> make_nccl_group(int n);

}  // namespace peregrine
