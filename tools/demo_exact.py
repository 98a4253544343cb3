"""Engine-exact evaluation of a DeepSeek-V4-Flash checkpoint (released encoding) in torch.

Follows the dtype flow of DeepSeek's official V4 inference code (`inference/model.py` with its kernels)
for a one-shot prefill at start_pos 0, batch rows independent:
- bf16 activations and residual between sublayers; mHC mixing, Sinkhorn, router, compressor pooling and
  the head in fp32; RMSNorm in fp32 with the result cast back to bf16.
- Before every FP8/FP4 GEMM the input is quantised per 128 values to e4m3 with a ue8m0 scale; the GEMM
  sums each K block (128 for FP8 weights with 128x128 scales, 32 for FP4 experts with 1x32 scales) exactly,
  rounds it once to fp32, scales it and accumulates the blocks in fp32 in K order; output bf16.
- `wo_a` runs in bf16 on its dequantised weights (grouped); `weights_proj` is a bf16 GEMM.
- Per-head unweighted q RMS norm in bf16 arithmetic (as model.py writes it).
- Window K=V: kv_norm, RoPE, e4m3 QDQ (block 64, ue8m0) of the non-rope dims. Compressed KV: same QDQ.
  Indexer: RoPE, Walsh-Hadamard rotation (x 128^-0.5), e2m1 QDQ (block 32, ue8m0) of q and k.
- Index scores in bf16 (score -> bf16, ReLU, x head weight -> bf16, head sum -> bf16); top-k and router
  top-k are stable descending sorts (ties: lower index first); CSA entries are attended in that order.
- sparse attention: online softmax over blocks of 64 indices, running max from -inf, probabilities
  rounded to bf16 before P.V, sink added unscaled to the denominator; output bf16.
The kernels' dot products (FP8/FP4 GEMM blocks, sparse-attention q.k and p.v, Hadamard) are evaluated exactly
(float64) and rounded once to fp32, as the canonical port of the official kernels that produced the fixtures'
goldens does; the GEMMs model.py issues itself (fp32 F.linear of mHC, compressor, router and head; bf16
weights_proj, index scores and wo_a) are the same torch calls on the same shapes by default (`native_ops`), so
on the golden's device they round as the golden did; with native_ops off they are evaluated exactly too. Decoding is defined as re-running the prefill (the official decode
path equals its prefill row for row).
"""
import torch
import torch.nn.functional as F
from safetensors import safe_open

import demo_quant as dq
from demo_model import DemoConfig, hadamard_matrix, rope_tables, sinkhorn_split, stable_topk

BF16 = torch.bfloat16


