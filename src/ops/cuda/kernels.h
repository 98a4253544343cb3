#pragma once
// Launchers of the CUDA kernels (plain pointers, device memory, the current stream). The backend in
// cuda_backend.cpp composes them. The exact kernels follow the reference backend's arithmetic (src/ops/cpu)
// step for step, with double accumulation where the reference sums exactly; the fast ones (marked
// Numerics::Fast) keep its rounding points and sum in fp32 in their own order.
#include "ops/cuda/paged_address.h"
#include "kv/entry_format.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace peregrine::cuda {

// A linear layer's weights in device memory (see LinearWeight for the formats).
struct LinearDev {
    int kind = 0;  // 0 F32 compute, 1 BF16, 2 FP8, 3 FP4 (LinearWeight::Kind order)
    int out = 0, in = 0, weight_block = 0, act_block = 0;
    bool w_bf16 = false;  // F32 kind: weights stored as bf16
    // F32 kind with bf16 weights: the activations are bf16 values too (a normalised row), so the products
    // are exact in bf16 x bf16 -> fp32 and the GEMM may run on the bf16 tensor cores (Fast numerics).
    bool bf16_acts = false;
    const void* w = nullptr;
    const uint8_t* scale = nullptr;
};

// Experts of one layer for the routed GEMM: per-expert weight and scale pointers (device arrays).
struct ExpertTable {
    const void* const* w = nullptr;
    const uint8_t* const* scale = nullptr;
};

// Rows of a routed GEMM grouped by expert: row_map[sorted] = pair row; tiles (expert, first sorted row,
// rows, -) as int4; at most max_tiles of them, the count in n_tiles (device).
struct LinearRouting {
    const int32_t* row_map = nullptr;
    const int32_t* tiles = nullptr;
    const int32_t* n_tiles = nullptr;
    unsigned max_tiles = 0;
    int tile_rows = 8;
};

// ---- linear_tiled.cu (the GEMM used wherever the shapes allow; linear.cu is its plain reference)
bool linear_tiled_supported(const LinearDev& w);
void linear_tiled(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y, const ExpertTable* experts,
                  const LinearRouting* routing);
int routing_tile_rows(int64_t pairs, int E);
void expert_tiles(const int32_t* sel, int64_t n, int E, int mt, int32_t* row_map, int32_t* tiles, int32_t* n_tiles);

// ---- linear_gemv.cu (Numerics::Fast, few rows per weight read: decode). Same contract as linear_tiled; sums
// in fp32 in its own order (bf16 output rounding as the reference). Routed tiles of at most 8 rows.
bool linear_gemv_supported(const LinearDev& w);
void linear_gemv(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y, const ExpertTable* experts,
                 const LinearRouting* routing);
// Two linears of one input (linear_gemv's contract for each): one streaming launch when their formats and widths
// match and their format's kernel streams (PEREGRINE_GEMV_PAIR=0: always two calls), else two calls. Routed
// (routing given): a's rows use table ea's experts, b's eb's, both the same routing (an expert's w1 and w3).
void linear_gemv_pair(const float* x, const float* xs, int64_t M, const LinearDev& a, float* ya, const LinearDev& b,
                      float* yb, const ExpertTable* ea = nullptr, const ExpertTable* eb = nullptr,
                      const LinearRouting* routing = nullptr);
