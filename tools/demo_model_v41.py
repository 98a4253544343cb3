"""DeepSeek-V4.1-Flash architecture in torch: the training side of the V4.1 demo model (peregrine-demo-v41).

`DemoV41` has the released V4.1 structure with checkpoint-native parameter names (export is a rename-free encode)
and follows /work/shared/docs/dsv41-arch.md and the engine (src/model/deepseek_v41.cpp, dspark.cpp, ops/cpu):
- CSA2 attention: every layer has a sliding window (K=V, MQA); layers with a compress ratio attend to the compressed
  KV of the nearest kv-source layer at or before them (ratio 2: per-channel softmax pooling of 2 tokens, no overlap,
  no ape; ratio 1: one latent per token), restricted to the top-k entries of the nearest index-source layer. Index
  keys come from a kv source's pre-RoPE latents (wk, k_norm); a candidate source also picks the top candidate blocks
  (block max of its index scores, newest block pinned) that later index sources (reindex) are restricted to.
- Single-pass mHC (a sublayer collapses its input with the previous sublayer's `pre`; layer 0 takes stream 0; the
  head collapses with the last FFN's `pre`; no hc_head), no per-head q norm, no Hadamard rotation in the indexer.
- Engram layers: n-gram hash rows (hashing in numpy, bit-identical to the engine) -> fp8 table -> wkv -> one key
  per hc copy and a shared value, gated into the residual before the layer's attention mixer.
- MoE: learned routing everywhere (no hash layers), sqrtsoftplus + selection bias (demo_model.MoE).
- DSpark head (`mtp.S`): window-only blocks whose window holds main_kv of the backbone's hidden states at the
  positions <= the anchor position p, drafting a block [anchor, noise x (B-1)] at positions p+1..p+B (no causal
  mask inside the block), head logits plus a Markov bias of the previous token, and a confidence head.

Training precision: fp32 master weights, bf16 autocast on CUDA, fp32 on the CPU; with `qat` the FP8 (32x32 tiles)
and FP4 (1x32) weights are fake-quantised and so are the activations the engine quantises (e4m3 per 32 before every
FP8/FP4 GEMM, window KV e4m3 per 32, compressed KV e2m1 with e4m3 scales per 16, indexer q/k e2m1 per 32).
The evaluation of an exported checkpoint (`load_exported`) runs the same code in fp32 on the dequantised tensors.
"""
import copy
import json
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import demo_quant as dq
from demo_model import MoE, QLinear, RMSNorm, DemoConfig, Gate, hc_base_init, rope_tables, sinkhorn_split, stable_topk

BLOCK = 32  # V4.1 weight tile and activation quantisation block


# ---------------------------------------------------------------- config

class V41Config(DemoConfig):
    """The released config.json (HF schema with text_config); the official ModelArgs names as attributes."""

    def __init__(self, hf: dict):
        t = hf["text_config"]
        super().__init__(t)
        self.top = dict(hf)
        g = t.get
        self.kv_sources = list(t["kv_source_layer_ids"])
        self.index_sources = list(t["index_source_layer_ids"])
        self.cand_source = g("candidate_source_layer_id", -1)
        self.cand_topk = g("candidate_topk_blocks", 0)
        self.cand_bs = g("candidate_block_size", 1)
        self.engram_layers = list(g("engram_layer_ids", []))
        self.engram_rows = list(g("engram_num_embeddings", []))
        self.engram_max_ngram = g("engram_max_ngram_size", 0)
        self.engram_heads = g("engram_n_heads", 0)
        self.engram_head_dim = g("engram_head_dim", 0)
        self.engram_vocab = g("engram_vocab_size", 0)
        self.engram_pad = g("engram_pad_token_id", 2)
        self.engram_classes = g("engram_compressed_vocab_size", 0)
        self.block_size = g("dspark_block_size", 0)
        self.noise_id = g("dspark_noise_token_id", 0)
        self.targets = list(g("dspark_target_layer_ids", []))
        self.markov_rank = g("dspark_markov_rank", 0)
        self.dspark_experts = g("dspark_n_routed_experts", 0) or self.n_routed_experts
        self.dspark_topk = g("dspark_num_experts_per_tok", 0) or self.n_activated_experts

    def roles(self, l: int):
        """The engine's layer_roles (deepseek_v41.cpp) for layer l, None for a window-only layer."""
        r = self.compress_ratios[l]
        if r == 0:
            return None
        owners = [s for s in self.kv_sources if s in self.index_sources]
        has_ix = l in self.index_sources
        return dict(ratio=r, compresses=l in self.kv_sources, comp_source=max(s for s in self.kv_sources if s <= l),
                    has_indexer=has_ix, owns_k=has_ix and l in self.kv_sources,
                    k_source=max([o for o in owners if o <= l], default=-1),
                    cand_source=has_ix and l == self.cand_source,
                    uses_cand=has_ix and 0 <= self.cand_source < l)


