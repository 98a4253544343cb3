"""DeepSeek's official V4 inference/model.py, run on the CPU or a GPU with our torch port of its kernels
(v4_kernels.py): the reference Peregrine's V4 path is checked against.

  python3 tools/reference/run_official_v4.py MODEL_PY CKPT_DIR --ids-file IDS [--device cuda --torch-sums]
        [--out LOGITS.f32] [--golden-json OUT.json --top K] [--decode-from P] [--dump DIR]

MODEL_PY is the release's inference/model.py (not part of this repository: its sha256 is printed). CKPT_DIR holds
model.safetensors and inference_config.json (the official ModelArgs). Dtype path = generate.py: torch default
dtype bf16, ModelArgs(max_batch_size=1, **inference_config.json). Weights are loaded as convert.py + load_model
do. Sums that model.py leaves to torch (F.linear, its two einsums, RMSNorm's mean) are evaluated exactly and
rounded once, so the result does not depend on BLAS order (--torch-sums leaves them to torch); nothing else
changes. Prefill asks the head for every position (row t = logits after position t). --golden-json keeps each
row's top K ids and logits.
"""
import argparse, hashlib, importlib.util, json, os, sys, types

import torch
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import v4_kernels

torch.set_num_threads(1)


def load_official(model_py):
    # model.py does `from kernel import ...` and `from fast_hadamard_transform import hadamard_transform`
    sys.modules["kernel"] = v4_kernels
    fht = types.ModuleType("fast_hadamard_transform")
    fht.hadamard_transform = v4_kernels.hadamard_transform
    sys.modules["fast_hadamard_transform"] = fht
    spec = importlib.util.spec_from_file_location("official_model", model_py)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build(mod, ckpt):
    torch.set_default_dtype(torch.bfloat16)
    cfg = json.load(open(os.path.join(ckpt, "inference_config.json")))
    args = mod.ModelArgs(max_batch_size=1, **cfg)
    model = mod.Transformer(args)
    params = dict(model.named_parameters())
    seen = set()
    with safe_open(os.path.join(ckpt, "model.safetensors"), "pt") as f:
        names = list(f.keys())
        for name in names:
            t = f.get_tensor(name)
            if name.endswith("wo_a.scale"):
                continue
            if name.endswith("wo_a.weight"):  # convert.py: dequantise wo_a to bf16 with its 128x128 scales
                s = f.get_tensor(name.replace("weight", "scale")).float()
                t = t.unflatten(0, (-1, 128)).unflatten(-1, (-1, 128)).float() * s[:, None, :, None]
                t = t.flatten(2, 3).flatten(0, 1)
                t = t.to(torch.bfloat16)
            p = params[name]
            if p.dtype == torch.float4_e2m1fn_x2:
                t = t.view(torch.float4_e2m1fn_x2)
            elif t.dtype != p.dtype:
                t = t.to(p.dtype)  # bf16 -> fp32 declared params, I64 tid2eid -> int32
            assert t.shape == p.shape, (name, t.shape, p.shape)
            with torch.no_grad():
                p.data = t.contiguous().clone().to(p.device)
            seen.add(name)
    missing = set(params) - seen - {n for n in params if n.endswith("wo_a.scale")}
    assert not missing, missing
    # re-attach .scale attributes (Linear.forward reads weight.scale)
    for m in model.modules():
        if isinstance(m, mod.Linear) and m.scale is not None:
            m.weight.scale = m.scale
    return model


class _Proxy:
    """Module stand-in: every attribute from `real` except the overrides."""
    def __init__(self, real, **over):
        self._real, self._over = real, over
    def __getattr__(self, n):
        return self._over[n] if n in self._over else getattr(self._real, n)


def exact_mode(mod):
    """Remove BLAS/reduction-order noise from the ops model.py leaves to torch (not the kernels):
    F.linear (fp32 gate/hc/compressor/head, bf16 weights_proj) and the two bf16 einsums are evaluated
    exactly in float64 and rounded once to fp32 (then to the output dtype); RMSNorm's mean of squares is
    summed in float64. None of this changes the official op order; it only makes each sum canonical."""
    F64 = torch.float64
    def linear(x, w, b=None):
        assert b is None
        y = torch.matmul(x.to(F64), w.to(F64).t()).to(torch.float32)
        return y.to(x.dtype)
    def einsum(eq, a, b):
        return torch.einsum(eq, a.to(F64), b.to(F64)).to(torch.float32).to(a.dtype)
    over_f, over_t = dict(linear=linear), dict(einsum=einsum)
    mod.F = _Proxy(torch.nn.functional, **over_f)
    mod.torch = _Proxy(torch, **over_t)
    def rms_forward(self, x):
        dtype = x.dtype
        x = x.float()
        var = (x.square().to(F64).sum(-1, keepdim=True).to(torch.float32) / x.size(-1))
        x = x * torch.rsqrt(var + self.eps)
        return (self.weight * x).to(dtype)
    mod.RMSNorm.forward = rms_forward


def all_logits(mod, model):
    """Make ParallelHead.get_logits return every position (the reference returns only the last)."""
    def get_logits(self, x):
        return torch.nn.functional.linear(x.float(), self.weight)
    model.head.get_logits = types.MethodType(get_logits, model.head)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_py")
    ap.add_argument("ckpt")
    ap.add_argument("--ids-file", required=True)
    ap.add_argument("--out", default="")
    ap.add_argument("--golden-json", default="")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--decode-from", type=int, default=0)
    ap.add_argument("--dump", default="", help="save every module's output (forward hooks) to DIR/hooks.pt")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (TF32 and reduced-precision bf16 sums off)")
    ap.add_argument("--torch-sums", action="store_true",
                    help="leave model.py's own sums to torch (as on the GPU the goldens come from), not exact")
    a = ap.parse_args()
    sha = hashlib.sha256(open(a.model_py, "rb").read()).hexdigest()
    print(f"model.py sha256 {sha}")
    ids = [int(x) for x in open(a.ids_file).read().strip().split(",")]
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.set_default_device(a.device)
    mod = load_official(a.model_py)
    if not a.torch_sums:
        exact_mode(mod)
    model = build(mod, a.ckpt)
    all_logits(mod, model)
    dumps = {}
    if a.dump:
        def hook(name):
            def f(m, inp, out):
                outs = out if isinstance(out, tuple) else (out,)
                for i, o in enumerate(outs):
                    if isinstance(o, torch.Tensor):
                        dumps[name if len(outs) == 1 else f"{name}#{i}"] = o.detach().clone()
            return f
        for n, m in model.named_modules():
            if n:
                m.register_forward_hook(hook(n))
    x = torch.tensor([ids])
    if a.decode_from:
        P = a.decode_from
        rows = [model(x[:, :P], 0)[0, -1:]] + [model(x[:, p:p + 1], p)[0, -1:] for p in range(P, len(ids))]
    else:
        rows = [model(x, 0)[0]]
    logits = torch.cat(rows).float().cpu()
    if a.out:
        logits.numpy().tofile(a.out)
    if a.golden_json:
        top = logits.topk(a.top, dim=-1)
        json.dump({"model_py_sha256": sha, "ids": ids, "decode_from": a.decode_from,
                   "top_ids": top.indices.tolist(), "top_logits": top.values.tolist()}, open(a.golden_json, "w"))
    print(f"{logits.shape[0]} rows of {logits.shape[1]} logits")
    if a.dump:
        os.makedirs(a.dump, exist_ok=True)
        torch.save(dumps, os.path.join(a.dump, "hooks.pt"))


if __name__ == "__main__":
    main()