// The decode GEMV's kernels, chosen per stored format (docs/cuda-backend.md has their figures). A kernel a linear
// does not support falls back to mma_sync, then cuda_cores. Defaults: BF16 and FP8 stream_256x4, FP4 fp4_16warps
// (fp4_12warps above 384 routed pairs), F32 cuda_cores. PEREGRINE_GEMV_KERNEL at start: a name for every format,
// or a list such as "fp8=stream-128x6,fp4=persistent-256x4".
enum class GemvKernel {
    cuda_cores = 1,          // CUDA cores, register double buffer, separate split reduction (every format)
    mma_sync = 3,            // mma.sync e4m3, 64-byte stages (linear_gemv_mma.cu; FP8/FP4)
    stream_128x6 = 4,        // streamed weights (linear_gemv_stream.cu): 128 bytes x 16 rows a stage, 6 stages
    stream_256x4 = 5,        // 256 bytes a stage, 4 stages (FP4: 3)
    stream_128x4_2ctas = 6,  // 128 bytes x 4 stages, two CTAs per SM
    persistent_128x6 = 7,    // stream_128x6 with persistent CTAs on routed calls
    persistent_256x4 = 8,    // stream_256x4 with persistent CTAs on routed calls
    fp4_12warps = 9,         // FP4: 12 warps a CTA, persistent when routed (other formats: stream_256x4)
    fp4_16warps = 10,        // FP4: 16 warps a CTA, persistent when routed (other formats: stream_256x4)
};
const char* gemv_kernel_name(GemvKernel k);
GemvKernel gemv_kernel_named(const std::string& name);  // fails naming the kernels
inline bool gemv_kernel_streams(GemvKernel k) { return k >= GemvKernel::stream_128x6; }
void linear_gemv_set_kernel(GemvKernel k);                   // every format (F32 stays cuda_cores)
void linear_gemv_set_kernel(int kind_format, GemvKernel k);  // one stored format: 0 F32, 1 BF16, 2 FP8, 3 FP4
GemvKernel linear_gemv_kernel(int kind_format);
// Whether linear_gemv takes this FP8/FP4 linear's activations unquantised (xs == nullptr) and quantises them
// itself, with act_quant's arithmetic (streaming kernels; PEREGRINE_GEMV_FUSE=0 or the setter turn it off).
bool linear_gemv_quantises(const LinearDev& w);
void linear_gemv_set_fuse(bool on);
// ---- linear_gemv_mma.cu (GemvKernel::mma_sync): FP8/FP4 decode GEMV on mma.sync e4m3 (linear_gemv's contract).
bool linear_gemv_mma_supported(const LinearDev& w);
void linear_gemv_mma(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y,
                     const ExpertTable* experts, const LinearRouting* routing);
// ---- linear_gemv_stream.cu (the streaming GemvKernels): the weights streamed through deep cp.async rings (scales
// included) on mma.sync e4m3 / bf16, the work split chosen for full waves; same contract as linear_gemv, and
// FP8/FP4 activations may come unquantised (xs == nullptr) where linear_gemv_stream_quantises.
bool linear_gemv_stream_supported(const LinearDev& w);
bool linear_gemv_stream_quantises(const LinearDev& w);
// Dense calls from this many rows on stage their activations once for all CTAs (0: never; the default 3 or
// PEREGRINE_GEMV_IMAGE_ROWS at start): the same outputs bit for bit. Returns the previous setting.
int linear_gemv_set_image_rows(int rows);
void linear_gemv_stream(GemvKernel k, const float* x, const float* xs, int64_t M, const LinearDev& w, float* y,
                        const ExpertTable* experts, const LinearRouting* routing);
// Two dense linears of the same input, format and K in one launch (rows of b after a's; a call of two when a's
// rows end inside a CTA's group of rows): the fixed cost of a call paid once.
bool linear_gemv_stream_pairs(const LinearDev& a, const LinearDev& b);
void linear_gemv_stream_pair(GemvKernel k, const float* x, const float* xs, int64_t M, const LinearDev& a, float* ya,
                             const LinearDev& b, float* yb, const ExpertTable* ea = nullptr,
                             const ExpertTable* eb = nullptr, const LinearRouting* routing = nullptr);
// ---- linear_wgmma.cu (Numerics::Fast, dense FP8 linears of up to 256 rows; the dispatch takes it where the GEMV
// does not: 1-2 and 9-256 rows): the e4m3 weights read once as they are stored, dequantised exactly in registers,
// on the bf16 tensor cores; products exact, fp32 sums (linear_cublas's contract). x: raw activations [M, in],
// quantised here (act_quant_bf16).
bool linear_wgmma_supported(const LinearDev& w, int64_t M);
void linear_wgmma(const float* x, int64_t M, const LinearDev& w, float* y);
// Two linears of one input (same K and blocks; w1 null: one) in one quantisation and one launch.
void linear_wgmma_pair(const float* x, int64_t M, const LinearDev& w0, float* y0, const LinearDev* w1, float* y1);
// ---- linear_cublas.cpp (prefill: tensor-core GEMMs through cuBLAS on exact bf16 images of the quantised
// operands, fp32 accumulation; F32 linears as fp32 GEMMs). Same contract as linear_tiled; routed calls read
// the tile table back to the host (one synchronisation). Weights are dequantised per call into a bounded,
// reused scratch. A dense call with quantised weights and xs null quantises x itself (act_quant_bf16).
bool linear_cublas_supported(const LinearDev& w);
void linear_cublas(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y, const ExpertTable* experts,
                   const LinearRouting* routing);