def make_config(size: str, engram_classes: int, noise_id: int, vocab_size: int = 4096) -> tuple:
    """(config.json dict, training seq_len). dims are multiples of 32 (the V4.1 quantisation blocks)."""
    if size == "demo":
        t = dict(hidden_size=256, num_hidden_layers=7, compress_ratios=[0, 0, 2, 2, 2, 1, 1, 0, 0, 0],
                 kv_source_layer_ids=[2, 5], index_source_layer_ids=[2, 5, 6], candidate_source_layer_id=5,
                 candidate_topk_blocks=16, candidate_block_size=8, num_attention_heads=8, head_dim=64,
                 qk_rope_head_dim=32, q_lora_rank=128, o_groups=2, o_lora_rank=128, n_routed_experts=8,
                 num_experts_per_tok=2, moe_intermediate_size=128, index_n_heads=4, index_head_dim=128, index_topk=64,
                 sliding_window=128, max_position_embeddings=8192, original=512, engram_layer_ids=[1, 4],
                 engram_n_heads=3, engram_head_dim=32, engram_vocab_size=256, num_nextn_predict_layers=3,
                 dspark_block_size=5, dspark_target_layer_ids=[4, 5, 6], dspark_markov_rank=32,
                 dspark_n_routed_experts=4, dspark_num_experts_per_tok=2, seq_len=512)
    elif size == "small":  # quick end-to-end checks on a CPU: every layer role, engram, DSpark
        t = dict(hidden_size=128, num_hidden_layers=5, compress_ratios=[0, 2, 2, 1, 1, 0, 0],
                 kv_source_layer_ids=[1, 3], index_source_layer_ids=[1, 3, 4], candidate_source_layer_id=3,
                 candidate_topk_blocks=8, candidate_block_size=4, num_attention_heads=4, head_dim=64,
                 qk_rope_head_dim=32, q_lora_rank=64, o_groups=2, o_lora_rank=64, n_routed_experts=4,
                 num_experts_per_tok=2, moe_intermediate_size=64, index_n_heads=4, index_head_dim=64, index_topk=16,
                 sliding_window=32, max_position_embeddings=2048, original=128, engram_layer_ids=[1, 3],
                 engram_n_heads=2, engram_head_dim=32, engram_vocab_size=97, num_nextn_predict_layers=2,
                 dspark_block_size=5, dspark_target_layer_ids=[2, 3, 4], dspark_markov_rank=32,
                 dspark_n_routed_experts=4, dspark_num_experts_per_tok=2, seq_len=256)
    else:
        raise ValueError(size)
    seq_len, orig = t.pop("seq_len"), t.pop("original")
    n_eng = len(t["engram_layer_ids"])
    primes = engram_primes(n_eng, 4, t["engram_n_heads"], t["engram_vocab_size"])
    text = {
        "model_type": "deepseek_v41_text", "vocab_size": vocab_size, "num_key_value_heads": 1, "hidden_act": "silu",
        "swiglu_limit": 10.0, "rms_norm_eps": 1e-20, "tie_word_embeddings": False, "rope_theta": 10000,
        "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                         "original_max_position_embeddings": orig},
        "compress_rope_theta": 160000, "n_shared_experts": 1, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
        "norm_topk_prob": True, "routed_scaling_factor": 1.5, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06,
        "engram_max_ngram_size": 4, "engram_pad_token_id": 2, "engram_compressed_vocab_size": engram_classes,
        "engram_num_embeddings": [int(sum(sum(n) for n in p)) for p in primes],
        # the noise id of the release is <｜System｜>, which the demo tokenizer has right after its BPE table
        "dspark_noise_token_id": noise_id, "bos_token_id": 0, "eos_token_id": 1,
    }
    text.update(t)
    hf = {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "image_token_id": vocab_size - 1,
          "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                  "weight_block_size": [BLOCK, BLOCK], "scale_fmt": "ue8m0", "expert_dtype": "fp4"},
          "text_config": text, "torch_dtype": "bfloat16", "transformers_version": "4.57.1"}
    return hf, seq_len


# ---------------------------------------------------------------- engram hashing (spec 6.1, engine engram_hash.cpp)

def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


def engram_primes(n_layers: int, max_ngram: int, n_heads: int, vocab: int) -> list:
    """[layer][n-2][head]: per n-gram size the search restarts at vocab-1, primes used anywhere are skipped."""
    seen, out = set(), []
    for _ in range(n_layers):
        layer = []
        for _n in range(max_ngram - 1):
            cur, row = vocab - 1, []
            for _h in range(n_heads):
                c = cur + 1
                while not _is_prime(c) or c in seen:
                    c += 1
                seen.add(c)
                row.append(c)
                cur = c
            layer.append(row)
        out.append(layer)
    return out


def engram_multipliers(layer_id: int, max_ngram: int, classes: int) -> list:
    bound = max(1, (np.iinfo(np.int64).max // classes) // 2)
    m = np.random.default_rng(10007 * layer_id).integers(0, bound, size=max_ngram, dtype=np.int64)
    return [int(v) * 2 + 1 for v in m]


def engram_token_map(tok) -> list:
    """Compressed class per token id (the engine's build_engram_token_map): decode each id alone; text with U+FFFD
    keeps the raw token string, else NFKC, NFD, strip accents, lowercase, collapse whitespace, strip (a lone space
    stays); classes in first-seen order."""
    from tokenizers import Regex, normalizers
    norm = normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "), normalizers.Replace(Regex(r"^ $"), "\ue000"),
        normalizers.Strip(), normalizers.Replace("\ue000", " ")])
    classes, out = {}, []
    for i in range(tok.get_vocab_size()):
        text = tok.decode([i], skip_special_tokens=False)
        key = tok.id_to_token(i) if "\ufffd" in text else (norm.normalize_str(text) or text)
        out.append(classes.setdefault(key, len(classes)))
    return out


