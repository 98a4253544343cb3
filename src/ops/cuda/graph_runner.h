#pragma once
// Regions of launches captured once as CUDA graphs and replayed: a decode step's run of decoder layers, another
// step's MoE block. A region reads fixed input buffers and writes fixed output buffers, copied in and out around
// each replay.
// The first call at a key runs eagerly (so that weights, tables and scratch exist before capture, which cannot
// upload), the second captures and replays, later ones replay; a region whose capture fails stays eager. Captured
// kernels read the decode GEMV's grow-only scratch: it is grown once before the first capture, and every graph is
// dropped if any of it moves (a larger call elsewhere may grow it). A region's temporaries come from an arena of its
// own (CaptureArena: no memory nodes in the graph), captured again at once if the first arena was too small. Same
// kernels on the same inputs: replays give the eager run's bits.
#include "ops/diagnostics.h"
#include "tensor/tensor.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace peregrine::cuda {

class GraphRunner {
public:
    enum class Kind { decoder_layers, moe_block };
    struct Key {
        Kind kind;
        const void* what;  // the region's weights (decoder layers: the first layer's)
        int64_t rows;
        int64_t seqs = 0;    // decoder layers: the step's sequences
        int64_t layers = 0;  // decoder layers: how many
        bool operator<(const Key& o) const {
            return std::tie(kind, what, rows, seqs, layers) < std::tie(o.kind, o.what, o.rows, o.seqs, o.layers);
        }
    };
    // What a region runs: reads `in` and `ids` [rows] (token ids on the device), writes `out` (all fixed buffers).
    using Body = std::function<void(const std::vector<Tensor>& in, const int32_t* ids, std::vector<Tensor>& out)>;

    GraphRunner() = default;
    ~GraphRunner();
    GraphRunner(const GraphRunner&) = delete;
    GraphRunner& operator=(const GraphRunner&) = delete;

    // What a caller does around a region's capture and replays: before_capture readies the stream (no side-stream
    // work in flight), after_capture notes what the region leaves for later regions (kept with the region), and
    // on_replay restores it before each replay.
    struct Hooks {
        std::function<void()> before_capture;
        std::function<void(std::shared_ptr<void>& note)> after_capture;
        std::function<void(const std::shared_ptr<void>& note)> on_replay;
    };
    // Runs region `key` on `in` and `ids` (device ids, `key.rows` of them, copied in), its results in fresh `out`;
    // false: not as a graph (the caller runs it eagerly). `version`: a region captured at another version is captured
    // again (the decode layers' cap). `out_like`: the outputs' shapes.
    bool run(const Key& key, int64_t version, const std::vector<Tensor>& in, const int32_t* ids,
             const std::vector<Tensor>& out_like, std::vector<Tensor>& out, const Body& body, const Hooks& hooks = {});
    // Forgets the regions of `kind` at `rows` rows and `seqs` sequences (their fixed buffers moved), or every region.
    void drop(Kind kind, int64_t rows, int64_t seqs);
    void drop_all();

    int64_t replays() const { return replays_; }
    int64_t captures() const { return captures_; }
    int64_t failed_captures() const { return failed_captures_; }  // regions left eager (the reason on stderr)
    // Device memory the regions' capture arenas hold (device_memory.h).
    size_t arena_bytes() const;
    // The nodes and edges of every graph captured so far (Diagnostics::GraphCensus).
    const Diagnostics::GraphCensus& census() const { return census_; }

private:
    struct Region;
    // Grows the GEMV scratch before the first capture; drops every graph if it moved since.
    void prepare_scratch();
    bool capture(Region& r, const Key& key, const Body& body);

    std::map<Key, std::shared_ptr<Region>> regions_;
    std::map<std::pair<Kind, int64_t>, size_t> arena_sizes_;  // by kind and rows: the last capture's need
    void* scratch_[2][3] = {};  // the GEMV scratch the graphs were captured with (per set: gemv_common.cuh)
    int64_t replays_ = 0, captures_ = 0, failed_captures_ = 0;
    Diagnostics::GraphCensus census_;
};

}  // namespace peregrine::cuda