// grouped_linear_bf16 (the grouped wo_a) as one strided batched bf16 GEMM: no routing, no synchronisation.
void grouped_linear_cublas(const float* x, int64_t T, int G, int R, int GD, const uint16_t* w, float* y);
// Routed GEMMs as one grouped cuBLAS call per chunk (default; PEREGRINE_CUBLAS_GROUPED=0 turns it off) or one
// GEMM per expert. Falls back to the loop where this cuBLAS lacks the grouped call; linear_cublas_grouped()
// says which is in use.
void linear_cublas_use_grouped(bool on);
bool linear_cublas_grouped();
// Why the grouped call was turned off (cuBLAS status string), "" while it is in use or untried.
std::string linear_cublas_grouped_error();
// Frees the scratch (the handle stays); the next call grows it again.
void linear_cublas_release();

// ---- linear.cu
void act_quant(const float* x, int64_t M, int K, int block, float* q, float* scales);
// act_quant straight into the bf16 image of its output (each e4m3 value times its block's scale, exact), as the
// cuBLAS path's operand: one pass instead of act_quant and a gather. Needs 16-byte aligned rows of whole blocks of
// 4..128 (act_quant_bf16_supported); out 8-byte aligned. wgmma_order: each 64 values of a row in the order
// linear_wgmma's weight fragments take them (K % 64 == 0).
bool act_quant_bf16_supported(const float* x, int K, int block);
void act_quant_bf16(const float* x, int64_t M, int K, int block, uint16_t* out, bool wgmma_order = false);
// y[M, out] = x W^T; xs: activation scales when quantised (x then holds e4m3 values). With `experts`,
// row m uses expert row_expert[m]'s weights (the layout of `w` gives the shared shapes).
void linear(const float* x, const float* xs, int64_t M, const LinearDev& w, float* y,
            const ExpertTable* experts = nullptr, const int* row_expert = nullptr);
// Grouped bf16 projection: y[t, n] = bf16(x[t, (n / R) * GD .. +GD] . w[n]), w bf16 [G*R, GD].
void grouped_linear_bf16(const float* x, int64_t T, int G, int R, int GD, const uint16_t* w, float* y);

// ---- norm_hc.cu
void rms_norm(const float* x, int64_t rows, int D, const float* w, float eps, float* y);
// rms_norm(x, w) into y, then rope_qdq of y's rows as one head of width D (RoPE on dims [offset, offset + dim),
// the quantise-dequantise of [0, n) in blocks of `kind`): one kernel where rope_qdq takes quads, the same bits.
// With `store` (paged_tables.cu's section below), each row also goes into its entry at its position: the same
// launch.
struct PagedRowStore;
void rms_norm_rope_qdq(const float* x, int64_t rows, int D, const float* w, float eps, float* y, const int64_t* pos,
                       const float* freqs, int offset, int dim, int n, int block, int kind,
                       const PagedRowStore* store = nullptr);
// rms_norm(hc_collapse(h, pre), w) in one kernel, the same bits.
void collapse_norm(const float* h, const float* pre, int64_t T, int hc, int D, const float* w, float eps, float* y);
// mode 0: pre/post/comb with Sinkhorn; mode 1: V4 head (pre only, n_mix = hc).
void hc_mixes(const float* h, int64_t T, int hc, int D, const float* fn, int n_mix, const float* base,
              const float* scale, float eps, float hc_eps, int sinkhorn_iters, int mode, float* pre, float* post,
              float* comb);
// Numerics::Fast: the mixes on the FP64 tensor cores (exact products, double sums in another order), then the
// same finish per token.
void hc_mixes_fast(const float* h, int64_t T, int hc, int D, const float* fn, int n_mix, const float* base,
                   const float* scale, float eps, float hc_eps, int sinkhorn_iters, int mode, float* pre, float* post,
                   float* comb);
// Numerics::Fast at decode sizes (T <= 64): the same mixes (exact products, double sums in a fixed order of
// their own) and finish in two launches (column-sliced partial sums, then a block per token).
// workspace: hc_mixes_small_workspace() bytes.
bool hc_mixes_small_supported(int64_t T, int n_mix);
size_t hc_mixes_small_workspace(int64_t T, int hc, int D, int n_mix);
void hc_mixes_small(const float* h, int64_t T, int hc, int D, const float* fn, int n_mix, const float* base,
                    const float* scale, float eps, float hc_eps, int sinkhorn_iters, int mode, float* pre, float* post,
                    float* comb, void* workspace);