class EngramTables:
    """Primes, offsets, multipliers and the token map; `rows(ids)` hashes a batch (numpy int64, as the engine)."""

    def __init__(self, cfg: V41Config, token_map: list):
        self.cfg = cfg
        self.primes = engram_primes(len(cfg.engram_layers), cfg.engram_max_ngram, cfg.engram_heads, cfg.engram_vocab)
        self.flat = [np.array([p for n in layer for p in n], dtype=np.int64) for layer in self.primes]
        self.offsets = [np.concatenate([[0], np.cumsum(f)[:-1]]).astype(np.int64) for f in self.flat]
        for f, rows in zip(self.flat, cfg.engram_rows):
            assert int(f.sum()) == rows, "engram_num_embeddings must equal the sum of the layer's primes"
        self.mult = [engram_multipliers(l, cfg.engram_max_ngram, cfg.engram_classes) for l in cfg.engram_layers]
        self.token_map = np.array(token_map, dtype=np.int64)
        assert self.token_map.max() + 1 == cfg.engram_classes, "engram_compressed_vocab_size vs the tokenizer"
        self.pad = int(self.token_map[cfg.engram_pad])

    def rows(self, li: int, ids: torch.Tensor) -> torch.Tensor:
        """ids [..., T] (each row a sequence from position 0) -> table rows [..., T, n_cols] int64."""
        comp = self.token_map[ids.cpu().numpy()]
        n, nh = self.cfg.engram_max_ngram, self.cfg.engram_heads
        T = comp.shape[-1]
        r = comp * self.mult[li][0]
        cols = []
        for k in range(1, n):
            back = np.full_like(comp, self.pad)
            if k < T:
                back[..., k:] = comp[..., :T - k]
            r = r ^ (back * self.mult[li][k])
            for h in range(nh):
                c = (k - 1) * nh + h
                cols.append(r % self.flat[li][c] + self.offsets[li][c])
        return torch.from_numpy(np.stack(cols, -1))

    def to_json(self) -> dict:
        c = self.cfg
        return {"layer_ids": c.engram_layers, "num_embeddings": c.engram_rows, "max_ngram_size": c.engram_max_ngram,
                "n_heads": c.engram_heads, "head_dim": c.engram_head_dim, "compressed_vocab_size": c.engram_classes,
                "pad_id_compressed": self.pad, "primes": self.primes,
                "offsets": [o.tolist() for o in self.offsets],
                "multipliers": [[str(m) for m in ms] for ms in self.mult], "token_map": self.token_map.tolist()}


# ---------------------------------------------------------------- helpers

def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """RoPE on adjacent pairs of the last rope dims of x; cos/sin [..., rd/2] already broadcastable to x[..., :rd/2]."""
    rd = cos.size(-1) * 2
    xf = x[..., -rd:].float().unflatten(-1, (-1, 2))
    xr, xi = xf[..., 0], xf[..., 1]
    s = -sin if inverse else sin
    r = torch.stack([xr * cos - xi * s, xr * s + xi * cos], dim=-1).flatten(-2).to(x.dtype)
    return torch.cat([x[..., :-rd], r], -1)


def qdq_fp4_e4m3(x: torch.Tensor, block: int = 16) -> torch.Tensor:
    """e2m1 with e4m3 scales per block (compressed KV): amax floor 6*2^-9, s = e4m3(amax/6); result bf16."""
    g = x.float().unflatten(-1, (-1, block))
    s = dq.round_e4m3(g.abs().amax(-1, keepdim=True).clamp_min(6 * 2.0 ** -9) / 6.0)
    return (dq.round_e2m1((g / s).clamp(-6, 6)) * s).flatten(-2).to(torch.bfloat16)


def fake(x: torch.Tensor, fn, *a) -> torch.Tensor:
    """Straight-through fake quantisation with the quantise-dequantise function fn."""
    with torch.no_grad():
        xq = fn(x.detach().to(torch.bfloat16), *a)
    return x + (xq.to(x.dtype) - x).detach()


def hc_mixes(h, fn, scale, base, cfg):
    """(pre, post, comb) of the mixer: fp32, one rsqrt(mean(h^2)) over all copies, then Sinkhorn."""
    with torch.autocast(h.device.type, enabled=False):
        x = h.flatten(-2).float()
        mixes = F.linear(x, fn) * torch.rsqrt(x.square().mean(-1, keepdim=True) + cfg.norm_eps)
        return sinkhorn_split(mixes, scale, base, cfg.hc_mult, cfg.hc_sinkhorn_iters, cfg.hc_eps)


def collapse(h, pre):
    return (pre.unsqueeze(-1) * h.float()).sum(-2).to(h.dtype)


def hc_post(y, res, post, comb):
    """copy j = post[j] * y + sum_i comb[i, j] * res[i] (comb's first index summed)."""
    return post.unsqueeze(-1) * y.float().unsqueeze(-2) + (comb.unsqueeze(-1) * res.float().unsqueeze(-2)).sum(-3)


