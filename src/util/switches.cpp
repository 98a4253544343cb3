#include "util/switches.h"
#include "util/error.h"

#include <cstdlib>
#include <cstring>

namespace peregrine {

namespace {

// The A/B switches (cuda) each pick between two ways to compute the same thing; the others set sizes and paths.
const std::vector<Switch> kSwitches = {
    {"PEREGRINE_THREADS", "", "<int>", "runtime", "CPU worker threads (default: the hardware threads)"},
    {"PEREGRINE_MODEL", "", "<text>", "runtime", "Model directory of serve and generate when --model is not given"},
    {"PEREGRINE_ENGINE_TRACE", "0", "0|1", "engine",
     "1: log the host's time per step (build, forward enqueue, wait for tokens, deliver) every 500 steps"},
    {"PEREGRINE_GRAMMAR_THREADS", "", "<int>", "grammar",
     "Threads compiling grammars and filling token masks (default: the hardware threads; masks at most 8)"},
    {"PEREGRINE_GRAMMAR_PROFILE", "0", "0|1", "grammar", "1: print each grammar state's walk time and class sizes"},
    {"PEREGRINE_CUDA_NUMERICS", "fast", "fast|exact|reference", "cuda",
     "fast: tensor-core and memory-bound kernels summing in fp32 (parity within the fixtures' tolerances); exact: "
     "tiled kernels bit-identical to the CPU reference; reference: one thread per output (to A/B the tiled ones)"},
    {"PEREGRINE_CUDA_GRAPHS", "1", "0|1", "cuda",
     "Decode steps' decoder layers and other steps' MoE blocks as CUDA graphs (replays give the same bits)"},
    {"PEREGRINE_DECODE_TABLES", "1", "0|1", "cuda",
     "Decode steps plan their attention tables on the device (0: the general path, whose tables the host lists)"},
    {"PEREGRINE_HC_SMALL", "1", "0|1", "cuda", "hc mixes of fewer than 8 rows on the small-T kernels (0: FP64 MMA)"},
    {"PEREGRINE_LAUNCH_FOLDS", "1", "0|1", "cuda",
     "The attention block's folded launches: rms_norm with RoPE and QDQ, the output's inverse RoPE in the split-key "
     "merge, the decode compressor's own zero rows (0: apart, the same bits)"},
    {"PEREGRINE_HC_SIDE_STREAM", "1", "0|1", "cuda", "hc mixes of decode-sized steps on a side stream"},
    {"PEREGRINE_SHARED_EXPERT_SIDE_STREAM", "1", "0|1", "cuda",
     "The shared expert of decode-sized MoE blocks on a side stream, beside the routed experts"},
    {"PEREGRINE_CUDA_POOL_KEEP", "1", "0|1", "cuda",
     "Keep the stream-ordered pool's freed memory mapped (0: the driver's release threshold)"},
    {"PEREGRINE_INDEX_SCORE_MB", "1024", "<int>", "cuda", "Bound on the indexer's score matrix per chunk of rows, MiB"},
    {"PEREGRINE_INDEX_DECODE", "mma", "mma|stream", "cuda",
     "Decode rows' indexer scores: tensor cores, or the CUDA-core streaming kernel for every row"},
    {"PEREGRINE_INDEX_GEMM", "wgmma", "wgmma|mma", "cuda", "Prefill indexer scores on wgmma or mma.sync"},
    {"PEREGRINE_SPARSE_KERNEL", "rows", "rows|mma", "cuda",
     "Prefill sparse attention over decoded bf16 key rows (wgmma), or the mma.sync kernel over packed keys"},
    {"PEREGRINE_SPARSE_WARPS", "auto", "auto|8|16", "cuda", "Warps per CTA of the mma.sync sparse attention"},
    {"PEREGRINE_MOE_GEMM", "wgmma", "wgmma|mma|cublas", "cuda",
     "Prefill routed FP4 experts: grouped wgmma, grouped mma.sync, or cuBLAS per tile"},
    {"PEREGRINE_MOE_GEMM_TOKENS", "auto", "auto|64|128", "cuda", "Token tile of the grouped wgmma FP4 experts"},
    {"PEREGRINE_CUBLAS_QUANTISE", "1", "0|1", "cuda",
     "Prefill FP8 linears quantise straight into cuBLAS's bf16 operand (0: act_quant, then the gather)"},
    {"PEREGRINE_CUBLAS_GROUPED", "1", "0|1", "cuda", "Routed cuBLAS GEMMs as one grouped call"},
    {"PEREGRINE_GEMV_KERNEL", "", "<text>", "cuda",
     "Decode GEMV kernel: a name for every format, or fmt=name,... (names: kernels.h GemvKernel, docs/cuda-backend.md)"},
    {"PEREGRINE_GEMV_FUSE", "1", "0|1", "cuda", "The streaming GEMV quantises FP8/FP4 activations itself"},
    {"PEREGRINE_GEMV_PAIR", "1", "0|1", "cuda", "Two decode linears of one input in one launch"},
    {"PEREGRINE_FP8_GEMV_ROWS", "8", "<int>", "cuda",
     "Most rows of a dense FP8 linear on the decode GEMV (from 3 rows; the rest, up to 256, on the bf16 wgmma kernel)"},
    {"PEREGRINE_GEMV_IMAGE_ROWS", "3", "<int>", "cuda",
     "Dense decode GEMVs from this many rows stage their activations once for all CTAs (0: never)"},
    {"PEREGRINE_GEMV_TRACE", "0", "0|1", "cuda", "1: print each streaming GEMV plan as it is first made"},
    {"PEREGRINE_PDL", "1", "0|1", "cuda", "Programmatic dependent launch (kernels overlap their predecessor's tail)"},
    {"PEREGRINE_SAMPLING", "device", "device|host", "cuda", "Sample on the device, or copy the logits to the host"},
    {"PEREGRINE_SAMPLER_CLUSTER", "1", "0|1", "cuda", "The device sampler spreads few rows over thread-block clusters"},
    {"PEREGRINE_TEST_DATA_DIR", "", "<text>", "tests", "Fixture directory of the test binaries (tools/gpu/check.sh)"},
    {"PEREGRINE_ENGINE_OVERLAP", "", "-1|0|1", "tests", "Overlapped schedule of the engine tests (-1: by backend)"},
    {"PEREGRINE_GEMV_SWEEP_ROWS", "", "<text>", "tests", "Rows of test_cuda_gemv's sweep, comma-separated"},
    {"PEREGRINE_GEMV_SWEEP_FORMATS", "", "<text>", "tests", "Formats of test_cuda_gemv's sweep, comma-separated"},
    {"PEREGRINE_GEMV_SWEEP_SHAPES", "", "<text>", "tests", "Shapes of test_cuda_gemv's sweep (NxK, comma-separated)"},
    {"PEREGRINE_BENCH_TOKENIZER", "", "<text>", "tests", "tokenizer.json of bench_tokenizer"},
    {"PEREGRINE_VOCAB", "", "<text>", "tests", "tokenizer.json of bench_grammar"},
};

const Switch& declared(const char* name) {
    for (const Switch& s : kSwitches)
        if (std::strcmp(s.name, name) == 0) return s;
    fail("environment switch {} is not declared (util/switches.cpp)", name);
}

bool one_of(const char* values, const std::string& v) {
    const std::string all = values;
    size_t at = 0;
    while (at <= all.size()) {
        const size_t end = std::min(all.find('|', at), all.size());
        if (all.compare(at, end - at, v) == 0) return true;
        at = end + 1;
    }
    return false;
}

}  // namespace

const std::vector<Switch>& switches() { return kSwitches; }

bool switch_set(const char* name) {
    declared(name);
    return std::getenv(name) != nullptr;
}

std::string switch_value(const char* name) {
    const Switch& s = declared(name);
    const char* env = std::getenv(name);
    if (!env) return s.fallback;
    const std::string v = env;
    if (s.values[0] != '<' && !one_of(s.values, v)) fail("{}='{}': expected one of {}", name, v, s.values);
    return v;
}

bool switch_is(const char* name, const char* value) { return switch_value(name) == value; }

long long switch_int(const char* name, long long lo, long long hi) {
    const std::string v = switch_value(name);
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || n < lo || n > hi) fail("{}='{}': expected an integer from {} to {}", name, v, lo, hi);
    return n;
}

}  // namespace peregrine
