"""Checks the engine-exact torch evaluation (demo_exact.py) against the golden prefill logits of the
dsv4-tiny-a fixture (DeepSeek's official V4 inference code): per-row max |logit diff| <= 0.1 on every row
and top-1 agreement >= 99% (the fixture README's prefill acceptance). Exit status 0 when both hold."""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo_exact import load_exact  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", default=os.path.join(HERE, "..", "tests", "fixtures", "dsv4-tiny-a"))
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    model = load_exact(args.fixture, args.device)
    ids = [int(v) for v in open(os.path.join(args.fixture, "cases", "prefill.ids")).read().split(",")]
    gold = np.fromfile(os.path.join(args.fixture, "cases", "prefill.logits.f32"), dtype=np.float32)
    gold = gold.reshape(len(ids), -1)
    logits, _ = model.forward(torch.tensor([ids]))
    got = logits[0].cpu().numpy()
    row = np.abs(got - gold).max(axis=1)
    top1 = float((got.argmax(1) == gold.argmax(1)).mean())
    ok = bool(row.max() <= 0.1 and top1 >= 0.99)
    print(f"dsv4-tiny-a prefill ({len(ids)} rows): per-row max abs diff max {row.max():.4g} "
          f"p50 {np.median(row):.4g} p99 {np.quantile(row, 0.99):.4g}; rows <= 1e-2: {(row <= 1e-2).mean():.1%}; "
          f"first row > 1e-2: {int(np.argmax(row > 1e-2)) if (row > 1e-2).any() else -1}; top-1 agree {top1:.1%} "
          f"-> {'PASS' if ok else 'FAIL'} (bounds: max <= 0.1, top-1 >= 99%)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
