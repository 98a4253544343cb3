"""Generate a tiny DeepSeek-V4-Flash checkpoint in the released format (model.safetensors +
config.json + inference_config.json), names/dtypes as the dsv4-tiny-a fixture README lists,
seeded random init with gains close to dsv4-tiny-a's tensor statistics.

  python3 make_v4_checkpoint.py OUT_DIR [--seed 5000] [--set key=value ...]

Trait keys (--set, JSON values) use the official ModelArgs names: dim, n_layers, compress_ratios,
n_hash_layers, n_heads, q_lora_rank, o_groups, o_lora_rank, n_routed_experts, n_activated_experts,
moe_inter_dim, window_size, index_n_heads, index_topk, vocab_size, ... Defaults = the traits
checkpoint of the bisect (4 layers [0,0,4,128], hidden 384, 8 heads, ...).
"""
import argparse, json, math, os, sys

import torch
from safetensors.torch import save_file

torch.set_num_threads(1)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import demo_quant as dq  # noqa: E402
from demo_quant import quantize_fp8_block as quant_fp8  # noqa: E402

TRAITS = dict(
    vocab_size=320, dim=384, moe_inter_dim=128, n_layers=4, n_hash_layers=3, n_mtp_layers=0,
    n_heads=8, n_routed_experts=6, n_shared_experts=1, n_activated_experts=2,
    score_func="sqrtsoftplus", route_scale=1.5, swiglu_limit=10.0, q_lora_rank=256,
    head_dim=128, rope_head_dim=64, norm_eps=1e-6, o_groups=4, o_lora_rank=64, window_size=32,
    compress_ratios=[0, 0, 4, 128], compress_rope_theta=160000, original_seq_len=64,
    rope_theta=10000, rope_factor=16, beta_fast=32, beta_slow=1, index_n_heads=12,
    index_head_dim=128, index_topk=8, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
    dtype="fp8", scale_fmt="ue8m0", expert_dtype="fp4", max_seq_len=256,
)


def quant_fp4(w):
    """fp32 [out,in] -> int8 [out,in/2] packed e2m1 (low nibble = even column) + e8m0 scale per 32: the demo's
    quantize_fp4_rows, except that a negative value rounding to zero is written as +0 (code 0), as in dsv4-tiny-b."""
    g = w.float().unflatten(-1, (-1, 32))
    s = dq.pow2_scale(g.abs().amax(-1).clamp_min(6 * 2.0 ** -126), dq.FP4_MAX)
    codes = dq.e2m1_codes((g / s.unsqueeze(-1)).clamp(-dq.FP4_MAX, dq.FP4_MAX)).flatten(-2)
    codes = torch.where(codes == 8, 0, codes)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).view(torch.int8), dq.scale_to_e8m0(s)


def make(a, seed):
    gen = torch.Generator().manual_seed(seed)
    rn = lambda *shape: torch.randn(*shape, generator=gen)
    ru = lambda *shape: torch.rand(*shape, generator=gen)
    T = {}
    D, V, hc = a["dim"], a["vocab_size"], a["hc_mult"]
    mix = (2 + hc) * hc

    def fp8(name, o, i, gain):
        T[name + ".weight"], T[name + ".scale"] = quant_fp8(rn(o, i) * gain / math.sqrt(i))

    def bf16(name, o, i, gain):
        T[name] = (rn(o, i) * gain / math.sqrt(i)).to(torch.bfloat16)

    def norm(name, n, mean):
        T[name] = (mean * (1 + 0.1 * rn(n))).to(torch.bfloat16)

    T["embed.weight"] = (rn(V, D) * 0.12).to(torch.bfloat16)
    for L in range(a["n_layers"]):
        p = f"layers.{L}."
        r = a["compress_ratios"][L]
        H, hd, rd = a["n_heads"], a["head_dim"], a["rope_head_dim"]
        T[p + "attn.attn_sink"] = rn(H) * 0.5
        fp8(p + "attn.wq_a", a["q_lora_rank"], D, 1.6)
        norm(p + "attn.q_norm.weight", a["q_lora_rank"], 0.98)
        fp8(p + "attn.wq_b", H * hd, a["q_lora_rank"], 0.95)
        fp8(p + "attn.wkv", hd, D, 1.8)
        norm(p + "attn.kv_norm.weight", hd, 0.4)
        fp8(p + "attn.wo_a", a["o_groups"] * a["o_lora_rank"], H * hd // a["o_groups"], 1.6)
        fp8(p + "attn.wo_b", D, a["o_groups"] * a["o_lora_rank"], 1.9)
        if r:
            coff = 2 if r == 4 else 1
            comps = [("attn.compressor", hd, 0.6)]
            if r == 4:
                comps.append(("attn.indexer.compressor", a["index_head_dim"], 0.5))
            for c, d, nm in comps:
                T[p + c + ".ape"] = rn(r, coff * d) * 0.5
                norm(p + c + ".norm.weight", d, nm)
                bf16(p + c + ".wkv.weight", coff * d, D, 1.0)
                bf16(p + c + ".wgate.weight", coff * d, D, 1.0)
            if r == 4:
                fp8(p + "attn.indexer.wq_b", a["index_n_heads"] * a["index_head_dim"], a["q_lora_rank"], 0.95)
                bf16(p + "attn.indexer.weights_proj.weight", a["index_n_heads"], D, 1.0)
        norm(p + "attn_norm.weight", D, 0.025)
        norm(p + "ffn_norm.weight", D, 0.2)
        E, I, k = a["n_routed_experts"], a["moe_inter_dim"], a["n_activated_experts"]
        bf16(p + "ffn.gate.weight", E, D, 2.9)
        if L < a["n_hash_layers"]:
            T[p + "ffn.gate.tid2eid"] = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(V)]).long()
        else:
            T[p + "ffn.gate.bias"] = ru(E)
        for e in range(E):
            for w, (o, i) in {"w1": (I, D), "w2": (D, I), "w3": (I, D)}.items():
                name = f"{p}ffn.experts.{e}.{w}"
                T[name + ".weight"], T[name + ".scale"] = quant_fp4(rn(o, i) * 1.0 / math.sqrt(i))
        fp8(p + "ffn.shared_experts.w1", I, D, 1.5)
        fp8(p + "ffn.shared_experts.w2", D, I, 1.05)
        fp8(p + "ffn.shared_experts.w3", I, D, 1.5)
        for f in ("attn", "ffn"):
            T[p + f"hc_{f}_fn"] = rn(mix, hc * D) * 0.031
            T[p + f"hc_{f}_base"] = rn(mix) * 0.5
            T[p + f"hc_{f}_scale"] = rn(3) * 0.3
    norm("norm.weight", D, 1.0)
    T["head.weight"] = (rn(V, D) / math.sqrt(D)).to(torch.bfloat16)
    T["hc_head_fn"] = rn(hc, hc * D) * 0.031
    T["hc_head_base"] = rn(hc) * 0.5
    T["hc_head_scale"] = ru(1) * 0.5
    return {k: v.contiguous() for k, v in T.items()}


