"""Speculative decoding against a running `peregrine serve`: held-out Shakespeare prompts (the tail of
tools/data/tinyshakespeare.txt that the demo models never saw) at each concurrency, greedy, streamed; prints TPOT,
output tok/s and the accept length the server's /metrics report over the run, and writes them (with the generated
texts, to compare runs with and without speculation) as JSON.

Usage: python3 bench/spec_decoding.py --url http://127.0.0.1:30000 --label dspark --out results.json
"""
import argparse
import concurrent.futures
import json
import os
import re
import time
import urllib.request

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../tools/data/tinyshakespeare.txt")


def prompts(n, chars=400):
    text = open(DATA, encoding="utf-8").read()
    tail = text[int(len(text) * 0.95):]
    return [tail[i * chars:(i + 1) * chars] for i in range(n)]


def spec_totals(url):
    body = urllib.request.urlopen(url + "/metrics").read().decode()
    tot = {"sum": 0.0, "count": 0.0}
    for k in tot:
        for m in re.finditer(r"^peregrine:spec_accept_length_%s\{[^}]*\} (\S+)$" % k, body, re.M):
            tot[k] += float(m.group(1))
    return tot


def one(url, prompt, max_tokens):
    req = urllib.request.Request(url + "/v1/completions", json.dumps({
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}).encode(),
        {"Content-Type": "application/json"})
    t0, first, text = time.perf_counter(), None, ""
    with urllib.request.urlopen(req) as r:
        for line in r:
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                piece = json.loads(line[6:])["choices"][0]["text"]
                if piece:
                    first = first or time.perf_counter()
                    text += piece
    end = time.perf_counter()
    # ignore_eos: exactly max_tokens tokens (a chunk may carry several: a verify step's tokens arrive together)
    return first - t0, (end - first) / max(max_tokens - 1, 1), max_tokens, text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--label", required=True)
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = []
    for c in [int(x) for x in a.concurrency.split(",")]:
        ps = prompts(max(2 * c, 4))
        one(a.url, ps[0], 4)  # warm-up
        s0 = spec_totals(a.url)
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(c) as ex:
            res = list(ex.map(lambda p: one(a.url, p, a.max_tokens), ps))
        dur = time.perf_counter() - t0
        s1 = spec_totals(a.url)
        steps = s1["count"] - s0["count"]
        row = {"label": a.label, "concurrency": c, "requests": len(ps),
               "output_tok_s": sum(r[2] for r in res) / dur,
               "tpot_ms_mean": 1e3 * sum(r[1] for r in res) / len(res),
               "ttft_ms_mean": 1e3 * sum(r[0] for r in res) / len(res),
               "accept_length": (s1["sum"] - s0["sum"]) / steps if steps else None,
               "texts": [r[3] for r in res]}  # greedy: the same with and without speculation
        rows.append(row)
        print(f"{a.label:>12} c={c:<3} out tok/s {row['output_tok_s']:8.1f}  TPOT {row['tpot_ms_mean']:8.2f} ms  "
              f"TTFT {row['ttft_ms_mean']:8.1f} ms  accept length "
              f"{row['accept_length'] if row['accept_length'] is None else round(row['accept_length'], 2)}", flush=True)
    if a.out:
        json.dump(rows, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