def exact_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [..., K] @ b[N, K]^T evaluated in float64 (exact for these operand widths), rounded to fp32."""
    return torch.matmul(a.double(), b.double().t()).float()


def load_safetensors(path: str, device="cpu") -> dict:
    out = {}
    with safe_open(path, framework="pt") as f:
        for k in f.keys():
            out[k] = f.get_tensor(k).to(device)
    return out


class ExactV4:
    def __init__(self, cfg: DemoConfig, tensors: dict, device="cpu", native_ops: bool = True):
        self.cfg, self.dev, self.native_ops = cfg, torch.device(device), native_ops
        if self.dev.type == "cuda":  # the settings of the official golden runs: full fp32 / bf16 GEMM accumulation
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        self.w = {}
        dev = self.dev
        for name, t in tensors.items():  # decoded on the CPU, moved as float tensors
            t = t.cpu()
            if name.endswith(".scale"):
                continue
            base = name[:-len(".weight")] if name.endswith(".weight") else None
            if t.dtype == torch.float8_e4m3fn:
                raw_s = tensors[base + ".scale"].cpu()
                if name.endswith("wo_a.weight"):  # dequantised to bf16 at load, as the official convert/load do
                    self.w[name] = dq.dequant_fp8_block(t, raw_s).to(BF16).to(dev)
                else:
                    s = dq.e8m0_to_f32(raw_s).repeat_interleave(128, 0)[:t.size(0)]
                    self.w[name] = ("fp8", t.double().to(dev), s.to(dev))
            elif t.dtype == torch.int8 and name.endswith(".weight"):
                s = dq.e8m0_to_f32(tensors[base + ".scale"].cpu())
                self.w[name] = ("fp4", dq.unpack_fp4(t).double().to(dev), s.to(dev))
            else:
                self.w[name] = t.to(dev)
        self.hmat = hadamard_matrix(cfg.index_head_dim, self.dev).double()
        self._rope = {}
        self.pos0 = 0  # position of the first row (the engine keeps the MTP layer one position on)

    # ------------------------------------------------------------ primitives
    def mm(self, x, w):
        """A GEMM that model.py itself issues (F.linear in the operands' dtype): the same torch call by default,
        so that on the device of a golden run it rounds like it; exactly evaluated when native_ops is off."""
        return F.linear(x, w) if self.native_ops else exact_dot(x, w).to(x.dtype)

    def einsum(self, eq, a, b):
        if self.native_ops:
            return torch.einsum(eq, a, b)
        return torch.einsum(eq, a.double(), b.double()).float().to(a.dtype)

    def rope(self, ratio: int, s: int):
        key = (bool(ratio), s)
        if key not in self._rope:
            self._rope[key] = rope_tables(self.cfg, ratio, s, self.dev)
        return self._rope[key]

    def f32(self, name):
        return self.w[name].float()

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        w = self.w[name + ".weight"]
        if isinstance(w, tuple):
            kind, codes, srow = w
            K = x.size(-1)
            q, s = dq.act_quant(x.to(BF16), 128)
            lead = q.shape[:-1]
            q2, s2 = q.reshape(-1, K).double(), s.reshape(-1, K // 128)
            acc = torch.zeros(q2.size(0), codes.size(0), dtype=torch.float32, device=self.dev)
            kb = 128 if kind == "fp8" else 32
            for k in range(K // kb):
                sl = slice(k * kb, (k + 1) * kb)
                part = torch.matmul(q2[:, sl], codes[:, sl].t()).float()
                acc = acc + part * s2[:, (k * kb) // 128:(k * kb) // 128 + 1] * srow[:, k]
            return acc.to(BF16).view(*lead, codes.size(0))
        return self.mm(x, w).to(BF16)  # bf16 GEMM, bf16 out

    def rmsnorm(self, x, name):
        xf = x.float()
        y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.cfg.norm_eps)
        return (self.f32(name) * y).to(x.dtype)

    def rope_part(self, x, cos, sin, inverse=False):
        """RoPE on the last rope_head_dim dims as model.py applies it: complex64 product, result in x's dtype."""
        rd = self.cfg.rope_head_dim
        cis = torch.complex(cos, sin)
        if inverse:
            cis = cis.conj()
        shape = [1, cis.size(0)] + [1] * (x.dim() - 3) + [cis.size(1)]
        xc = torch.view_as_complex(x[..., -rd:].float().unflatten(-1, (-1, 2)).contiguous())
        r = torch.view_as_real(xc * cis.view(shape)).flatten(-2).to(x.dtype)
        return torch.cat([x[..., :-rd], r], -1)

    def hadamard(self, x):
        y = torch.matmul(x.double(), self.hmat).float()
        return (y * torch.tensor(x.size(-1) ** -0.5, dtype=torch.float32, device=self.dev)).to(BF16)

    # ------------------------------------------------------------ attention
    def compressor(self, p, x, ratio, d, rotate, cos, sin):
        b, s, _ = x.shape
        n = s // ratio
        if n == 0:
            return None
        xf = x.float()
        kv = self.mm(xf, self.f32(p + "wkv.weight"))[:, :n * ratio].unflatten(1, (n, ratio))
        sc = self.mm(xf, self.f32(p + "wgate.weight"))[:, :n * ratio].unflatten(1, (n, ratio)) + self.w[p + "ape"]
        if ratio == 4:
            kv_a = F.pad(kv[:, :-1, :, :d], (0, 0, 0, 0, 1, 0))
            sc_a = F.pad(sc[:, :-1, :, :d], (0, 0, 0, 0, 1, 0), value=float("-inf"))
            kv = torch.cat([kv_a, kv[..., d:]], dim=2)
            sc = torch.cat([sc_a, sc[..., d:]], dim=2)
        c = (kv * sc.softmax(dim=2)).sum(dim=2)
        c = self.rmsnorm(c.to(BF16), p + "norm.weight")
        c = self.rope_part(c, cos[0:n * ratio:ratio], sin[0:n * ratio:ratio])
        rd = self.cfg.rope_head_dim
        if rotate:
            return dq.qdq_fp4_ue8m0(self.hadamard(c), 32)
        return torch.cat([dq.qdq_fp8(c[..., :-rd], 64), c[..., -rd:]], -1)

    def indexer(self, p, x, qr, cos, sin, offset):
        cfg = self.cfg
        b, s, _ = x.shape
        Hi, Di = cfg.index_n_heads, cfg.index_head_dim
        q = self.linear(p + "wq_b", qr).unflatten(-1, (Hi, Di))
        q = self.rope_part(q, cos[:s], sin[:s])
        q = dq.qdq_fp4_ue8m0(self.hadamard(q), 32)
        kc = self.compressor(p + "compressor.", x, 4, Di, True, cos, sin)
        if kc is None:  # no complete window yet: nothing to select
            return torch.empty(b, s, 0, dtype=torch.long, device=self.dev)
        w = self.linear(p + "weights_proj", x)
        w = (w.float() * torch.tensor(Di ** -0.5 * Hi ** -0.5, dtype=torch.float32, device=self.dev)).to(BF16)
        sc = self.einsum("bshd,btd->bsht", q, kc).to(BF16)
        if self.native_ops:  # bf16 tensor ops as model.py writes them
            score = (sc.relu() * w.unsqueeze(-1)).sum(dim=2).float()
        else:  # each product rounded to bf16, head sum in fp32 rounded once
            sc = (sc.relu().float() * w.float().unsqueeze(-1)).to(BF16)
            score = sc.float().sum(dim=2).to(BF16).float()
        n = kc.size(1)
        vis = (torch.arange(1, s + 1, device=self.dev) // 4).unsqueeze(1)
        score = score.masked_fill(torch.arange(n, device=self.dev) >= vis, float("-inf"))
        idx = stable_topk(score, min(cfg.index_topk, n))
        return torch.where(idx >= vis, -1, idx + offset)

    def sparse_attn(self, q, kv, sink, idx, scale):
        b, s, h, d = q.shape
        m = torch.full((b, s, h), float("-inf"), device=self.dev)
        l = torch.zeros(b, s, h, device=self.dev)
        acc = torch.zeros(b, s, h, d, device=self.dev)
        scale = torch.tensor(scale, dtype=torch.float32, device=self.dev)
        qd = q.double()
        bidx = torch.arange(b, device=self.dev).view(b, 1, 1)
        for t0 in range(0, idx.size(-1), 64):
            ids = idx[:, :, t0:t0 + 64]
            valid = ids >= 0
            kvb = kv[bidx, ids.clamp_min(0)].double() * valid.unsqueeze(-1)
            sc = torch.einsum("bshd,bsjd->bshj", qd, kvb).float()
            sc = sc.masked_fill(~valid.unsqueeze(2), float("-inf")) * scale
            m_new = torch.maximum(m, sc.amax(-1))
            alpha = torch.exp(m - m_new)
            p = torch.exp(sc - m_new.unsqueeze(-1))
            l = l * alpha + p.sum(-1)
            pv = torch.einsum("bshj,bsjd->bshd", p.to(BF16).double(), kvb).float()
            acc = acc * alpha.unsqueeze(-1) + pv
            m = m_new
        l = l + torch.exp(sink.view(1, 1, h) - m)
        return (acc / l.unsqueeze(-1)).to(BF16)

    def attention(self, p, layer_id, x):
        cfg = self.cfg
        b, s, _ = x.shape
        H, D, rd, win = cfg.n_heads, cfg.head_dim, cfg.rope_head_dim, cfg.window_size
        ratio = cfg.compress_ratios[layer_id]
        cos, sin = self.rope(ratio, s + self.pos0)
        cos, sin = cos[self.pos0:], sin[self.pos0:]
        qr = self.rmsnorm(self.linear(p + "wq_a", x), p + "q_norm.weight")
        q = self.linear(p + "wq_b", qr).unflatten(-1, (H, D))
        q = q * torch.rsqrt(q.square().mean(-1, keepdim=True) + cfg.norm_eps)  # bf16 arithmetic
        q = self.rope_part(q, cos[:s], sin[:s])
        kv = self.rmsnorm(self.linear(p + "wkv", x), p + "kv_norm.weight")
        kv = self.rope_part(kv, cos[:s], sin[:s])
        kv = torch.cat([dq.qdq_fp8(kv[..., :-rd], 64), kv[..., -rd:]], -1)
        base = torch.arange(s, device=self.dev).unsqueeze(1)
        widx = (base - win + 1).clamp(min=0) + torch.arange(min(s, win), device=self.dev)
        widx = torch.where(widx > base, -1, widx).unsqueeze(0).expand(b, -1, -1)
        parts, kvs = [widx], [kv]
        if ratio:
            if ratio == 4:
                parts.append(self.indexer(p + "indexer.", x, qr, cos, sin, s))
            else:
                n = s // ratio
                cidx = torch.arange(n, device=self.dev).repeat(s, 1)
                cidx = torch.where(cidx >= (base + 1) // ratio, -1, cidx + s)
                parts.append(cidx.unsqueeze(0).expand(b, -1, -1))
            kvc = self.compressor(p + "compressor.", x, ratio, D, False, cos, sin)
            if kvc is not None:
                kvs.append(kvc)
        o = self.sparse_attn(q, torch.cat(kvs, 1), self.w[p + "attn_sink"].float(), torch.cat(parts, -1), D ** -0.5)
        o = self.rope_part(o, cos[:s], sin[:s], inverse=True)
        G, R = cfg.o_groups, cfg.o_lora_rank
        o = o.reshape(b, s, G, -1)
        wo_a = self.w[p + "wo_a.weight"].view(G, R, -1)
        o = self.einsum("bsgd,grd->bsgr", o, wo_a).to(BF16)
        return self.linear(p + "wo_b", o.flatten(2))

    # ------------------------------------------------------------ MoE
    def expert(self, p, x, weights=None):
        g = self.linear(p + "w1", x).float()
        u = self.linear(p + "w3", x).float()
        lim = self.cfg.swiglu_limit
        if lim > 0:
            u = u.clamp(-lim, lim)
            g = g.clamp(max=lim)
        a = F.silu(g) * u
        if weights is not None:
            a = weights * a
        return self.linear(p + "w2", a.to(BF16))

    def moe(self, p, layer_id, x, ids):
        cfg = self.cfg
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        scores = F.softplus(self.mm(x.float(), self.f32(p + "gate.weight"))).sqrt()
        if layer_id < cfg.n_hash_layers:
            idx = self.w[p + "gate.tid2eid"][ids.reshape(-1)].long()
        else:
            idx = stable_topk(scores + self.w[p + "gate.bias"].float(), cfg.n_activated_experts)
        w = scores.gather(1, idx)
        w = w / w.sum(-1, keepdim=True)
        w = w * torch.tensor(cfg.route_scale, dtype=torch.float32, device=self.dev)
        y = torch.zeros(x.shape, dtype=torch.float32, device=self.dev)
        for e in range(cfg.n_routed_experts):
            rows, slot = torch.where(idx == e)
            if rows.numel() == 0:
                continue
            y[rows] += self.expert(f"{p}experts.{e}.", x[rows], w[rows, slot, None]).float()
        y += self.expert(p + "shared_experts.", x).float()
        return y.to(BF16).view(shape)

    # ------------------------------------------------------------ mHC, blocks, heads
    def hc_pre(self, h, p):
        cfg = self.cfg
        xf = h.flatten(2).float()
        mixes = self.mm(xf, self.w[p + "_fn"]) * torch.rsqrt(xf.square().mean(-1, keepdim=True) + cfg.norm_eps)
        pre, post, comb = sinkhorn_split(mixes, self.w[p + "_scale"], self.w[p + "_base"], cfg.hc_mult,
                                         cfg.hc_sinkhorn_iters, cfg.hc_eps)
        y = (pre.unsqueeze(-1) * xf.view(h.shape)).sum(2)
        return y.to(BF16), post, comb

    @staticmethod
    def hc_post(x, res, post, comb):
        y = post.unsqueeze(-1) * x.unsqueeze(-2) + (comb.unsqueeze(-1) * res.unsqueeze(-2)).sum(2)
        return y.to(BF16)

    def block(self, p, layer_id, h, ids):
        x, post, comb = self.hc_pre(h, p + "hc_attn")
        x = self.attention(p + "attn.", layer_id, self.rmsnorm(x, p + "attn_norm.weight"))
        h = self.hc_post(x, h, post, comb)
        x, post, comb = self.hc_pre(h, p + "hc_ffn")
        x = self.moe(p + "ffn.", layer_id, self.rmsnorm(x, p + "ffn_norm.weight"), ids)
        return self.hc_post(x, h, post, comb)

    def head(self, h, p):
        cfg = self.cfg
        xf = h.flatten(2).float()
        mixes = self.mm(xf, self.w[p + "hc_head_fn"]) * torch.rsqrt(xf.square().mean(-1, keepdim=True) + cfg.norm_eps)
        pre = torch.sigmoid(mixes * self.w[p + "hc_head_scale"] + self.w[p + "hc_head_base"]) + cfg.hc_eps
        x = (pre.unsqueeze(-1) * xf.view(h.shape)).sum(2).to(BF16)
        x = self.rmsnorm(x, p + "norm.weight")
        return self.mm(x.float(), self.f32("head.weight"))

    @torch.no_grad()
    def forward(self, ids: torch.Tensor):
        """ids [b, s] (one prefill at start_pos 0) -> (logits fp32 [b, s, V], final residual [b, s, hc, d] bf16)."""
        ids = ids.to(self.dev)
        h = self.w["embed.weight"][ids].to(BF16)
        h = h.unsqueeze(2).repeat(1, 1, self.cfg.hc_mult, 1)
        for i in range(self.cfg.n_layers):
            h = self.block(f"layers.{i}.", i, h, ids)
        return self.head(h, ""), h

    @torch.no_grad()
    def mtp_forward(self, h: torch.Tensor, next_ids: torch.Tensor, pos0: int = 0):
        """MTP layer 0 over positions 0..s-1: h = main final residual [b, s, hc, d], next_ids [b, s] = the
        token after each position -> logits [b, s, V] for the token two ahead. pos0: RoPE positions from there
        (1: as the engine, which keeps the layer's entry of hidden state t at the position of token t+1)."""
        cfg, p = self.cfg, "mtp.0."
        self.pos0 = pos0
        next_ids = next_ids.to(self.dev)
        e = self.rmsnorm(self.w["embed.weight"][next_ids].to(BF16), p + "enorm.weight")
        x = self.linear(p + "e_proj", e).unsqueeze(2) + self.linear(p + "h_proj", self.rmsnorm(h, p + "hnorm.weight"))
        try:
            x = self.block(p, cfg.n_layers, x, next_ids)
        finally:
            self.pos0 = 0
        return self.head(x, p)


def load_exact(model_dir: str, device="cpu", native_ops: bool = True) -> ExactV4:
    cfg = DemoConfig.load(f"{model_dir}/config.json")
    return ExactV4(cfg, load_safetensors(f"{model_dir}/model.safetensors"), device, native_ops)
