"""DeepSeek-V4-Flash architecture in torch: the training side of the embedded demo model.

`DemoV4` has the released V4-Flash structure with checkpoint-native parameter names (so export is a
rename-free encode): hybrid attention (sliding window; CSA = ratio-4 overlapping compressor + indexer
top-k; HCA = ratio-128 compressor), mHC with Sinkhorn, MoE with hash-routed and learned-routed layers
(sqrtsoftplus + selection bias), and one MTP layer. `export_tensors` writes the checkpoint encodings;
the engine-exact evaluation of those tensors lives in demo_exact.py.

Training path versus the official inference code:
- fp32 master weights, bf16 autocast on CUDA; mHC mixing, Sinkhorn, router and head in fp32.
- Optional straight-through fake quantisation (`qat`) of what the release quantises: FP8 128x128 weights,
  FP4 1x32 experts, per-128 e4m3 GEMM inputs, window-KV e4m3 (block 64) on the non-rope dims,
  compressed-KV e4m3 (block 64), indexer q/k e2m1 (block 32).
- Attention is computed densely with masks (window band, visible and indexer-selected compressed entries,
  sink column), which is the same function as the official sparse kernel.
- The indexer's top-k is not differentiable: the indexer is trained by a KL loss towards the main
  attention's distribution over the visible compressed entries (DeepSeek sparse-attention style; the
  indexer's inputs are detached so that loss trains only the indexer), and the main attention uses its
  (detached) top-k selection.
- Learned routing is balanced without an auxiliary loss: the selection bias moves by a fixed step
  against each expert's load after every optimiser step (DeepSeek-V3 style). Hash layers route by a
  fixed random token -> experts table.
"""
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import demo_quant as dq


class DemoConfig:
    """The released config.json keys, with the official ModelArgs names as attributes."""

    def __init__(self, hf: dict):
        self.hf = dict(hf)
        g = hf.get
        rs = hf.get("rope_scaling") or {}
        self.vocab_size = hf["vocab_size"]
        self.dim = hf["hidden_size"]
        self.n_layers = hf["num_hidden_layers"]
        self.n_hash_layers = g("num_hash_layers", 0)
        self.n_mtp_layers = g("num_nextn_predict_layers", 0)
        self.n_heads = hf["num_attention_heads"]
        self.n_routed_experts = hf["n_routed_experts"]
        self.n_activated_experts = hf["num_experts_per_tok"]
        self.moe_inter_dim = hf["moe_intermediate_size"]
        self.score_func = g("scoring_func", "sqrtsoftplus")
        self.route_scale = g("routed_scaling_factor", 1.0)
        self.swiglu_limit = g("swiglu_limit", 0.0)
        self.q_lora_rank = hf["q_lora_rank"]
        self.head_dim = hf["head_dim"]
        self.rope_head_dim = hf["qk_rope_head_dim"]
        self.norm_eps = g("rms_norm_eps", 1e-6)
        self.o_groups = hf["o_groups"]
        self.o_lora_rank = hf["o_lora_rank"]
        self.window_size = hf["sliding_window"]
        self.compress_ratios = list(hf["compress_ratios"])
        self.compress_rope_theta = g("compress_rope_theta", 160000.0)
        self.rope_theta = g("rope_theta", 10000.0)
        self.original_seq_len = rs.get("original_max_position_embeddings", 0)
        self.rope_factor = rs.get("factor", 1.0)
        self.beta_fast = rs.get("beta_fast", 32)
        self.beta_slow = rs.get("beta_slow", 1)
        self.index_n_heads = hf["index_n_heads"]
        self.index_head_dim = hf["index_head_dim"]
        self.index_topk = hf["index_topk"]
        self.hc_mult = hf["hc_mult"]
        self.hc_sinkhorn_iters = hf["hc_sinkhorn_iters"]
        self.hc_eps = hf["hc_eps"]
        self.max_seq_len = g("max_position_embeddings", 4096)
        assert self.compress_ratios[self.n_layers:] == [0] * self.n_mtp_layers, "MTP layers are sliding-window"
        assert len(self.compress_ratios) == self.n_layers + self.n_mtp_layers

    @staticmethod
    def load(path: str) -> "DemoConfig":
        with open(path) as f:
            return DemoConfig(json.load(f))


