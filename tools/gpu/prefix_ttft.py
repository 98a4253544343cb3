#!/usr/bin/env python3
"""Time to first token of a long prompt sent cold, re-sent (a device-cache hit), continued by a next turn, and
forked early, against a running `peregrine serve` (native /generate with input ids, so any model works).

    tools/gpu/prefix_ttft.py --url http://127.0.0.1:30000 --tokens 32768 [--json out.json]

Each request generates one token (max_new_tokens 1), so its latency is its time to first token. The server's
/flush_cache runs first so the cold request is cold.
"""
import argparse
import json
import random
import time
import urllib.request


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as r:
        out = json.loads(r.read() or b"{}")
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--vocab", type=int, default=100000, help="ids drawn from [100, vocab)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    rng = random.Random(0)
    prompt = [rng.randrange(100, a.vocab) for _ in range(a.tokens)]
    post(a.url + "/flush_cache", {})
    cases = [
        ("cold", prompt),
        ("re-sent (device hit)", prompt),
        ("next turn (+64 tokens)", prompt + [rng.randrange(100, a.vocab) for _ in range(64)]),
        ("fork at half", prompt[: a.tokens // 2] + [7, 8, 9]),
    ]
    rows = []
    print(f"{'request':<40} {'prompt':>8} {'cached':>8} {'TTFT ms':>10}")
    for name, ids in cases:
        sec, out = post(a.url + "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1,
                                                                                   "temperature": 0}})
        cached = out.get("meta_info", {}).get("cached_tokens", -1)
        rows.append({"request": name, "prompt_tokens": len(ids), "cached_tokens": cached, "ttft_ms": sec * 1e3})
        print(f"{name:<40} {len(ids):>8} {cached:>8} {sec * 1e3:>10.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"tokens": a.tokens, "results": rows}, f, indent=2)


if __name__ == "__main__":
    main()