void hc_collapse(const float* h, const float* pre, int64_t T, int hc, int D, float* y);
void hc_expand(const float* y, const float* residual, const float* post, const float* comb, int64_t T, int hc, int D,
               float* out);
// Numerics::Fast: the same outputs bit for bit, four channels of every copy a thread (hc == 4, D % 4 == 0,
// 16-byte aligned rows; otherwise hc_expand).
void hc_expand_fast(const float* y, const float* residual, const float* post, const float* comb, int64_t T, int hc,
                    int D, float* out);
void hc_mean(const float* h, int64_t T, int hc, int D, float* y);
void embed(const void* table, bool bf16, const int32_t* ids, int64_t T, int hc, int D, float* h);
void gather_rows(const float* x, const int32_t* rows, int64_t n, int64_t row_len, float* y);
void gather_bytes(const void* x, const int32_t* rows, int64_t n, int64_t row_bytes, void* y);
void first_stream_mix(int64_t T, int hc, float* pre);

// ---- elementwise.cu
// Rotates values [offset, offset+dim) of each head (rows x heads, head stride hs, row stride rs).
void rope(float* x, int64_t rows, int heads, int64_t rs, int64_t hs, int offset, const int64_t* pos,
          const float* freqs, int dim, bool inverse);
// Quantise-dequantise the first n values of each row (stride rs) in blocks. kind 0: fp8 ue8m0, 1: fp4
// ue8m0, 2: fp4 e4m3 scales.
void qdq_rows(float* x, int64_t rows, int64_t rs, int n, int block, int kind);
// That kind for the values an entry of format f holds.
inline int qdq_kind(const EntryFormat& f) { return f.kind == kEntryFp8 ? 0 : f.kind == kEntryFp4Ue8m0 ? 1 : 2; }
// rope (rows of `heads` heads of hs floats, rs = heads x hs when the shapes do not allow one kernel) then, per head,
// qdq_rows of its first n dims: one launch, the same bits.
void rope_qdq(float* x, int64_t rows, int heads, int64_t rs, int64_t hs, int offset, const int64_t* pos,
              const float* freqs, int dim, bool inverse, int n, int block, int kind);
void hadamard_rows(float* x, int64_t rows, int64_t rs, int n);
// Unweighted per-head RMS norm in bf16 arithmetic, for rows x heads heads of width D.
void head_norm_bf16(float* x, int64_t n_heads, int D, float eps);
// ids[i] < 0 (other than INT32_MIN) is a deferred id: row -1 - ids[i] of src, read as src[row * stride].
void resolve_deferred_ids(int32_t* ids, int64_t n, const int32_t* src, int stride);

// ---- state_entries.cu: state entries in their packed formats (kv/entry_format.h)
// Row r of src [rows, f.dim] (QDQ'd values) encoded into the entry at dst[r]. A value the format cannot hold
// exactly (never for QDQ'd values) is counted in state_encode_failures().
void store_entries(const float* src, int64_t rows, const EntryFormat& f, uint8_t* const* dst);
// out[r, :] = the values of entry src[r] (fp32), for r < rows; null entries give zeros.
void load_entries(const uint8_t* const* src, int64_t rows, const EntryFormat& f, float* out);
// Entries that did not hold their values exactly since the last call (synchronises), and resets the count.
uint64_t state_encode_failures();
// The device counter behind state_encode_failures, for kernels elsewhere that encode entries (entry_store.cuh).
unsigned long long* state_encode_failure_counter();
// Makes random bytes valid entries of `f` (finite codes, moderate scales and bf16 values): entries
// [0, per_page) at `offset` of each of n_pages pages of page_bytes (the benchmark's synthetic state).
void sanitize_entries(uint8_t* pool, int64_t n_pages, int64_t page_bytes, int64_t offset, int per_page,
                      const EntryFormat& f);
void scale_round_bf16(float* x, int64_t n, float s);
// y[i] += x[i] for i < n.
void add(float* y, const float* x, int64_t n);
void fill_random_bf16(float* x, int64_t n, uint64_t seed);
// Programmatic dependent launch of the backend's kernels (pdl.cuh): on unless PEREGRINE_PDL=0; returns the old setting.
bool set_pdl(bool on);

