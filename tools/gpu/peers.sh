#!/usr/bin/env bash
# The peers beside our kernels on the GPU machine, in one run (bench/peers; built by bench/peers/build.sh and
# carried): SGLang's DeepGEMM block-32 dense FP8 GEMM and cuBLAS's bf16 GEMM at V4.1-Flash's dense shapes, M=16384,
# L2 flushed before each timing; then our shipped prefill linears at the same shapes (test_cuda_gemm's throughput
# lines: the activations' bf16 image and cuBLAS on the cached weight image, no flush); DeepInfer's DeepGEMM FP8
# MQA-logits kernels beside our indexer scorers (both in the harness, decode and prefill, L2 flushed); its grouped
# FP8 GEMMs (128-wide scales) at the routed experts' shapes, contiguous (prefill) and masked (decode), beside our
# FP4 grouped experts at the prefill shapes (test_cuda_gemm's experts lines); SGLang's sm90 FP8 MegaMoE (a whole
# routed-expert pass in one kernel) beside our routed path at 16-8192 tokens on 96 experts; FlashInfer's sm90 MXFP4
# MoE GEMMs (W4A16 and W4A8) beside our routed FP4 experts at the grouped shapes.
#
#   tools/gpu/peers.sh BIN_DIR PEERS_DIR OUT_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=$1 peers=$2 out=$3
mkdir -p "$out"
[[ -d $bin/lib ]] && export LD_LIBRARY_PATH=$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PEREGRINE_TEST_DATA_DIR=$here/tests/fixtures
echo "== sgl-deep-gemm sm90_fp8_gemm_1d2d (block 32) and cuBLAS bf16"
"$peers/deepgemm_dense" --json "$out/peers_dense.json" | tee "$out/peers_dense.txt"
echo "== ours: the prefill linears as shipped"
"$bin/test_cuda_gemm" --gtest_filter='CudaGemm.FastPathThroughputAtPrefillSize' --gtest_color=no 2>&1 |
  grep "PARITY gemm" >"$out/ours_gemm.txt"
grep -v experts "$out/ours_gemm.txt" | tee "$out/ours_dense.txt"
echo "== deepinfer-gemm sm90_fp8_paged_mqa_logits / sm90_fp8_mqa_logits and our indexer scorers"
"$peers/deepinfer_indexer" --json "$out/peers_indexer.json" | tee "$out/peers_indexer.txt"
echo "== deepinfer-gemm sm90_fp8_gemm_1d2d grouped (contiguous, masked) and our routed FP4 experts"
"$peers/deepinfer_grouped" --json "$out/peers_grouped.json" | tee "$out/peers_grouped.txt"
grep experts "$out/ours_gemm.txt" | tee "$out/ours_experts.txt"
echo "== sgl-deep-gemm sm90_fp8_mega_moe and our routed experts (a whole routed pass)"
timeout 300 "$peers/sgl_megamoe" --json "$out/peers_megamoe.json" | tee "$out/peers_megamoe.txt"
echo "== flashinfer-python sm90 mixed-input MoE GEMM (MXFP4; W4A16, W4A8) and our routed FP4 experts"
timeout 480 "$peers/flashinfer_moe" --json "$out/peers_flashinfer.json" | tee "$out/peers_flashinfer.txt"