# ---------------------------------------------------------------- shared math

def rope_tables(cfg: DemoConfig, ratio: int, seqlen: int, device=None):
    """(cos, sin) fp32 [seqlen, rope_head_dim/2], as the official precompute_freqs_cis: layers with a
    compressor use compress_rope_theta with YaRN (whenever original_seq_len > 0), window-only layers rope_theta."""
    dim = cfg.rope_head_dim
    base = cfg.compress_rope_theta if ratio else cfg.rope_theta
    orig = cfg.original_seq_len if ratio else 0
    # computed on the target device, as the official code does under its default device
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    if orig > 0:
        def corr(rot):
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
        low = max(math.floor(corr(cfg.beta_fast)), 0)
        high = min(math.ceil(corr(cfg.beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / cfg.rope_factor * (1 - smooth) + freqs * smooth
    ang = torch.outer(torch.arange(seqlen, device=device), freqs)
    cis = torch.polar(torch.ones_like(ang), ang)
    return cis.real.contiguous(), cis.imag.contiguous()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate adjacent pairs (2i, 2i+1) of the last dim; cos/sin [T, d/2] broadcast over the middle dims
    of x [B, T, ..., d]. Computed in fp32, returned in x's dtype."""
    shape = [1, cos.size(0)] + [1] * (x.dim() - 3) + [cos.size(1)]
    c, s = cos.view(shape), sin.view(shape)
    if inverse:
        s = -s
    xf = x.float().unflatten(-1, (-1, 2))
    xr, xi = xf[..., 0], xf[..., 1]
    out = torch.stack([xr * c - xi * s, xr * s + xi * c], dim=-1).flatten(-2)
    return out.to(x.dtype)


def hadamard_matrix(n: int, device=None) -> torch.Tensor:
    """Sylvester Walsh-Hadamard matrix (natural order), entries +-1."""
    h = torch.ones(1, 1)
    while h.size(0) < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    assert h.size(0) == n, "index_head_dim must be a power of two"
    return h.to(device)


def sinkhorn_split(mixes, scale, base, hc: int, iters: int, eps: float):
    """(pre, post, comb) from the mixes [.., (2+hc)*hc], the official fp32 operation order."""
    pre = torch.sigmoid(mixes[..., :hc] * scale[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(mixes[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = (mixes[..., 2 * hc:] * scale[2] + base[2 * hc:]).unflatten(-1, (hc, hc))
    comb = torch.exp(comb - comb.amax(-1, keepdim=True))
    comb = comb / comb.sum(-1, keepdim=True) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


def stable_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest values along the last dim, descending; ties -> lower index first."""
    return torch.sort(x, dim=-1, descending=True, stable=True)[1][..., :k]


# ---------------------------------------------------------------- training modules

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        return (self.weight * y).to(x.dtype)


class QLinear(nn.Module):
    """Linear without bias whose weight is stored as `kind` in the checkpoint ('fp8', 'fp4', 'bf16', 'f32');
    under QAT the fp8/fp4 kinds see fake-quantised weights and per-`block` e4m3 inputs (block: 128 in V4, V4.1
    sets 32, its weight tile and activation block)."""

    def __init__(self, in_f: int, out_f: int, kind: str, std: float = 0.02, block: int = 128):
        super().__init__()
        self.kind = kind
        self.block = block
        self.qat = False
        self.weight = nn.Parameter(torch.randn(out_f, in_f) * std)

    def forward(self, x):
        w = self.weight
        if self.qat and self.kind in ("fp8", "fp4"):
            w = dq.fake_fp8_weight(w, self.block) if self.kind == "fp8" else dq.fake_fp4_weight(w)
            x = dq.fake_act(x, self.block)
        return F.linear(x, w)  # bf16 under CUDA autocast, fp32 otherwise


def _qat_on(m: nn.Module) -> bool:
    return getattr(m, "qat", False)


class Compressor(nn.Module):
    """Gated pooling of `ratio` tokens per entry; ratio 4 overlaps windows (coff 2, A/B halves)."""

    def __init__(self, cfg: DemoConfig, ratio: int, head_dim: int, rotate: bool):
        super().__init__()
        self.ratio, self.head_dim, self.rotate = ratio, head_dim, rotate
        self.overlap = ratio == 4
        coff = 2 if self.overlap else 1
        self.rd = cfg.rope_head_dim
        self.ape = nn.Parameter(torch.zeros(ratio, coff * head_dim))
        self.wkv = QLinear(cfg.dim, coff * head_dim, "bf16")
        self.wgate = QLinear(cfg.dim, coff * head_dim, "bf16")
        self.norm = RMSNorm(head_dim, cfg.norm_eps)
        self.qat = False

    def forward(self, x, cos, sin, hmat=None):
        B, T, _ = x.shape
        r, d = self.ratio, self.head_dim
        n = T // r
        if n == 0:
            return None
        kv = self.wkv(x[:, :n * r]).float().unflatten(1, (n, r))
        sc = self.wgate(x[:, :n * r]).float().unflatten(1, (n, r)) + self.ape
        if self.overlap:
            kv_a = F.pad(kv[:, :-1, :, :d], (0, 0, 0, 0, 1, 0))
            sc_a = F.pad(sc[:, :-1, :, :d], (0, 0, 0, 0, 1, 0), value=float("-inf"))
            kv = torch.cat([kv_a, kv[..., d:]], dim=2)
            sc = torch.cat([sc_a, sc[..., d:]], dim=2)
        c = (kv * sc.softmax(dim=2)).sum(dim=2)
        c = self.norm(c.to(x.dtype))
        rd = self.rd
        c = torch.cat([c[..., :-rd], apply_rope(c[..., -rd:], cos[0:n * r:r], sin[0:n * r:r])], -1)
        if self.rotate:
            c = (c.float() @ hmat) * (d ** -0.5)
            if self.qat:
                c = dq.fake_fp4_act(c)
        elif self.qat:
            c = torch.cat([dq.fake_act(c[..., :-rd], 64), c[..., -rd:]], -1)
        return c


class Indexer(nn.Module):
    def __init__(self, cfg: DemoConfig):
        super().__init__()
        self.n_heads, self.head_dim, self.topk = cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk
        self.rd = cfg.rope_head_dim
        self.wq_b = QLinear(cfg.q_lora_rank, self.n_heads * self.head_dim, "fp8")
        self.weights_proj = QLinear(cfg.dim, self.n_heads, "bf16")
        self.compressor = Compressor(cfg, 4, self.head_dim, rotate=True)
        self.register_buffer("hmat", hadamard_matrix(self.head_dim), persistent=False)
        self.qat = False

    def scores(self, x, qr, cos, sin):
        """Index scores [B, T, N] (fp32, -inf where not visible) from detached inputs."""
        x, qr = x.detach(), qr.detach()
        B, T, _ = x.shape
        q = self.wq_b(qr).unflatten(-1, (self.n_heads, self.head_dim))
        rd = self.rd
        q = torch.cat([q[..., :-rd], apply_rope(q[..., -rd:], cos[:T], sin[:T])], -1)
        q = (q.float() @ self.hmat) * (self.head_dim ** -0.5)
        if self.qat:
            q = dq.fake_fp4_act(q)
        k = self.compressor(x, cos, sin, self.hmat)
        w = self.weights_proj(x).float() * (self.head_dim ** -0.5 * self.n_heads ** -0.5)
        s = torch.einsum("bthd,bnd->bthn", q.float(), k.float()).relu()
        return (s * w.unsqueeze(-1)).sum(2)


class Attention(nn.Module):
    def __init__(self, cfg: DemoConfig, layer_id: int):
        super().__init__()
        self.cfg = cfg
        self.ratio = cfg.compress_ratios[layer_id]
        self.n_heads, self.head_dim, self.rd = cfg.n_heads, cfg.head_dim, cfg.rope_head_dim
        self.win = cfg.window_size
        self.eps = cfg.norm_eps
        self.attn_sink = nn.Parameter(torch.zeros(cfg.n_heads))
        self.wq_a = QLinear(cfg.dim, cfg.q_lora_rank, "fp8")
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps)
        self.wq_b = QLinear(cfg.q_lora_rank, cfg.n_heads * cfg.head_dim, "fp8")
        self.wkv = QLinear(cfg.dim, cfg.head_dim, "fp8")
        self.kv_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.wo_a = QLinear(cfg.n_heads * cfg.head_dim // cfg.o_groups, cfg.o_groups * cfg.o_lora_rank, "fp8")
        self.wo_b = QLinear(cfg.o_groups * cfg.o_lora_rank, cfg.dim, "fp8")
        if self.ratio:
            self.compressor = Compressor(cfg, self.ratio, cfg.head_dim, rotate=False)
            self.indexer = Indexer(cfg) if self.ratio == 4 else None
        self.qat = False
        self.index_loss = None

    def forward(self, x, rope):
        B, T, _ = x.shape
        H, D, rd = self.n_heads, self.head_dim, self.rd
        cos, sin = rope
        qr = self.q_norm(self.wq_a(x))
        q = self.wq_b(qr).unflatten(-1, (H, D))
        q = q * torch.rsqrt(q.float().square().mean(-1, keepdim=True) + self.eps).to(q.dtype)
        q = torch.cat([q[..., :-rd], apply_rope(q[..., -rd:], cos[:T], sin[:T])], -1)
        kv = self.kv_norm(self.wkv(x))
        kv = torch.cat([kv[..., :-rd], apply_rope(kv[..., -rd:], cos[:T], sin[:T])], -1)
        if self.qat:
            kv = torch.cat([dq.fake_act(kv[..., :-rd], 64), kv[..., -rd:]], -1)
        scale = D ** -0.5
        t = torch.arange(T, device=x.device)
        band = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - self.win)
        logits = torch.einsum("bthd,bsd->bhts", q, kv).float() * scale
        logits = logits.masked_fill(~band, float("-inf"))
        parts = [logits]
        kvc = None
        self.index_loss = None
        if self.ratio:
            kvc = self.compressor(x, cos, sin)
        if kvc is not None:
            n = kvc.size(1)
            visible = torch.arange(n, device=x.device)[None, :] < ((t + 1) // self.ratio)[:, None]  # [T, N]
            lc = torch.einsum("bthd,bnd->bhtn", q, kvc).float() * scale
            mask = visible[None].expand(B, T, n)
            if self.indexer is not None:
                # finite fill keeps rows without visible entries NaN-free (they are excluded below)
                iscore = self.indexer.scores(x, qr, cos, sin).masked_fill(~visible, -1e9)
                k = min(self.indexer.topk, n)
                with torch.no_grad():
                    sel = torch.zeros(B, T, n, dtype=torch.bool, device=x.device)
                    sel.scatter_(-1, iscore.topk(k, dim=-1).indices, True)
                mask = mask & sel
                # indexer target: main attention over all visible compressed entries, summed over heads
                with torch.no_grad():
                    tgt = lc.masked_fill(~visible, float("-inf")).softmax(-1).nan_to_num(0.0).sum(1)
                    tgt = tgt / tgt.sum(-1, keepdim=True).clamp_min(1e-9)
                rows = visible.any(-1)
                logp = F.log_softmax(iscore, dim=-1)
                kl = (tgt * (torch.log(tgt.clamp_min(1e-9)) - logp.masked_fill(~visible, 0.0))).sum(-1)
                self.index_loss = kl[:, rows].mean()
            parts.append(lc.masked_fill(~mask[:, None], float("-inf")))
        parts.append(self.attn_sink.float().view(1, H, 1, 1).expand(B, H, T, 1))
        p = torch.cat(parts, dim=-1).softmax(-1)
        o = torch.einsum("bhts,bsd->bthd", p[..., :T].to(kv.dtype), kv)
        if kvc is not None:
            o = o + torch.einsum("bhtn,bnd->bthd", p[..., T:T + kvc.size(1)].to(kvc.dtype), kvc)
        o = torch.cat([o[..., :-rd], apply_rope(o[..., -rd:], cos[:T], sin[:T], inverse=True)], -1)
        G = self.cfg.o_groups
        o = o.reshape(B, T, G, -1)
        wo_a = self.wo_a.weight
        if self.qat:
            wo_a = dq.fake_fp8_weight(wo_a)
        wo_a = wo_a.view(G, self.cfg.o_lora_rank, -1)
        o = torch.einsum("btgd,grd->btgr", o, wo_a)
        return self.wo_b(o.flatten(2))


class Expert(nn.Module):
    def __init__(self, dim: int, inter: int, kind: str, limit: float, out_std: float):
        super().__init__()
        self.w1 = QLinear(dim, inter, kind)
        self.w2 = QLinear(inter, dim, kind, std=out_std)
        self.w3 = QLinear(dim, inter, kind)
        self.limit = limit

    def forward(self, x, weights=None, wq=None):
        """wq: optional (w1, w2, w3) already fake-quantised for the whole expert set (QAT)."""
        if wq is not None:
            xq = dq.fake_act(x, self.w1.block)
            g, u = F.linear(xq, wq[0]).float(), F.linear(xq, wq[2]).float()
        else:
            g, u = self.w1(x).float(), self.w3(x).float()
        if self.limit > 0:
            u = u.clamp(-self.limit, self.limit)
            g = g.clamp(max=self.limit)
        a = F.silu(g) * u
        if weights is not None:
            a = a * weights
        if wq is not None:
            return F.linear(dq.fake_act(a.to(x.dtype), self.w2.block), wq[1])
        return self.w2(a.to(x.dtype))


class Gate(nn.Module):
    def __init__(self, cfg: DemoConfig, layer_id: int, gen: torch.Generator):
        super().__init__()
        self.topk, self.route_scale = cfg.n_activated_experts, cfg.route_scale
        self.n_experts = cfg.n_routed_experts
        self.hash = layer_id < cfg.n_hash_layers
        self.weight = nn.Parameter(torch.randn(cfg.n_routed_experts, cfg.dim) * 0.02)
        if self.hash:
            # distinct experts per token, every expert used equally often over the vocabulary
            perm = torch.stack([torch.randperm(self.n_experts, generator=gen)[:self.topk] for _ in range(cfg.vocab_size)])
            self.register_buffer("tid2eid", perm.long())
            self.bias = None
        else:
            self.register_buffer("bias", torch.zeros(cfg.n_routed_experts))
        self.load = None

    def forward(self, x, ids):
        with torch.autocast(x.device.type, enabled=False):
            s = F.softplus(F.linear(x.float(), self.weight.float())).sqrt()
        if self.hash:
            idx = self.tid2eid[ids]
        else:
            idx = (s.detach() + self.bias).topk(self.topk, dim=-1).indices
            self.load = torch.bincount(idx.flatten(), minlength=self.n_experts).float()
        w = s.gather(1, idx)
        w = w / w.sum(-1, keepdim=True) * self.route_scale
        return w, idx


def fake_fp4_stack(ws):
    w = torch.stack(ws)
    return dq.fake_fp4_weight(w.reshape(-1, w.size(-1))).view_as(w)


class MoE(nn.Module):
    def __init__(self, cfg: DemoConfig, layer_id: int, gen: torch.Generator, out_std: float):
        super().__init__()
        self.gate = Gate(cfg, layer_id, gen)
        self.experts = nn.ModuleList([Expert(cfg.dim, cfg.moe_inter_dim, "fp4", cfg.swiglu_limit, out_std)
                                      for _ in range(cfg.n_routed_experts)])
        self.shared_experts = Expert(cfg.dim, cfg.moe_inter_dim, "fp8", cfg.swiglu_limit, out_std)

    def forward(self, x, ids):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        w, idx = self.gate(x, ids.reshape(-1))
        k = idx.size(1)
        flat = idx.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        tok = order // k
        wq = None
        if self.experts[0].w1.qat:  # fake-quantise all routed experts at once (one op chain, not one per expert)
            wq = [fake_fp4_stack([getattr(e, w).weight for e in self.experts]) for w in ("w1", "w2", "w3")]
        y = torch.zeros(x.size(0), shape[-1], dtype=torch.float32, device=x.device)
        start = 0
        wf = w.flatten()
        for e, c in enumerate(counts):
            if c == 0:
                continue
            sl = order[start:start + c]
            t = tok[start:start + c]
            out = self.experts[e](x[t], wf[sl, None], None if wq is None else (wq[0][e], wq[1][e], wq[2][e]))
            y = y.index_add(0, t, out.float())
            start += c
        y = y + self.shared_experts(x).float()
        return y.to(x.dtype).view(shape)


class Block(nn.Module):
    def __init__(self, cfg: DemoConfig, layer_id: int, gen: torch.Generator, dropout: float):
        super().__init__()
        out_std = 0.02 / math.sqrt(2 * (cfg.n_layers + cfg.n_mtp_layers))
        self.attn = Attention(cfg, layer_id)
        self.attn.wo_b.weight.data.normal_(0, out_std)
        self.ffn = MoE(cfg, layer_id, gen, out_std)
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.hc, self.iters, self.hc_eps, self.eps = cfg.hc_mult, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.norm_eps
        mix = (2 + self.hc) * self.hc
        for site in ("attn", "ffn"):
            setattr(self, f"hc_{site}_fn", nn.Parameter(torch.randn(mix, self.hc * cfg.dim) * (0.1 / math.sqrt(self.hc * cfg.dim))))
            setattr(self, f"hc_{site}_base", nn.Parameter(hc_base_init(self.hc)))
            setattr(self, f"hc_{site}_scale", nn.Parameter(torch.ones(3)))
        self.drop = nn.Dropout(dropout)

    def hc_pre(self, h, fn, scale, base):
        with torch.autocast(h.device.type, enabled=False):
            x = h.flatten(2).float()
            mixes = F.linear(x, fn) * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps)
            pre, post, comb = sinkhorn_split(mixes, scale, base, self.hc, self.iters, self.hc_eps)
            y = (pre.unsqueeze(-1) * h.float()).sum(2)
        return y, post, comb

    @staticmethod
    def hc_post(y, res, post, comb):
        return post.unsqueeze(-1) * y.float().unsqueeze(-2) + (comb.unsqueeze(-1) * res.float().unsqueeze(-2)).sum(2)

    def forward(self, h, ids, rope):
        x, post, comb = self.hc_pre(h, self.hc_attn_fn, self.hc_attn_scale, self.hc_attn_base)
        y = self.drop(self.attn(self.attn_norm(x), rope))
        h = self.hc_post(y, h, post, comb)
        x, post, comb = self.hc_pre(h, self.hc_ffn_fn, self.hc_ffn_scale, self.hc_ffn_base)
        y = self.drop(self.ffn(self.ffn_norm(x), ids))
        return self.hc_post(y, h, post, comb)


def hc_base_init(hc: int) -> torch.Tensor:
    """pre ~ 1/hc each (a mean over the copies), post ~ 1, comb ~ identity after Sinkhorn."""
    pre = torch.full((hc,), math.log(1.0 / (hc - 1)))
    post = torch.zeros(hc)
    comb = torch.eye(hc).flatten() * 4.0
    return torch.cat([pre, post, comb])


class HcHead(nn.Module):
    """Final collapse of the hc copies: pre = sigmoid(mixes * scale + base) + eps (no Sinkhorn)."""

    @staticmethod
    def collapse(h, fn, scale, base, eps, hc_eps):
        with torch.autocast(h.device.type, enabled=False):
            x = h.flatten(2).float()
            mixes = F.linear(x, fn) * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
            pre = torch.sigmoid(mixes * scale + base) + hc_eps
            return (pre.unsqueeze(-1) * h.float()).sum(2)


class MTPBlock(Block):
    def __init__(self, cfg: DemoConfig, layer_id: int, gen: torch.Generator, dropout: float):
        super().__init__(cfg, layer_id, gen, dropout)
        self.e_proj = QLinear(cfg.dim, cfg.dim, "fp8")
        self.h_proj = QLinear(cfg.dim, cfg.dim, "fp8")
        self.enorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.hnorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.hc_head_fn = nn.Parameter(torch.randn(self.hc, self.hc * cfg.dim) * (0.1 / math.sqrt(self.hc * cfg.dim)))
        self.hc_head_base = nn.Parameter(torch.full((self.hc,), math.log(1.0 / (self.hc - 1))))
        self.hc_head_scale = nn.Parameter(torch.ones(1))


class DemoV4(nn.Module):
    def __init__(self, cfg: DemoConfig, seed: int = 0, dropout: float = 0.0):
        super().__init__()
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed + 1)
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.embed.weight.data.normal_(0, 1.0)
        self.layers = nn.ModuleList([Block(cfg, i, gen, dropout) for i in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = QLinear(cfg.dim, cfg.vocab_size, "bf16", std=cfg.dim ** -0.5)
        hc = cfg.hc_mult
        self.hc_head_fn = nn.Parameter(torch.randn(hc, hc * cfg.dim) * (0.1 / math.sqrt(hc * cfg.dim)))
        self.hc_head_base = nn.Parameter(torch.full((hc,), math.log(1.0 / (hc - 1))))
        self.hc_head_scale = nn.Parameter(torch.ones(1))
        self.mtp = nn.ModuleList([MTPBlock(cfg, cfg.n_layers + i, gen, dropout) for i in range(cfg.n_mtp_layers)])
        self.drop = nn.Dropout(dropout)
        self._rope = {}

    def set_qat(self, on: bool):
        for m in self.modules():
            if hasattr(m, "qat"):
                m.qat = on

    def rope(self, ratio: int, T: int, device):
        key = (bool(ratio), T, str(device))
        if key not in self._rope:
            self._rope[key] = rope_tables(self.cfg, ratio, T, device)
        return self._rope[key]

    def _logits(self, h, owner):
        x = HcHead.collapse(h, owner.hc_head_fn, owner.hc_head_scale, owner.hc_head_base, self.cfg.norm_eps, self.cfg.hc_eps)
        x = owner.norm(x)
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(x.float(), self.head.weight.float())

    def forward(self, ids: torch.Tensor, mtp: bool = True):
        """ids [B, T] -> (main logits [B, T, V], MTP logits [B, T-1, V] predicting ids[t+2] or None,
        mean indexer KL loss or None)."""
        B, T = ids.shape
        h = self.drop(self.embed(ids))
        h = h.unsqueeze(2).expand(B, T, self.cfg.hc_mult, -1)
        idx_losses = []
        for i, layer in enumerate(self.layers):
            h = layer(h, ids, self.rope(self.cfg.compress_ratios[i], T, ids.device))
            if layer.attn.index_loss is not None:
                idx_losses.append(layer.attn.index_loss)
        logits = self._logits(h, self)
        mtp_logits = None
        if mtp and self.cfg.n_mtp_layers:
            blk = self.mtp[0]
            nxt = ids[:, 1:]
            e = blk.enorm(self.embed(nxt))
            x = blk.e_proj(e).unsqueeze(2) + blk.h_proj(blk.hnorm(h[:, :-1]))
            x = blk(x, nxt, self.rope(0, T - 1, ids.device))
            mtp_logits = self._logits(x, blk)
        idx_loss = torch.stack(idx_losses).mean() if idx_losses else None
        return logits, mtp_logits, idx_loss

    @torch.no_grad()
    def update_router_bias(self, step: float):
        for m in self.modules():
            if isinstance(m, Gate) and not m.hash and m.load is not None:
                m.bias += step * torch.sign(m.load.mean() - m.load)
                m.load = None


# ---------------------------------------------------------------- export in the released encoding

# checkpoint kinds by parameter-name suffix (the official Linear dtypes)
_BF16_SUFFIXES = ("embed.weight", "head.weight", "norm.weight", "gate.weight", "compressor.wkv.weight",
                  "compressor.wgate.weight", "weights_proj.weight")


def tensor_kind(name: str, module_kinds: dict) -> str:
    if name.endswith("tid2eid"):
        return "i64"
    if name in module_kinds:
        return module_kinds[name]
    if name.endswith(_BF16_SUFFIXES):
        return "bf16"
    return "f32"


def export_tensors(model: DemoV4) -> dict:
    """Checkpoint-native names -> tensors in the released dtypes (FP8 + block scales, FP4 experts, ...)."""
    kinds = {}
    for mname, m in model.named_modules():
        if isinstance(m, QLinear):
            kinds[f"{mname}.weight"] = m.kind
    out = {}
    state = model.state_dict()
    for name, t in state.items():
        t = t.detach().cpu()
        kind = tensor_kind(name, kinds)
        if kind == "fp8":
            q, s = dq.quantize_fp8_block(t.float())
            out[name] = q
            out[name[:-len("weight")] + "scale"] = s
        elif kind == "fp4":
            q, s = dq.quantize_fp4_rows(t.float())
            out[name] = q
            out[name[:-len("weight")] + "scale"] = s
        elif kind == "bf16":
            out[name] = t.to(torch.bfloat16).contiguous()
        elif kind == "i64":
            out[name] = t.to(torch.int64).contiguous()
        else:
            out[name] = t.float().contiguous()
    return out
