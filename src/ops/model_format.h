#pragma once
// Where the DeepSeek-V4 family's releases compute differently inside the ops, as parameters the backends take.
// Each model variant fills them (src/model/, a file per variant); the byte formats and quantisation blocks of the
// state entries come with the state layout (kv/entry_format.h).
namespace peregrine {

// YaRN's ramp over the corrected dimension range [low, high].
enum class YarnRamp {
    kMinWidth,    // divided by max(high - low, 1e-3)
    kWidenEmpty,  // high += 0.001 when high == low
};

// How a token's routing weights are normalised over its top-k experts.
enum class RouteNorm : int {
    kNone = 0,
    kSum = 1,         // w / sum
    kSumIfSeveral = 2,  // with top-k > 1: w / (sum + 1e-20)
};

struct ModelFormat {
    // A sublayer collapses its input with the previous sublayer's pre mix (single-pass mHC); else with its own.
    bool single_pass_mhc = true;
    // The queries get an unweighted per-head RMS norm, in bf16 arithmetic, before RoPE.
    bool query_head_norm = false;
    // The indexer's queries and keys are Hadamard-rotated before their quantisation.
    bool index_rotation = false;
    // A top-k selection lists its entries in ascending order; else by descending score.
    bool sorted_selection = true;
    // A decode row lists the window as a ring from its oldest slot also before the window has filled (unfilled
    // slots first); else oldest position first until it fills.
    bool ring_before_full = true;
    YarnRamp yarn_ramp = YarnRamp::kMinWidth;
    RouteNorm route_norm = RouteNorm::kSumIfSeveral;
};

}  // namespace peregrine