def hf_config(a):
    """The released config.json key set (as dsv4-tiny-a's)."""
    return {
        "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 0, "eos_token_id": 1, "expert_dtype": "fp4", "hc_eps": a["hc_eps"],
        "hc_mult": a["hc_mult"], "hc_sinkhorn_iters": a["hc_sinkhorn_iters"], "head_dim": a["head_dim"],
        "hidden_act": "silu", "hidden_size": a["dim"], "index_head_dim": a["index_head_dim"],
        "index_n_heads": a["index_n_heads"], "index_topk": a["index_topk"], "initializer_range": 0.02,
        "max_position_embeddings": a["max_seq_len"], "model_type": "deepseek_v4",
        "moe_intermediate_size": a["moe_inter_dim"], "n_routed_experts": a["n_routed_experts"],
        "n_shared_experts": a["n_shared_experts"], "norm_topk_prob": True,
        "num_attention_heads": a["n_heads"], "num_experts_per_tok": a["n_activated_experts"],
        "num_hidden_layers": a["n_layers"], "num_hash_layers": a["n_hash_layers"],
        "num_key_value_heads": 1, "num_nextn_predict_layers": a["n_mtp_layers"],
        "o_groups": a["o_groups"], "o_lora_rank": a["o_lora_rank"], "q_lora_rank": a["q_lora_rank"],
        "qk_rope_head_dim": a["rope_head_dim"],
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
        "rms_norm_eps": a["norm_eps"],
        "rope_scaling": {"beta_fast": a["beta_fast"], "beta_slow": a["beta_slow"], "factor": a["rope_factor"],
                         "original_max_position_embeddings": a["original_seq_len"], "type": "yarn"},
        "rope_theta": a["rope_theta"], "routed_scaling_factor": a["route_scale"],
        "scoring_func": a["score_func"], "sliding_window": a["window_size"], "swiglu_limit": a["swiglu_limit"],
        "tie_word_embeddings": False, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
        "transformers_version": "4.57.1", "use_cache": True, "vocab_size": a["vocab_size"],
        "compress_rope_theta": a["compress_rope_theta"], "compress_ratios": a["compress_ratios"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=5000)
    ap.add_argument("--set", nargs="*", default=[], help="key=JSON overrides of the traits")
    ap.add_argument("--ids", type=int, default=160, help="also write ids.txt with this many random ids")
    ap.add_argument("--ids-seed", type=int, default=5000000)
    args = ap.parse_args()
    a = dict(TRAITS)
    for kv in args.set:
        k, v = kv.split("=", 1)
        assert k in a, k
        a[k] = json.loads(v)
    assert len(a["compress_ratios"]) == a["n_layers"]
    os.makedirs(args.out, exist_ok=True)
    save_file(make(a, args.seed), os.path.join(args.out, "model.safetensors"))
    json.dump(hf_config(a), open(os.path.join(args.out, "config.json"), "w"), indent=1)
    json.dump(a, open(os.path.join(args.out, "inference_config.json"), "w"), indent=1)
    g = torch.Generator().manual_seed(args.ids_seed)
    ids = torch.randint(0, a["vocab_size"], (args.ids,), generator=g).tolist()
    open(os.path.join(args.out, "ids.txt"), "w").write(",".join(map(str, ids)) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
