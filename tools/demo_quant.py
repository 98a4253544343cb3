"""Quantisation primitives of the released DeepSeek-V4 checkpoints, in torch (any device).

Activation side (what the official kernels do before every FP8/FP4 GEMM and on the KV caches):
power-of-two (ue8m0) scales computed from the IEEE bits, e4m3 round-to-nearest-even with saturation,
e2m1 round-to-nearest with ties to the even code. Weight side: the checkpoint encodings (FP8 e4m3 with
one ue8m0 scale per 128x128 block, FP4 e2m1 packed two per byte with one ue8m0 scale per 32 inputs).
"""
import torch

FP8_MAX = 448.0
FP4_MAX = 6.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between consecutive e2m1 magnitudes; at an exact tie the upper code wins when it is even.
_E2M1_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_TIE_UP = (False, True, False, True, False, True, False)


def pow2_scale(amax: torch.Tensor, max_value: float) -> torch.Tensor:
    """2^ceil(log2(amax * fp32(1/max_value))) from the exponent and mantissa bits (the kernels' rounding)."""
    inv = torch.tensor(1.0 / max_value, dtype=torch.float32, device=amax.device)
    bits = (amax.float() * inv).contiguous().view(torch.int32)
    log2_ceil = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return ((log2_ceil + 127) << 23).view(torch.float32)


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> nearest e4m3 value (as fp32), saturating at +-448."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """fp32 in [-6, 6] -> 4-bit codes (bit 3 = sign), nearest with ties to the even code."""
    mids = torch.tensor(_E2M1_MIDS, dtype=torch.float32, device=x.device)
    tie_up = torch.tensor(_E2M1_TIE_UP, device=x.device)
    mag = x.abs().unsqueeze(-1)
    code = (mag > mids).sum(-1) + ((mag == mids) & tie_up).sum(-1)
    return code.to(torch.uint8) | (torch.signbit(x).to(torch.uint8) << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=codes.device)
    table = torch.cat([grid, -grid])
    return table[codes.long() & 0xF]


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    return e2m1_values(e2m1_codes(x))


# ---------------------------------------------------------------- activations (official act_quant family)

def act_quant(x: torch.Tensor, block: int = 128):
    """bf16 values [..., K] -> (e4m3 values as fp32 [..., K], ue8m0 scales fp32 [..., K/block]); amax floor 1e-4."""
    g = x.float().unflatten(-1, (-1, block))
    s = pow2_scale(g.abs().amax(-1).clamp_min(1e-4), FP8_MAX)
    q = round_e4m3(g / s.unsqueeze(-1))
    return q.flatten(-2), s


def qdq_fp8(x: torch.Tensor, block: int) -> torch.Tensor:
    """Quantise-dequantise to e4m3 with ue8m0 scales per block, result rounded to bf16 (KV QAT)."""
    q, s = act_quant(x, block)
    return (q.unflatten(-1, (-1, block)) * s.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)


def qdq_fp4_ue8m0(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """e2m1 with power-of-two scales per block (indexer q/k), amax floor 6*2^-126, result bf16."""
    g = x.float().unflatten(-1, (-1, block))
    s = pow2_scale(g.abs().amax(-1).clamp_min(6 * 2.0 ** -126), FP4_MAX).unsqueeze(-1)
    return (round_e2m1((g / s).clamp(-FP4_MAX, FP4_MAX)) * s).flatten(-2).to(torch.bfloat16)


# ---------------------------------------------------------------- weights (checkpoint encodings)

def quantize_fp8_block(w: torch.Tensor, block: int = 128):
    """fp32 [out, in] -> (e4m3 tensor [out, in], e8m0 scale tensor [ceil(out/block), ceil(in/block)])."""
    out_f, in_f = w.shape
    pr, pc = -out_f % block, -in_f % block
    wp = torch.nn.functional.pad(w.float(), (0, pc, 0, pr))
    g = wp.view(wp.size(0) // block, block, wp.size(1) // block, block)
    s = pow2_scale(g.abs().amax(dim=(1, 3)).clamp_min(1e-30), FP8_MAX)
    q = (g / s[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).view_as(wp)[:out_f, :in_f]
    return q.to(torch.float8_e4m3fn), scale_to_e8m0(s)


def quantize_fp4_rows(w: torch.Tensor, block: int = 32):
    """fp32 [out, in] -> (int8 [out, in/2], low nibble = even column; e8m0 scales [out, in/32])."""
    g = w.float().unflatten(-1, (-1, block))
    s = pow2_scale(g.abs().amax(-1).clamp_min(1e-30), FP4_MAX)
    codes = e2m1_codes((g / s.unsqueeze(-1)).clamp(-FP4_MAX, FP4_MAX)).flatten(-2)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.view(torch.int8), scale_to_e8m0(s)


def scale_to_e8m0(s: torch.Tensor) -> torch.Tensor:
    bits = s.float().contiguous().view(torch.int32)
    return ((bits >> 23) & 0xFF).to(torch.uint8).view(torch.float8_e8m0fnu)


def e8m0_to_f32(s: torch.Tensor) -> torch.Tensor:
    b = s.view(torch.uint8).to(torch.int32)
    return torch.ldexp(torch.ones_like(b, dtype=torch.float32), b - 127)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """int8 [out, in/2] -> e2m1 values fp32 [out, in] (low nibble = even column)."""
    b = packed.view(torch.uint8)
    return torch.stack([e2m1_values(b & 0xF), e2m1_values(b >> 4)], dim=-1).flatten(-2)


def dequant_fp8_block(q: torch.Tensor, s: torch.Tensor, block: int = 128) -> torch.Tensor:
    out_f, in_f = q.shape
    sf = e8m0_to_f32(s).repeat_interleave(block, 0)[:out_f].repeat_interleave(block, 1)[:, :in_f]
    return q.float() * sf


def dequant_fp4_rows(packed: torch.Tensor, s: torch.Tensor, block: int = 32) -> torch.Tensor:
    return unpack_fp4(packed) * e8m0_to_f32(s).repeat_interleave(block, 1)


# ---------------------------------------------------------------- straight-through fake quantisation (training)

def _ste(x: torch.Tensor, xq: torch.Tensor) -> torch.Tensor:
    return x + (xq.to(x.dtype) - x).detach()


def fake_fp8_weight(w: torch.Tensor, block: int = 128) -> torch.Tensor:
    """block: the weight scale tile (128 in V4, 32 in V4.1)."""
    with torch.no_grad():
        q, s = quantize_fp8_block(w.detach(), block)
        wq = dequant_fp8_block(q, s, block)
    return _ste(w, wq)


def fake_fp4_weight(w: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        q, s = quantize_fp4_rows(w.detach())
        wq = dequant_fp4_rows(q, s)
    return _ste(w, wq)


def fake_act(x: torch.Tensor, block: int = 128) -> torch.Tensor:
    with torch.no_grad():
        xq = qdq_fp8(x.detach().to(torch.bfloat16), block)
    return _ste(x, xq)


def fake_fp4_act(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    with torch.no_grad():
        xq = qdq_fp4_ue8m0(x.detach().to(torch.bfloat16), block)
    return _ste(x, xq)
