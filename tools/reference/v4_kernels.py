"""Torch (CPU) port of the six kernels the official DeepSeek-V4 inference/model.py imports
from its tilelang `kernel.py`, plus a `hadamard_transform` shim.

Written from kernel_tilelang.py's semantics with "canonical block partials": each per-block
dot product (fp8 x fp8 K-block of 128, fp4 x fp8 K-block of 32, bf16 q.k and p.v blocks of
sparse_attn) is evaluated exactly in float64 and rounded ONCE to fp32; block partials are
then scaled and accumulated in fp32 in K order, as the tilelang kernels do.

Usage: put this file's directory on sys.path ahead of model.py's and import it as `kernel`
(run_official_v4.py does that), or `import v4_kernels as kernel`.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import demo_quant as dq  # noqa: E402  (the e4m3 / e2m1 / ue8m0 arithmetic the demo model's tools share)
from demo_model import sinkhorn_split  # noqa: E402

FP8_MAX = dq.FP8_MAX
FP4_MAX = dq.FP4_MAX
F32 = torch.float32
F64 = torch.float64


def act_quant(x, block_size=128, scale_fmt=None, scale_dtype=F32, inplace=False):
    """Block-wise e4m3 quantisation along the last dim (amax floor 1e-4; ue8m0 scale if scale_fmt)."""
    N = x.size(-1)
    assert N % block_size == 0
    xf = x.float().unflatten(-1, (N // block_size, block_size))
    amax = xf.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    if scale_fmt is not None:
        s = dq.pow2_scale(amax, FP8_MAX)
    else:
        s = amax * torch.tensor(1.0 / FP8_MAX, dtype=F32)
    q = (xf / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    if inplace:
        y = (q.float() * s).flatten(-2).to(x.dtype)
        x.copy_(y)
        return x
    return q.flatten(-2), s.squeeze(-1).to(scale_dtype)


def fp4_act_quant(x, block_size=32, inplace=False):
    """Block-wise e2m1 quantisation (ue8m0 scale, amax floor 6*2^-126). Only inplace (QDQ) is used by model.py."""
    N = x.size(-1)
    assert N % block_size == 0
    xf = x.float().unflatten(-1, (N // block_size, block_size))
    amax = xf.abs().amax(-1, keepdim=True).clamp_min(6 * 2.0 ** -126)
    s = dq.pow2_scale(amax, FP4_MAX)
    q = dq.round_e2m1((xf / s).clamp(-FP4_MAX, FP4_MAX))
    if inplace:
        x.copy_((q * s).flatten(-2).to(x.dtype))
        return x
    raise NotImplementedError("fp4_act_quant non-inplace is not used by model.py")


def _block_gemm(a64, b64, kb):
    """a64 [M,K], b64 [N,K] float64 (exact values); returns [nb, M, N] fp32 block partials,
    each the exactly rounded fp32 of the exact block dot product."""
    M, K = a64.shape
    N = b64.shape[0]
    nb = K // kb
    a = a64.view(M, nb, kb).transpose(0, 1)          # [nb, M, kb]
    b = b64.view(N, nb, kb).permute(1, 2, 0)         # [nb, kb, N]
    return torch.bmm(a, b).to(F32)                   # float64 exact for these sizes -> one rounding


def fp8_gemm(a, a_s, b, b_s, scale_dtype=F32):
    """C = A_fp8 @ B_fp8^T; K blocks of 128: acc += partial * (sa * sb) in fp32, K order. Output default dtype."""
    K = a.size(-1)
    M = a.numel() // K
    N = b.size(0)
    A = a.reshape(M, K).to(F64)
    B = b.to(F64)
    part = _block_gemm(A, B, 128)                    # [nb, M, N]
    sa = a_s.reshape(M, -1).float()                  # [M, nb]
    sb = b_s.float()                                 # [ceil(N/128), nb]
    sb = sb.repeat_interleave(128, 0)[:N]            # [N, nb]
    acc = torch.zeros(M, N, dtype=F32)
    for k in range(part.shape[0]):
        sc = sa[:, k:k + 1] * sb[:, k][None, :]      # Scale_C = sa * sb (fp32)
        acc = acc + part[k] * sc
    return acc.to(torch.get_default_dtype()).view(*a.shape[:-1], N)


def fp4_gemm(a, a_s, b, b_s, scale_dtype=F32):
    """C = A_fp8 @ B_fp4^T; K blocks of 32: acc += partial * sa[k//4] * sb[:,k] in fp32, K order."""
    K = a.size(-1)
    M = a.numel() // K
    N = b.size(0)
    A = a.reshape(M, K).to(F64)
    B = dq.unpack_fp4(b).to(F64)
    part = _block_gemm(A, B, 32)                     # [K/32, M, N]
    sa = a_s.reshape(M, -1).float()
    sb = b_s.float()                                 # [N, K/32]
    acc = torch.zeros(M, N, dtype=F32)
    for k in range(part.shape[0]):
        acc = acc + (part[k] * sa[:, k // 4: k // 4 + 1]) * sb[:, k][None, :]
    return acc.to(torch.get_default_dtype()).view(*a.shape[:-1], N)


def sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
    """q [b,m,h,d] bf16, kv [b,n,d] bf16, topk_idxs [b,m,topk] int (-1 = none).
    Online softmax over blocks of 64 indices (running max from -inf), exact q.k and p.v block
    partials rounded to fp32, probabilities cast to bf16 before PV, sink added unscaled at the end."""
    b, m, h, d = q.shape
    topk = topk_idxs.size(-1)
    block = 64
    nblk = (topk + block - 1) // block
    scale = torch.tensor(softmax_scale, dtype=F32)
    out = torch.empty(b, m, h, d, dtype=q.dtype)
    q64 = q.to(F64)
    for bi in range(b):
        acc_o = torch.zeros(m, h, d, dtype=F32)
        sum_exp = torch.zeros(m, h, dtype=F32)
        smax = torch.full((m, h), float("-inf"), dtype=F32)
        for t in range(nblk):
            idx = topk_idxs[bi, :, t * block:(t + 1) * block].long()          # [m, blk]
            if idx.size(1) < block:
                idx = torch.cat([idx, idx.new_full((m, block - idx.size(1)), -1)], 1)
            valid = idx != -1
            kvb = kv[bi][idx.clamp_min(0)].to(F64) * valid[..., None]          # [m, blk, d]
            s = torch.einsum("mhd,mjd->mhj", q64[bi], kvb).to(F32)             # exact -> fp32
            s = torch.where(valid[:, None, :], s, torch.tensor(float("-inf")))
            s = s * scale
            prev = smax
            smax = torch.maximum(prev, s.amax(-1))
            sc = torch.exp(prev - smax)
            p = torch.exp(s - smax[..., None])
            ssum = p.to(F64).sum(-1).to(F32)  # the block sum exactly, rounded once
            sum_exp = sum_exp * sc + ssum
            pb = p.to(torch.bfloat16).to(F64)
            pv = torch.einsum("mhj,mjd->mhd", pb, kvb).to(F32)                 # exact -> fp32
            acc_o = acc_o * sc[..., None] + pv
        sum_exp = sum_exp + torch.exp(attn_sink.float()[None, :] - smax)
        out[bi] = (acc_o / sum_exp[..., None]).to(q.dtype)
    return out


def hc_split_sinkhorn(mixes, hc_scale, hc_base, hc_mult=4, sinkhorn_iters=20, eps=1e-6):
    """pre/post sigmoids and the Sinkhorn-normalised comb matrix, fp32, kernel op order."""
    return sinkhorn_split(mixes.float(), hc_scale, hc_base, hc_mult, sinkhorn_iters, eps)


def hadamard_transform(x, scale=1.0):
    """fast_hadamard_transform shim: natural-order Walsh-Hadamard evaluated exactly (float64),
    rounded to fp32, times scale (fp32), cast to x.dtype."""
    d = x.size(-1)
    assert d & (d - 1) == 0
    y = x.to(F64).reshape(-1, d)
    h = 1
    while h < d:
        y = y.view(-1, d // (2 * h), 2, h)
        y = torch.stack([y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]], 2)
        h *= 2
    y = y.reshape(x.shape).to(F32) * torch.tensor(scale, dtype=F32)
    return y.to(x.dtype)