// ---- attention_kernels.cu
// Compressor state machine of one sequence (see cpu attention.cpp run_compressor).
struct CompressorArgs {
    const float* kv = nullptr;     // [T, width] fp32 projections
    const float* score = nullptr;  // [T, width]
    const float* ape = nullptr;    // [ratio, width] or null
    int ratio = 0, d = 0, overlap = 0;
    float* state = nullptr;        // carry: kv slots then score slots
    float* pooled = nullptr;       // [n_emitted_total, d]
    int emit_base = 0;
    int64_t start_pos = 0;
    int n_tokens = 0, row0 = 0;
    float* const* snapshot = nullptr;  // per token of the sequence: page snapshot address or null
    float* const* step = nullptr;      // per token, as snapshot: a speculative step's carry slot after it, or null
    bool emit_at_row = false;  // each emission at pooled row row0 + i of the token that ends its group, zeros at
                               // the rows of the others (compressor_batch: every row of `pooled` written)
};
void compressor_seq(const CompressorArgs& a);
// Numerics::Fast: all sequences in one launch, parallel over channels (same arithmetic per channel).
// a.state: the sequences' carries back to back; a.snapshot and a.step: per token of every sequence; per-sequence
// fields of `a` are ignored: seq[6 s ..] = (start_pos, n_tokens, row0, emit_base, state offset in floats,
// first snapshot slot).
void compressor_batch(const CompressorArgs& a, int n_seqs, const int64_t* seq);
// The same results with the tokens in parallel too (prefill-sized steps): the emissions and every carry (page
// snapshots and the new carries) computed directly from the projections and the old carries. The jobs come from
// compressor_jobs on the host copies of `seq` and of the snapshot and step pointers (step may be null); emit:
// (sequence, position) per emission in pooled order; carry: (sequence, position) per carry to write, into dest
// (null: the sequence's new carry).
struct CompressorJobs {
    std::vector<int64_t> emit, carry;
    std::vector<float*> dest;
};
CompressorJobs compressor_jobs(const int64_t* seq, int n_seqs, int ratio, float* const* snapshot,
                               float* const* step = nullptr);
void compressor_parallel(const CompressorArgs& a, int n_seqs, const int64_t* seq, const int64_t* emit, int64_t n_emit,
                         const int64_t* carry, float* const* dest, int64_t n_carry);
// scores[t, j] for j < width[t] (j >= visible[t]: -inf); keys[keybase[t] + j] are indexer keys in format kf.
void index_scores(const float* iq, const float* wts, int64_t T, int nh, int hd, const int64_t* width,
                  const int64_t* visible, const int64_t* keybase, const uint8_t* const* keys, const EntryFormat& kf,
                  int64_t stride, float* scores);
// V4.1 level 1: per row, the best `topb` blocks of `bs` entries (the last visible block forced in) -> mask:
// one bit per block (bit b % 8 of byte b / 8 of the row's mask_stride bytes), set for the chosen blocks.
void candidate_blocks(const float* scores, int64_t T, int64_t stride, const int64_t* width, const int64_t* visible,
                      int bs, int topb, float* bscore, int32_t* bsel, int64_t bstride, uint8_t* mask,
                      int64_t mask_stride);
// scores[t, j] = -inf unless j < mask_width[t] and the bit of j's block (j / bs) is set.
void apply_candidates(float* scores, int64_t T, int64_t stride, const int64_t* width, const uint8_t* mask,
                      const int64_t* mask_width, int64_t mask_stride, int bs);
// Bytes per row of a candidate mask (whole 32-bit words).
inline int64_t candidate_mask_stride(int64_t width, int bs) { return ((width + bs - 1) / bs + 31) / 32 * 4; }
// Top-k of each row (ties to the lower index; radix select), descending or sorted by index; entries >=
// visible -> -1. tmp: [T, k]. count[t] = min(k, width[t]); out[t, count[t]..k) is left unwritten.
void topk_rows(const float* scores, int64_t T, int64_t stride, const int64_t* width, const int64_t* visible, int k,
               bool ascending, int32_t* tmp, int32_t* out, int32_t* count);
// keys[t, :] = first nwin[t] window addresses, then comp_addr[compbase[t] + sel[t, i]] for i < nsel[t]; with
// comp_rows, comp_rows + (compbase[t] + sel[t, i]) * row_bytes instead (entries decoded to rows of row_bytes).
void build_keys(int64_t T, const uint8_t* const* win, const int32_t* nwin, int W, const int32_t* sel,
                const int32_t* nsel, int kmax, const uint8_t* const* comp_addr, const int64_t* compbase,
                const uint8_t** keys, int32_t* nkeys, int maxk, const uint8_t* comp_rows = nullptr,
                int64_t row_bytes = 0);
