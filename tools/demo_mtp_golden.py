#!/usr/bin/env python3
"""Goldens of the V4 demo model's MTP layer for tests/model/test_demo_model.cpp: for prefixes of the first held-out
chunk, the layer's logits at the prefix's last hidden state beside the token after it (the engine's first draft
after feeding the prefix, with that token as the anchor), from the engine-exact torch model (demo_exact.py) with
the layer's RoPE positions one on, as the engine keeps them.

    python3 tools/demo_mtp_golden.py models/peregrine-demo-v4 tests/fixtures/demo-v4/demo_heldout.json \\
        tests/fixtures/demo-v4/mtp_drafts.json
"""
import json
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from demo_exact import load_exact  # noqa: E402


def main():
    model_dir, heldout, out = sys.argv[1:4]
    ids = json.load(open(heldout))["chunks"][0]["ids"]
    exact = load_exact(model_dir, native_ops=False)  # every sum exact, as the engine
    # The backbone's hidden states of one prefill (demo_exact.py follows the engine's sums bit for bit on the
    # demo's first 5 held-out positions; later ones depart where its compressor and indexer differ).
    x = torch.tensor([ids[:41]])
    _, h = exact.forward(x)
    cases = []
    for n in (1, 3, 5):
        logits = exact.mtp_forward(h[:, :n], x[:, 1:n + 1], pos0=1)[0, -1].float()
        cases.append({"prefix": ids[:n], "anchor": ids[n], "logits": [float(v) for v in logits.tolist()]})
    json.dump({"cases": cases}, open(out, "w"))


if __name__ == "__main__":
    main()