def first_stream(shape, hc, device):
    pre = torch.zeros(*shape, hc, device=device)
    pre[..., 0] = 1.0
    return pre


# ---------------------------------------------------------------- modules

class Compressor41(nn.Module):
    """ratio 2: per-channel softmax of wgate over the 2 members of a group (fp32), pooled wkv, bf16, norm;
    ratio 1: norm(wkv(x)) per token. Returns pre-RoPE latents [B, T // ratio, head_dim]."""

    def __init__(self, cfg: V41Config, ratio: int):
        super().__init__()
        self.ratio = ratio
        self.wkv = QLinear(cfg.dim, cfg.head_dim, "bf16")
        self.wgate = QLinear(cfg.dim, cfg.head_dim, "bf16") if ratio > 1 else None
        self.norm = RMSNorm(cfg.head_dim, cfg.norm_eps)

    def forward(self, x):
        r = self.ratio
        if r == 1:
            return self.norm(self.wkv(x))
        n = x.size(1) // r
        with torch.autocast(x.device.type, enabled=False):
            xs = x[:, :n * r].float()
            kv = F.linear(xs, self.wkv.weight.float()).unflatten(1, (n, r))
            sc = F.linear(xs, self.wgate.weight.float()).unflatten(1, (n, r))
            c = (kv * sc.softmax(dim=2)).sum(2)
        return self.norm(c.to(torch.bfloat16).to(x.dtype))


class Indexer41(nn.Module):
    def __init__(self, cfg: V41Config, owns_keys: bool):
        super().__init__()
        self.nh, self.hd, self.topk = cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk
        self.wq_b = QLinear(cfg.q_lora_rank, self.nh * self.hd, "fp8")
        self.weights_proj = QLinear(cfg.dim, self.nh, "bf16")
        if owns_keys:
            self.wk = QLinear(cfg.head_dim, self.hd, "bf16")
            self.k_norm = RMSNorm(self.hd, cfg.norm_eps)
        self.qat = False

    def keys(self, latent, cos, sin):
        """Index keys from the (detached) pre-RoPE latents; cos/sin at the groups' first positions."""
        k = rope(self.k_norm(self.wk(latent.detach())), cos, sin)
        return fake(k, dq.qdq_fp4_ue8m0, 32) if self.qat else k

    def scores(self, x, qr, keys, cos, sin):
        """I(t, s) = sum_h w_h relu(q_h . k_s) [B, T, N] from detached inputs (the indexer trains on its own loss)."""
        q = self.wq_b(qr.detach()).unflatten(-1, (self.nh, self.hd))
        q = rope(q, cos[:, None], sin[:, None])
        if self.qat:
            q = fake(q, dq.qdq_fp4_ue8m0, 32)
        w = self.weights_proj(x.detach()).float() * (self.hd ** -0.5 * self.nh ** -0.5)
        s = torch.einsum("bthd,bnd->bthn", q.float(), keys.float()).relu()
        return (s * w.unsqueeze(-1)).sum(2)