// The key list of each query row for the attention kernels: keys[t * maxk + i] (null: masked) for
// i < nkeys[t]; the first nwin[t] are window entries (format win), the rest compressed entries (format comp).
// nwin null: every key is a window entry.
struct KeyRefs {
    const uint8_t* const* keys = nullptr;
    const int32_t* nkeys = nullptr;
    const int32_t* nwin = nullptr;
    int maxk = 0;
    EntryFormat win, comp;
};
// fast: the per-block softmax on a warp instead of one thread (same result).
void sparse_attention(const float* q, int64_t T, int H, int D, float scale, const float* sink, const KeyRefs& keys,
                      float* out, bool fast = false);

// ---- sparse_attention_mma.cu (Numerics::Fast): sparse_attention on the tensor cores (bf16 operands, exact for
// the bf16 queries and fp8/fp4-dequantised keys; fp32 sums in another order, see the file). Needs D == 512
// and H a multiple of 64. Few queries split their keys over several CTAs: that needs
// sparse_attention_mma_workspace() bytes of device memory (0: none).
// The key formats it reads directly: fp8 (codes in whole 32-value pieces, a scale per 8..512 values, bf16
// tail) and fp4 with 16- or 32-value scale blocks.
bool sparse_attention_mma_supported(int H, int D, const EntryFormat& win, const EntryFormat& comp);
size_t sparse_attention_mma_workspace(int64_t T, int H, int D, int maxk);
// With `rope` set, out's rows also get the inverse RoPE (rope(out, ..., inverse)): folded into the combine of split
// keys (decode sizes: one launch fewer), a rope launch after one split.
struct OutputRope {
    const int64_t* pos = nullptr;  // token t's position
    const float* freqs = nullptr;
    int dim = 0;  // the rotary dims: the last `dim` of each head
};
void sparse_attention_mma(const float* q, int64_t T, int H, int D, float scale, const float* sink,
                          const KeyRefs& keys, float* out, void* workspace, const OutputRope& rope = {});
// CTAs of 8 warps or 16 (half the accumulators a thread, twice the warps an SM switches between): the same
// outputs bit for bit. 0 (the default) picks 16 from 256 queries on; PEREGRINE_SPARSE_WARPS=8|16 fixes it at start.
void sparse_attention_mma_use_warps(int nw);
// ---- sparse_attention_wgmma.cu (Numerics::Fast, prefill-sized steps): sparse_attention over keys decoded to bf16
// rows beforehand (gather_keys_bf16: D values, 2 D bytes a row), on Hopper's warpgroup MMA, one CTA per query.
// keys[t * maxk + i] for i < nkeys[t]: a decoded row, null for a masked key. The numerics of sparse_attention_mma
// with one key split. Needs D == 512 and H a multiple of 64.
bool sparse_attention_rows_supported(int H, int D);
// Whether attention decodes its keys to rows for this kernel at prefill sizes (on unless PEREGRINE_SPARSE_KERNEL=mma
// at start: the mma.sync kernel on the packed entries, for A/B); the setter is for tests.
bool sparse_attention_rows_enabled();
void sparse_attention_rows_use(bool on);
void sparse_attention_rows(const float* q, int64_t T, int H, int D, float scale, const float* sink,
                           const uint8_t* const* keys, const int32_t* nkeys, int maxk, float* out);
// ---- paged_tables.cu (Numerics::Fast): entry addresses worked out on the device from the step's page tables
// (StateLayout::entry), so the host uploads page tables (one id per page) instead of one address per entry.
struct PagedSeqs {
    const int32_t* pages = nullptr;    // the step's page tables: rows of kPageTables ids, back to back
    const int64_t* seq = nullptr;      // per sequence [kSeqFields] (paged_address.h)
    const int32_t* row_seq = nullptr;  // per row: its sequence
    const int64_t* row_pos = nullptr;  // per row: its position
    const int64_t* carry = nullptr;    // per sequence: its compressor carry's device address (0: none)
    const int64_t* row_step = nullptr; // with carry, per row: a speculative step's carry slot after it (0: none)
    int n_seqs = 0, page_tokens = 0;
    int64_t page_bytes[kPageTables] = {};  // a page of each table
};
// Rows a kernel stores itself into their entries of `sec` at their positions, as paged_store_entries with ratio 1
// (the window's K=V; rms_norm_rope_qdq).
struct PagedRowStore {
    EntryFormat f;
    PagedSeqs p;
    PagedSection sec;
};
// Decode-form steps (attention_decode.cpp: a few tokens per sequence, each sequence's rows together, in sequence
// order; a decode step's row t is sequence t), per row for a layer of `ratio`: what the host lists for other steps,
// worked out from the step's page tables.
struct DecodeRows {
    int64_t* width = nullptr;     // [T] (pos + 1) / ratio: the row's compressed entries, all visible
    int64_t* base = nullptr;      // [T] s * cap: the first slot of the row's sequence s in tables cap wide
    int64_t* seq_base = nullptr;  // [T] s * cap for sequence s (the first n_seqs)
    int32_t* rows = nullptr;      // [T] t
    int64_t* gpos = nullptr;      // [T] (pos / ratio) * ratio: the first position of the row's group
    // With a carry offset: compressor_batch's per-sequence fields [6 n_seqs] (emissions at their rows: emit_at_row)
    // with offsets from state_base, and per row its page snapshot address (where it ends a page) and its speculative
    // carry slot (PagedSeqs::row_step), or null.
    int64_t* meta = nullptr;
    float** snap = nullptr;
    float** step = nullptr;
};
void paged_decode_rows(const PagedSeqs& p, int64_t T, int ratio, int64_t cap, int64_t carry_offset,
                       int64_t snapshot_offset, const float* state_base, const DecodeRows& out);
// table[seq_base[s] + j] = address of entry j of sequence s for j < (start_pos + n_tokens) / ratio (sequences
// with no tokens this step are skipped); max_entries bounds those counts.
void paged_entry_table(const PagedSeqs& p, const PagedSection& sec, int ratio, const int64_t* seq_base,
                       int64_t max_entries, const uint8_t** table);
// Per row: its window keys' addresses in window_list's order (null: none; nulls beyond the count too) and
// their count, for T rows and a window of W.
void paged_window_table(const PagedSeqs& p, const PagedSection& sec, int64_t T, int W, bool ring_before_full,
                        const uint8_t** win, int32_t* nwin);
// The window entries a step's rows can see, per sequence s the positions lo_s = max(0, start_pos - W + 1) up to
// the step's end, back to back from row_base[s]: table[row_base[s] + j] = address of position lo_s + j;
// max_entries bounds the per-sequence counts.
void paged_window_rows(const PagedSeqs& p, const PagedSection& sec, int W, const int64_t* row_base,
                       int64_t max_entries, const uint8_t** table);
// paged_window_table's list with each position's row of `rows` (paged_window_rows' order, decoded into rows of
// row_bytes) instead of its state entry.
void paged_window_rows_table(const PagedSeqs& p, int64_t T, int W, bool ring_before_full, const int64_t* row_base,
                             const uint8_t* rows, int64_t row_bytes, const uint8_t** win, int32_t* nwin);
// A drafter's key lists (CudaBackend::draft_attention), N sequences' blocks of B rows of which the last R query:
// the step's row j is sequence j at its last stored position pos; list j * R + r (block row i = B - R + r) holds the
// window entries of `sec` at draft_window_keys(pos, pos + 1 + i, W, floor, chain), then the block's rows
// 0 .. (chain ? i : B - 1) (`block`, entry_bytes apart, sequence j's from row j * B), null-padded to maxk
// (min(W, max pos + 1) + B bounds every list); nkeys its count.
void paged_draft_keys(const PagedSeqs& p, const PagedSection& sec, int N, int B, int R, int W, bool chain,
                      const uint8_t* block, int64_t entry_bytes, int maxk, const uint8_t** keys, int32_t* nkeys);
// Row t of src [T, f.dim] encoded into entry row_pos[t] of `sec` of its sequence (StateLayout::entry(.., pos));
// with ratio > 1 only the rows that end a group (pos + 1 a multiple of ratio), into entry pos / ratio. In
// state_entries.cu.
void paged_store_entries(const float* src, int64_t T, const EntryFormat& f, const PagedSeqs& p,
                         const PagedSection& sec, int ratio = 1);
// V4 HCA's selection, as the host lists it: per row count[t] (a one-shot prefill: (start_pos + n_tokens) /
// ratio, else (pos + 1) / ratio) and list[t, j] = j if visible else -1, padded with -1 to kmax.
void paged_all_entries(const PagedSeqs& p, int ratio, int64_t T, int kmax, int32_t* list, int32_t* counts);