class Attention41(nn.Module):
    def __init__(self, cfg: V41Config, layer_id: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer_id
        self.role = cfg.roles(layer_id) if layer_id < cfg.n_layers else None
        self.H, self.D, self.rd = cfg.n_heads, cfg.head_dim, cfg.rope_head_dim
        self.attn_sink = nn.Parameter(torch.zeros(cfg.n_heads))
        self.wq_a = QLinear(cfg.dim, cfg.q_lora_rank, "fp8")
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps)
        self.wq_b = QLinear(cfg.q_lora_rank, cfg.n_heads * cfg.head_dim, "fp8")
        self.wkv = QLinear(cfg.dim, cfg.head_dim, "fp8")
        self.kv_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.wo_a = QLinear(cfg.n_heads * cfg.head_dim // cfg.o_groups, cfg.o_groups * cfg.o_lora_rank, "fp8")
        self.wo_b = QLinear(cfg.o_groups * cfg.o_lora_rank, cfg.dim, "fp8")
        r = self.role
        if r and r["compresses"]:
            self.compressor = Compressor41(cfg, r["ratio"])
        if r and r["has_indexer"]:
            self.indexer = Indexer41(cfg, r["owns_k"])
        self.qat = False
        self.index_loss = None

    def _kv(self, x, cos, sin):
        """Window K=V: kv_norm(wkv(x)), RoPE, e4m3 QDQ of the whole vector (per 32)."""
        kv = rope(self.kv_norm(self.wkv(x)), cos, sin)
        return fake(kv, dq.qdq_fp8, BLOCK) if self.qat else kv

    def _out(self, o, cos, sin):
        """Inverse RoPE at the query position, grouped wo_a (bf16 on the dequantised weight), wo_b."""
        o = rope(o, cos, sin, inverse=True)
        G = self.cfg.o_groups
        o = o.flatten(-2).unflatten(-1, (G, -1))
        wo_a = dq.fake_fp8_weight(self.wo_a.weight, BLOCK) if self.qat else self.wo_a.weight
        o = torch.einsum("...gd,grd->...gr", o, wo_a.view(G, self.cfg.o_lora_rank, -1))
        return self.wo_b(o.flatten(-2))

    def forward(self, x, ctx):
        B, T, _ = x.shape
        H, D = self.H, self.D
        r = self.role
        cos, sin = ctx.rope(r["ratio"] if r else 0, T)
        qr = self.q_norm(self.wq_a(x))
        q = rope(self.wq_b(qr).unflatten(-1, (H, D)), cos[:, None], sin[:, None])
        kv = self._kv(x, cos, sin)
        scale = D ** -0.5
        t = torch.arange(T, device=x.device)
        band = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - self.cfg.window_size)
        parts = [(torch.einsum("bthd,bsd->bhts", q, kv).float() * scale).masked_fill(~band, float("-inf"))]
        kvc = None
        self.index_loss = None
        if r:
            ratio = r["ratio"]
            if r["compresses"]:
                lat = self.compressor(x)
                g = torch.arange(lat.size(1), device=x.device) * ratio
                if r["owns_k"]:
                    ctx.index_k[self.layer] = self.indexer.keys(lat, cos[g], sin[g])
                c = rope(lat, cos[g], sin[g])
                ctx.kvc[self.layer] = fake(c, qdq_fp4_e4m3, 16) if self.qat else c
            kvc = ctx.kvc[r["comp_source"]]
            N = kvc.size(1)
            visible = torch.arange(N, device=x.device)[None, :] < ((t + 1) // ratio)[:, None]  # [T, N]
            lc = torch.einsum("bthd,bnd->bhtn", q, kvc).float() * scale
            if r["has_indexer"]:
                s = self.indexer.scores(x, qr, ctx.index_k[r["k_source"]], cos, sin).masked_fill(~visible, float("-inf"))
                with torch.no_grad():
                    sel_s = s
                    if r["cand_source"]:
                        ctx.cand = self._candidates(s, visible)
                    elif r["uses_cand"]:
                        sel_s = s.masked_fill(~ctx.cand, float("-inf"))
                    k = min(self.indexer.topk, N)
                    top = stable_topk(sel_s, k) if ctx.exact else sel_s.topk(k, dim=-1).indices
                    sel = torch.zeros(B, T, N, dtype=torch.bool, device=x.device).scatter_(-1, top, True)
                    ctx.sel = sel & visible  # selected entries beyond the visible ones are not attended
                if self.training:
                    # indexer target: the main attention over all visible compressed entries, summed over heads
                    with torch.no_grad():
                        tgt = lc.masked_fill(~visible, float("-inf")).softmax(-1).nan_to_num(0.0).sum(1)
                        tgt = tgt / tgt.sum(-1, keepdim=True).clamp_min(1e-9)
                    rows = visible.any(-1)
                    logp = F.log_softmax(s.masked_fill(~visible, -1e9), dim=-1).masked_fill(~visible, 0.0)
                    kl = (tgt * (torch.log(tgt.clamp_min(1e-9)) - logp)).sum(-1)
                    self.index_loss = kl[:, rows].mean()
            parts.append(lc.masked_fill(~ctx.sel[:, None], float("-inf")))
        parts.append(self.attn_sink.float().view(1, H, 1, 1).expand(B, H, T, 1))
        p = torch.cat(parts, dim=-1).softmax(-1)
        o = torch.einsum("bhts,bsd->bthd", p[..., :T].to(kv.dtype), kv)
        if kvc is not None:
            o = o + torch.einsum("bhtn,bnd->bthd", p[..., T:T + kvc.size(1)].to(kvc.dtype), kvc)
        return self._out(o, cos[:, None], sin[:, None])

    def _candidates(self, s, visible):
        """Level-1 mask of the candidate source: block max of the scores, the newest visible block pinned, the top
        candidate_topk_blocks blocks with a finite score."""
        B, T, N = s.shape
        bs = self.cfg.cand_bs
        nb = -(-N // bs)
        bscore = F.pad(s, (0, nb * bs - N), value=float("-inf")).view(B, T, nb, bs).amax(-1)
        vis = visible.sum(-1)  # [T]
        last = ((vis - 1).clamp_min(0) // bs)
        pin = F.one_hot(last, nb).bool() & (vis > 0)[:, None]
        bscore = bscore.masked_fill(pin[None], float("inf"))
        top = stable_topk(bscore, min(self.cfg.cand_topk, nb))
        keep = torch.zeros_like(bscore, dtype=torch.bool).scatter_(-1, top, True) & (bscore > float("-inf"))
        return keep.repeat_interleave(bs, -1)[..., :N]

    # ---- DSpark stage attention
    def main_kv(self, main_x, cos, sin):
        return self._kv(main_x, cos, sin)

    def draft(self, x, ring, ring_ok, cos, sin):
        """x [B, A, K, dim]: the draft blocks of A anchors; ring [B, A, W, D] main_kv at positions p-W+1..p of each
        anchor p (ring_ok [A, W] marks positions >= 0); cos/sin [A, K, rd/2] at the block positions p+1..p+K.
        Keys: the ring plus the block's own K=V, no causal mask inside the block."""
        H, D = self.H, self.D
        qr = self.q_norm(self.wq_a(x))
        q = rope(self.wq_b(qr).unflatten(-1, (H, D)), cos[..., None, :], sin[..., None, :])
        kv = self._kv(x, cos, sin)
        scale = D ** -0.5
        lr = torch.einsum("bakhd,bawd->bhakw", q, ring).float() * scale
        lr = lr.masked_fill(~ring_ok[None, None, :, None, :], float("-inf"))
        lb = torch.einsum("bakhd,bajd->bhakj", q, kv).float() * scale
        B, A, K = x.shape[:3]
        sink = self.attn_sink.float().view(1, H, 1, 1, 1).expand(B, H, A, K, 1)
        p = torch.cat([lr, lb, sink], -1).softmax(-1)
        W = ring.size(2)
        o = torch.einsum("bhakw,bawd->bakhd", p[..., :W].to(ring.dtype), ring)
        o = o + torch.einsum("bhakj,bajd->bakhd", p[..., W:W + K].to(kv.dtype), kv)
        return self._out(o, cos[..., None, :], sin[..., None, :])


class Engram(nn.Module):
    """rows -> fp8 table (per-32 ue8m0 scales along a row) -> bf16 concat -> wkv -> keys [hc, dim] + value [dim];
    gate_i = sigmoid(signed sqrt(<h_i, q_weight*k_weight*key_i> / (rms(h_i) rms(key_i) sqrt(dim)))), h_i += gate_i v."""

    def __init__(self, cfg: V41Config, rows: int):
        super().__init__()
        self.cfg = cfg
        self.hd, self.ncol = cfg.engram_head_dim, (cfg.engram_max_ngram - 1) * cfg.engram_heads
        self.embed = nn.Embedding(rows, self.hd)
        self.embed.weight.data.normal_(0, 0.5)
        hc, D = cfg.hc_mult, cfg.dim
        self.wkv = QLinear(self.ncol * self.hd, (hc + 1) * D, "fp8")
        self.wkv.weight.data.normal_(0, 0.5 / math.sqrt(self.ncol * self.hd))  # a small value at the start
        self.q_weight = nn.Parameter(torch.ones(hc, D))
        self.k_weight = nn.Parameter(torch.ones(hc, D))
        self.qat = False

    def forward(self, h, rows):
        e = self.embed(rows)  # [B, T, ncol, hd]
        if self.qat:
            e = fake(e, dq.qdq_fp8, BLOCK)
        kv = self.wkv(e.flatten(-2)).float()
        hc, D = self.cfg.hc_mult, self.cfg.dim
        key, value = kv[..., :hc * D].unflatten(-1, (hc, D)), kv[..., hc * D:]
        x = h.float()
        eps = self.cfg.norm_eps
        dot = (x * (self.q_weight * self.k_weight).float() * key).sum(-1)
        dot = dot * torch.rsqrt(x.square().mean(-1) + eps) * torch.rsqrt(key.square().mean(-1) + eps) / math.sqrt(D)
        gate = torch.sigmoid(torch.sign(dot) * dot.abs().clamp_min(1e-6).sqrt())
        return (x + gate.unsqueeze(-1) * value.unsqueeze(-2)).to(h.dtype)


class Block41(nn.Module):
    def __init__(self, cfg: V41Config, layer_id: int, gen: torch.Generator, dropout: float, moe_cfg=None):
        super().__init__()
        self.cfg = cfg
        out_std = 0.02 / math.sqrt(2 * (cfg.n_layers + cfg.n_mtp_layers))
        self.attn = Attention41(cfg, layer_id)
        self.attn.wo_b.weight.data.normal_(0, out_std)
        self.ffn = MoE(moe_cfg or cfg, layer_id, gen, out_std)
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        hc = cfg.hc_mult
        mix = (2 + hc) * hc
        for site in ("attn", "ffn"):
            setattr(self, f"hc_{site}_fn", nn.Parameter(torch.randn(mix, hc * cfg.dim) * (0.1 / math.sqrt(hc * cfg.dim))))
            setattr(self, f"hc_{site}_base", nn.Parameter(hc_base_init(hc)))
            setattr(self, f"hc_{site}_scale", nn.Parameter(torch.ones(3)))
        if layer_id in cfg.engram_layers:
            self.engram = Engram(cfg, cfg.engram_rows[cfg.engram_layers.index(layer_id)])
        self.drop = nn.Dropout(dropout)

    def forward(self, h, pre, ids, attn):
        """Single-pass mHC: attention input collapsed with the previous sublayer's pre, FFN input with this
        layer's attention-mixer pre; returns (h, the FFN mixer's pre)."""
        cfg = self.cfg
        a_pre, a_post, a_comb = hc_mixes(h, self.hc_attn_fn, self.hc_attn_scale, self.hc_attn_base, cfg)
        y = self.drop(attn(self.attn_norm(collapse(h, pre))))
        h = hc_post(y, h, a_post, a_comb)
        f_pre, f_post, f_comb = hc_mixes(h, self.hc_ffn_fn, self.hc_ffn_scale, self.hc_ffn_base, cfg)
        y = self.drop(self.ffn(self.ffn_norm(collapse(h, a_pre)), ids))
        return hc_post(y, h, f_post, f_comb), f_pre


class Module(nn.Module):
    """A plain container (checkpoint names such as markov_head.embed.weight)."""


class Ctx:
    """Per-forward state shared across layers: compressed KV of the kv sources, index keys of their owners, the
    latest index selection and candidate mask."""

    def __init__(self, model, exact: bool):
        self.model, self.exact = model, exact
        self.kvc, self.index_k, self.sel, self.cand = {}, {}, None, None

    def rope(self, ratio, T):
        return self.model.rope(ratio, T)


class DemoV41(nn.Module):
    def __init__(self, cfg: V41Config, seed: int = 0, dropout: float = 0.0):
        super().__init__()
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed + 1)
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.embed.weight.data.normal_(0, 1.0)
        self.layers = nn.ModuleList([Block41(cfg, i, gen, dropout) for i in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = QLinear(cfg.dim, cfg.vocab_size, "bf16", std=cfg.dim ** -0.5)
        # DSpark stages: window-only blocks with their own expert count
        dcfg = copy.copy(cfg)
        dcfg.n_routed_experts, dcfg.n_activated_experts, dcfg.n_hash_layers = cfg.dspark_experts, cfg.dspark_topk, 0
        self.mtp = nn.ModuleList([Block41(cfg, cfg.n_layers + s, gen, 0.0, dcfg) for s in range(cfg.n_mtp_layers)])
        S, R = cfg.n_mtp_layers, cfg.markov_rank
        if S:
            first, last = self.mtp[0], self.mtp[S - 1]
            first.main_proj = QLinear(len(cfg.targets) * cfg.dim, cfg.dim, "fp8")
            first.main_norm = RMSNorm(cfg.dim, cfg.norm_eps)
            last.norm = RMSNorm(cfg.dim, cfg.norm_eps)
            last.markov_head = Module()
            last.markov_head.embed = nn.Embedding(cfg.vocab_size, R)
            last.markov_head.embed.weight.data.normal_(0, 1.0)
            last.markov_head.head = QLinear(R, cfg.vocab_size, "bf16", std=0.0)  # starts without a bias
            last.confidence_head = Module()
            last.confidence_head.proj = QLinear(cfg.dim + R, 1, "bf16", std=0.0)
        for m in self.modules():
            if isinstance(m, QLinear):
                m.block = BLOCK
        self.drop = nn.Dropout(dropout)
        self._rope = {}
        self.engram_tables = None  # EngramTables, set by the caller

    def set_qat(self, on: bool):
        for m in self.modules():
            if hasattr(m, "qat"):
                m.qat = on

    def rope(self, ratio: int, T: int):
        key = (bool(ratio), T)
        if key not in self._rope:
            self._rope[key] = rope_tables(self.cfg, ratio, T, self.embed.weight.device)
        return self._rope[key]

    def backbone_params(self):
        return [p for n, p in self.named_parameters() if not n.startswith("mtp.")]

    def dspark_params(self):
        return [p for n, p in self.named_parameters() if n.startswith("mtp.")]

    def forward(self, ids: torch.Tensor, exact: bool = False):
        """ids [B, T] (from position 0) -> (logits [B, T, V] fp32, main_hidden [B, T, targets*dim] or None,
        mean indexer KL loss or None). exact: stable top-k (ties -> lower index), as the engine."""
        cfg = self.cfg
        B, T = ids.shape
        h = self.drop(self.embed(ids)).unsqueeze(2).expand(B, T, cfg.hc_mult, -1)
        pre = first_stream((B, T), cfg.hc_mult, ids.device)
        ctx = Ctx(self, exact)
        hidden, idx_losses = [], []
        for i, layer in enumerate(self.layers):
            if hasattr(layer, "engram"):
                rows = self.engram_tables.rows(cfg.engram_layers.index(i), ids).to(ids.device)
                h = layer.engram(h, rows)
            if i in cfg.targets:
                hidden.append(h.float().mean(2))  # DSpark reads the target layers' attention inputs
            h, pre = layer(h, pre, ids, lambda x, a=layer.attn: a(x, ctx))
            if layer.attn.index_loss is not None:
                idx_losses.append(layer.attn.index_loss)
        x = self.norm(collapse(h, pre))
        with torch.autocast(ids.device.type, enabled=False):
            logits = F.linear(x.float(), self.head.weight.float())
        idx_loss = torch.stack(idx_losses).mean() if idx_losses else None
        return logits, (torch.cat(hidden, -1) if hidden else None), idx_loss

    @torch.no_grad()
    def update_router_bias(self, step: float, prefix: str = ""):
        for n, m in self.named_modules():
            if isinstance(m, Gate) and not m.hash and m.load is not None and n.startswith(prefix):
                m.bias += step * torch.sign(m.load.mean() - m.load)
                m.load = None

    # ---- DSpark
    def main_x(self, hidden):
        st = self.mtp[0]
        return st.main_norm(st.main_proj(hidden))

    def markov(self, prev):
        """(bias [.., V] fp32, markov embedding [.., R]) of the previous tokens."""
        mh = self.mtp[-1].markov_head
        e = mh.embed(prev)
        with torch.autocast(prev.device.type, enabled=False):
            return F.linear(e.float(), mh.head.weight.float()), e

    def draft_blocks(self, main_x, ids, anchors, first_ids=None):
        """Draft head rows for anchors p (LongTensor [A]): block [token p+1 (or first_ids [B, A]), noise...] at
        positions p+1..p+K over the stage windows of main_x [B, T', dim] (rows <= p used).
        Returns (head logits [B, A, K, V] fp32 without the Markov bias, collapsed rows x [B, A, K, dim])."""
        cfg = self.cfg
        B = main_x.size(0)
        A, K, W = anchors.numel(), cfg.block_size, cfg.window_size
        dev = main_x.device
        tok = torch.full((B, A, K), cfg.noise_id, dtype=torch.long, device=dev)
        tok[:, :, 0] = ids[:, anchors + 1] if first_ids is None else first_ids
        pos = anchors[:, None] + 1 + torch.arange(K, device=dev)  # [A, K]
        Tm = main_x.size(1)
        cos, sin = self.rope(0, int(max(Tm, int(pos.max()) + 1)))
        ring_pos = anchors[:, None] - W + 1 + torch.arange(W, device=dev)  # [A, W]
        ring_ok = ring_pos >= 0
        h = self.embed(tok).unsqueeze(-2).expand(B, A, K, cfg.hc_mult, -1)
        pre = first_stream((B, A, K), cfg.hc_mult, dev)
        for st in self.mtp:
            mkv = st.attn.main_kv(main_x, cos[:Tm], sin[:Tm])
            ring = mkv[:, ring_pos.clamp_min(0)]  # [B, A, W, D]
            h, pre = st(h, pre, tok, lambda x, a=st.attn: a.draft(x, ring, ring_ok, cos[pos], sin[pos]))
        x = collapse(h, pre)
        y = self.mtp[-1].norm(x)
        with torch.autocast(dev.type, enabled=False):
            logits = F.linear(y.float(), self.head.weight.float())
        return logits, x

    def confidence(self, x, e):
        proj = self.mtp[-1].confidence_head.proj
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(torch.cat([x.float(), e.float()], -1), proj.weight.float())[..., 0]

    @torch.no_grad()
    def draft_greedy(self, main_x, ids_row, p: int, anchor: int):
        """The engine's Model::draft for one sequence: the block after position p with anchor -> (draft ids [K],
        logits [K, V], confidence [K])."""
        a = torch.tensor([p], device=main_x.device)
        logits, x = self.draft_blocks(main_x[:, :p + 1], ids_row, a,
                                      first_ids=torch.tensor([[anchor]], device=main_x.device))
        logits, x = logits[0, 0], x[0, 0]
        out = [anchor]
        embs = []
        for i in range(self.cfg.block_size):
            bias, e = self.markov(torch.tensor(out[-1], device=main_x.device))
            logits[i] += bias
            embs.append(e)
            out.append(int(torch.argmax(logits[i])))
        conf = self.confidence(x, torch.stack(embs))
        return out[1:], logits, conf


# ---------------------------------------------------------------- export in the released V4.1 encoding

_BF16_SUFFIXES = ("norm.weight", "embed.weight", "gate.weight", "q_weight", "k_weight")


def export_tensors(model: DemoV41) -> dict:
    """Checkpoint-native names -> tensors in the released dtypes: FP8 e4m3 + ue8m0 per 32x32 tile, FP4 experts,
    fp8 engram tables with ue8m0 per 32 along a row, BF16 embed/head/norms/router/compressor/indexer wk and
    weights_proj/markov/confidence, F32 sinks/gate bias/mHC; gate.bias_vl (unused, vision) on backbone layers."""
    kinds = {f"{n}.weight": m.kind for n, m in model.named_modules() if isinstance(m, QLinear)}
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().cpu()
        kind = kinds.get(name)
        if name.endswith("engram.embed.weight"):
            q, s = dq.act_quant(t.float(), BLOCK)
            out[name] = q.to(torch.float8_e4m3fn)
            out[name[:-len("weight")] + "scale"] = dq.scale_to_e8m0(s)
        elif kind == "fp8":
            q, s = dq.quantize_fp8_block(t.float(), BLOCK)
            out[name], out[name[:-len("weight")] + "scale"] = q, s
        elif kind == "fp4":
            q, s = dq.quantize_fp4_rows(t.float())
            out[name], out[name[:-len("weight")] + "scale"] = q, s
        elif kind == "bf16" or name.endswith(_BF16_SUFFIXES):
            out[name] = t.to(torch.bfloat16).contiguous()
        else:
            out[name] = t.float().contiguous()
        if name.startswith("layers.") and name.endswith("ffn.gate.bias"):
            out[name + "_vl"] = t.float().clone()
    return out


def load_exported(model: DemoV41, tensors: dict):
    """Sets the model's parameters to the dequantised values of exported tensors (for the fp32 evaluation of a
    checkpoint exactly as stored)."""
    state = {}
    for name, t in tensors.items():
        if name.endswith(".scale") or name.endswith("bias_vl"):
            continue
        t = t.cpu()
        if t.dtype == torch.float8_e4m3fn:
            s = tensors[name[:-len("weight")] + "scale"].cpu()
            if name.endswith("engram.embed.weight"):
                v = t.float() * dq.e8m0_to_f32(s).repeat_interleave(BLOCK, 1)
            else:
                v = dq.dequant_fp8_block(t, s, BLOCK)
        elif t.dtype == torch.int8:
            v = dq.dequant_fp4_rows(t, tensors[name[:-len("weight")] + "scale"].cpu())
        else:
            v = t.float()
        state[name] = v
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all(k.endswith("tid2eid") for k in missing), missing