// ---- index_fast.cu (Numerics::Fast; same contracts as the exact kernels above, see the file for the sums)
bool index_scores_stream_supported(int nh, int hd);
// Rows row_list[0..n_rows) (null: rows 0..n_rows) against their keys, one thread per (row, key).
void index_scores_stream(const float* iq, const float* wts, const int32_t* row_list, int n_rows, int nh, int hd,
                         const int64_t* width, const int64_t* visible, const int64_t* keybase,
                         const uint8_t* const* keys, const EntryFormat& kf, int64_t stride, float* scores);
// The fp4 indexer keys of 128 values (the release's format) score on the tensor cores, a CTA per query row with its
// heads as the mma's M (default), or on the CUDA cores (false; PEREGRINE_INDEX_DECODE=stream): within a bf16 step.
void index_scores_decode_use_mma(bool on);
bool index_scores_mma_supported(int nh, int hd);
// Tensor-core scoring of query tiles that share their keys: tiles [n_tiles][4] int64 = (first row, rows
// <= 64, first key in kb, keys of the sequence); qb bf16 [T, nh, 128]; kb bf16 [*, 128].
// Runs index_wgmma.cu's wgmma kernel (the default; `PEREGRINE_INDEX_GEMM=mma` or a test picks mma.sync).
void index_scores_mma(const uint16_t* qb, const float* wts, int nh, const int64_t* tiles, int n_tiles,
                      const uint16_t* kb, const int64_t* visible, int64_t stride, float* scores);
void index_scores_use_wgmma(bool on);
bool index_scores_wgmma_supported(int nh, int hd);
void index_scores_wgmma(const uint16_t* qb, const float* wts, int nh, const int64_t* tiles, int n_tiles,
                        const uint16_t* kb, const int64_t* visible, int64_t stride, float* scores);
void to_bf16(const float* x, int64_t n, uint16_t* y);
// out[i, :] = bf16 of the values of entry keys[i] (format kf, kf.dim values) for i < n.
void gather_keys_bf16(const uint8_t* const* keys, int64_t n, const EntryFormat& kf, uint16_t* out);
void topk_rows_fast(const float* scores, int64_t T, int64_t stride, const int64_t* width, const int64_t* visible,
                    int k, bool ascending, int32_t* tmp, int32_t* out, int32_t* count);
void candidate_blocks_fast(const float* scores, int64_t T, int64_t stride, const int64_t* width,
                           const int64_t* visible, int bs, int topb, float* bscore, int32_t* bsel, int64_t bstride,
                           uint8_t* mask, int64_t mask_stride);

// ---- moe_kernels.cu
// route_norm: RouteNorm (ops/model_format.h).
void route(const float* logits, int64_t T, int E, int K, int score_func, const float* bias, const int64_t* tid2eid,
           const int32_t* ids, int route_norm, float route_scale, bool balanced, int32_t* sel, float* wsel);
// Numerics::Fast: one warp per token, same selection and weights as route.
void route_fast(const float* logits, int64_t T, int E, int K, int score_func, const float* bias,
                const int64_t* tid2eid, const int32_t* ids, int route_norm, float route_scale, bool balanced,
                int32_t* sel, float* wsel);
void gather_pairs(const float* x, int64_t T, int K, int D, float* xp);
void swiglu(const float* g, const float* u, int64_t n, int I, const float* weights, float limit, float* out);
void moe_combine(const float* ye, const int32_t* sel, const float* shared, int64_t T, int K, int D, float* out);

// ---- engram_kernels.cu
// Row ids [T, (max_ngram - 1) * n_heads] from windows [T, max_ngram] of token ids (INT32_MIN before the sequence:
// the pad id; ids outside the map: the pad id too, the host checks them), hashed as ops/engram_hash_math.h.
void engram_hash_rows(const int32_t* windows, int64_t T, int max_ngram, int n_heads, const int32_t* token_map,
                      int64_t map_size, int64_t pad, const int64_t* mult, const int64_t* primes, const int64_t* offsets,
                      int64_t* rows);
void engram_gather(const uint8_t* table, const uint8_t* scale, const int64_t* rows, int64_t n, int hd, float* emb);
void engram_gate(float* h, const float* kv, const float* wgt, int64_t T, int hc, int D, float eps);

}  // namespace peregrine::cuda
