"""End-to-end tests of `peregrine serve` on the tiny fixture model (byte-level text), with the official
openai client for the OpenAI API and raw HTTP for everything a client library would refuse to send."""
import gzip
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

import openai
import pytest

BIN = os.environ.get("PEREGRINE_BINARY", os.path.join(os.path.dirname(__file__), "../../build/peregrine"))
FIX = os.environ.get("PEREGRINE_FIXTURES", os.path.join(os.path.dirname(__file__), "../fixtures"))
MODEL = os.path.join(FIX, "dsv4-tiny-a")
NAME = "tiny"


class Server:
    def __init__(self, *extra, model=MODEL):  # model None: the arguments choose (--synthetic)
        self.proc = subprocess.Popen([BIN, "serve", "--port", "0", *(("--model", model, "--served-model-name", NAME) if model else ()),
                                      *(() if "--context-length" in extra else ("--context-length", "256")), *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"http://([\d.]+):(\d+)", line)
        assert m, f"server did not start: {line!r}"
        self.port = int(m.group(2))
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, key="none"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=60)

    def raw(self, method, path, body=None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def metrics(self):
        status, text = self.raw("GET", "/metrics")
        assert status == 200
        out = {}
        for line in text.decode().splitlines():
            if line.startswith("peregrine:") and "_bucket" not in line:
                name, value = line.rsplit(" ", 1)
                out[name.split("{")[0][len("peregrine:"):]] = float(value)
        return out

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def server():
    s = Server("--kv-memory", "64M")
    yield s
    s.stop()


def test_models_and_health(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [NAME]
    assert server.raw("GET", "/health")[0] == 200


def test_chat_non_streaming_and_streaming_agree(server):
    c = server.client()
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    r = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 20
    text = ""
    usage = None
    for chunk in c.chat.completions.create(model=NAME, messages=msgs, max_tokens=8, temperature=0, stream=True,
                                           stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
    assert text == r.choices[0].message.content
    assert usage.completion_tokens == r.usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens > 0  # same prompt again: a prefix-cache hit


def test_completions_stream_and_n(server):
    c = server.client()
    r = c.completions.create(model=NAME, prompt="The quick brown fox", max_tokens=6, temperature=0, logprobs=2)
    assert len(r.choices[0].logprobs.token_logprobs) == r.usage.completion_tokens
    text = "".join(ch.choices[0].text for ch in c.completions.create(
        model=NAME, prompt="The quick brown fox", max_tokens=6, temperature=0, stream=True) if ch.choices)
    assert text == r.choices[0].text
    r2 = c.completions.create(model=NAME, prompt="abc", max_tokens=5, temperature=1.0, seed=3, n=3)
    assert sorted(ch.index for ch in r2.choices) == [0, 1, 2]
    r3 = c.completions.create(model=NAME, prompt="abc", max_tokens=5, temperature=1.0, seed=3, n=3)
    assert [ch.text for ch in r2.choices] == [ch.text for ch in r3.choices]  # seeded: reproducible


def test_prefix_cache_hit_gives_identical_output(server):
    c = server.client()
    prompt = "A long shared prefix for the cache test, well over two pages of bytes. " * 2
    cold = c.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0)
    warm = c.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0)
    assert warm.choices[0].text == cold.choices[0].text
    assert warm.usage.prompt_tokens_details.cached_tokens >= 16 * (len(prompt) // 16 - 1)
    assert server.metrics()["cache_hit_rate"] > 0
    # Flushed: the same request is cold again and still identical.
    assert server.raw("POST", "/flush_cache")[0] == 200
    again = c.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    assert again.choices[0].text == cold.choices[0].text


def test_64_concurrent_streams(server):
    c = server.client()
    results = [None] * 64

    def one(i):
        n = 0
        for chunk in c.completions.create(model=NAME, prompt=f"stream {i}", max_tokens=8, temperature=0.7, seed=i,
                                          stream=True, stream_options={"include_usage": True}):
            if chunk.usage:
                n = chunk.usage.completion_tokens
        results[i] = n

    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is not None and r >= 1 for r in results), results


def test_disconnect_frees_memory():
    # A long context so that the request is certainly still generating when the client goes away.
    server = Server("--context-length", "4096", "--kv-memory", "64M")
    try:
        _disconnect(server)
        _disconnect_non_streaming(server)
    finally:
        server.stop()


def _disconnect_non_streaming(server):
    """A client waiting for a whole (non-streamed) answer hangs up: the request is cancelled too."""
    before = server.metrics()
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"model": NAME, "prompt": "wait for me " * 4, "max_tokens": 4000, "ignore_eos": True}),
        headers={"Content-Type": "application/json"})
    for _ in range(200):
        if server.metrics()["num_running_reqs"] == 1:
            break
        time.sleep(0.01)
    c.close()
    for _ in range(250):
        m = server.metrics()
        if m["num_aborted_requests_total"] > before["num_aborted_requests_total"]:
            break
        time.sleep(0.02)
    assert m["num_aborted_requests_total"] == before["num_aborted_requests_total"] + 1
    assert m["num_running_reqs"] == 0 and m["num_used_tokens"] == 0
    assert m["generation_tokens_total"] - before["generation_tokens_total"] < 4000


def _disconnect(server):
    before = server.metrics()
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"model": NAME, "prompt": "disconnect me " * 4, "max_tokens": 4000, "ignore_eos": True, "stream": True}),
        headers={"Content-Type": "application/json"})
    r = c.getresponse()
    while not r.fp.readline().startswith(b"data:"):  # until the first token: the request is running
        pass
    r.close()  # the response holds the socket open too
    c.close()
    # The abort is counted when the request finishes; the gauges are published at the end of that engine step.
    for _ in range(250):
        m = server.metrics()
        if (m["num_aborted_requests_total"] > before["num_aborted_requests_total"] and m["num_running_reqs"] == 0
                and m["num_used_tokens"] == 0):
            break
        time.sleep(0.02)
    assert m["num_running_reqs"] == 0 and m["num_used_tokens"] == 0
    assert m["num_aborted_requests_total"] == before["num_aborted_requests_total"] + 1
    assert m["generation_tokens_total"] - before["generation_tokens_total"] < 4000


BAD = [
    ("/v1/chat/completions", "{not json", None),
    ("/v1/chat/completions", "[1, 2]", None),
    ("/v1/chat/completions", {"model": NAME}, "messages"),
    ("/v1/chat/completions", {"model": NAME, "messages": []}, "messages"),
    ("/v1/chat/completions", {"model": NAME, "messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": 5}]}, None),
    ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, "model"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "x" * 400}]}, "messages"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10 ** 12}, "max_tokens"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "x"}], "temperature": 5}, "temperature"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "x"}], "top_p": "high"}, "top_p"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "x"}], "n": 1000}, "n"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}, "max_tokens"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 3}, "chat_template_kwargs"),
    ("/v1/completions", {"model": NAME, "prompt": "x", "presence_penalty": 3}, "presence_penalty"),
    ("/v1/completions", {"model": NAME, "prompt": "x", "logit_bias": {"999999": 1}}, "logit_bias"),
    ("/v1/completions", {"model": NAME, "prompt": [1, 2, 100000]}, "prompt"),
    ("/v1/completions", {"model": NAME, "prompt": ""}, "prompt"),
    ("/v1/completions", {"model": NAME}, "prompt"),
    ("/v1/completions", {"model": NAME, "prompt": "x", "stop": 3}, "stop"),
    ("/generate", {"input_ids": [1, 2, 300]}, "input_ids"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens"),
]


@pytest.mark.parametrize("path,body,param", BAD)
def test_bad_input_is_400_with_openai_error(server, path, body, param):
    status, data = server.raw("POST", path, body)
    assert status == 400, data
    err = json.loads(data)["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["message"]
    if param:
        assert err["param"] == param, err


def test_invalid_utf8_and_oversized_body(server):
    status, data = server.raw("POST", "/v1/completions", b'{"model":"tiny","prompt":"\xff\xfe"}')
    assert status == 400 and "error" in json.loads(data)
    status, data = server.raw("POST", "/v1/completions", b'{"prompt":"' + b"x" * (40 << 20) + b'"}')
    assert status == 413
    # ... and the server keeps serving.
    assert server.client().completions.create(model=NAME, prompt="still here", max_tokens=2).usage.completion_tokens >= 1


def test_api_key():
    s = Server("--api-key", "sekret")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        assert s.raw("POST", "/v1/completions", {"prompt": "x"})[0] == 401
        assert s.client("sekret").completions.create(model=NAME, prompt="x", max_tokens=2).choices
        assert s.raw("GET", "/health")[0] == 200
    finally:
        s.stop()


def threads_of(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


def test_slow_clients_and_open_streams_hold_no_thread():
    """The transport is event-driven: 600 clients trickling their headers and 200 open streams add no thread and
    do not delay a normal request; streams whose clients leave cancel their requests at once."""
    s = Server("--max-running-requests", "2")
    slow, streams = [], []
    try:
        assert s.client().completions.create(model=NAME, prompt="x", max_tokens=2).choices
        base = threads_of(s.proc.pid)
        for _ in range(600):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
            c.sendall(b"GET /health HTTP/1.1\r\nHo")  # and nothing more
            slow.append(c)
        t = time.time()
        assert s.client().completions.create(model=NAME, prompt="x", max_tokens=2).choices
        assert time.time() - t < 10
        body = json.dumps({"model": NAME, "prompt": "x", "max_tokens": 200, "ignore_eos": True, "stream": True})
        request = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
        for _ in range(200):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=30)
            c.sendall(request)
            streams.append(c)
        for c in streams:
            assert c.recv(12) == b"HTTP/1.1 200"
        assert threads_of(s.proc.pid) <= base + 2
        m = s.metrics()
        assert m["num_running_reqs"] + m["num_queue_reqs"] >= 190  # two at a time run 200 tokens each
        for c in streams + slow:
            c.close()
        deadline = time.time() + 5
        while time.time() < deadline and (m["num_running_reqs"] or m["num_queue_reqs"]):
            time.sleep(0.1)
            m = s.metrics()
        assert m["num_running_reqs"] == 0 and m["num_queue_reqs"] == 0
    finally:
        for c in streams + slow:
            c.close()
        s.stop()


def test_connections_past_the_cap_get_503_and_slow_headers_time_out():
    s = Server("--max-connections", "8")
    idle = []
    try:
        for _ in range(8):
            idle.append(socket.create_connection(("127.0.0.1", s.port), timeout=30))
        time.sleep(0.2)
        status, data = s.raw("GET", "/health")
        assert status == 503 and json.loads(data)["error"]["code"] == "too_many_connections"
        # A client that never finishes its headers is cut off (10 s), which frees its place.
        t = time.time()
        assert idle[0].recv(1) == b""
        assert 8 < time.time() - t < 15
        for c in idle:
            c.close()
        time.sleep(0.2)
        assert s.raw("GET", "/health")[0] == 200
    finally:
        for c in idle:
            c.close()
        s.stop()


def test_engram_placement_flag_refuses_what_it_cannot_do():
    for args, words in ((("--engram-placement", "peer"), "not available yet"),
                        (("--engram-placement", "host"), "needs --device cuda")):
        p = subprocess.run([BIN, "serve", "--port", "0", "--model", MODEL, *args], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode != 0 and words in p.stderr, p.stderr


def test_swa_bounded_replay_flags():
    """The decoder flag is refused where no layer follows the last KV source (V4); on V4.1 both flags serve, a
    re-sent prompt hits, and /server_info reports them."""
    p = subprocess.run([BIN, "serve", "--port", "0", "--model", MODEL, "--enable-decoder-swa-bounded-replay"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "no layers after its last KV-source layer" in p.stderr, p.stderr
    s = Server("--enable-encoder-swa-bounded-replay", "--enable-decoder-swa-bounded-replay",
               model=os.path.join(FIX, "dsv41-tiny-a"))
    try:
        prompt = "Replayed windows: a prompt of a few pages. " * 2
        cold, d = _completion(s, prompt)
        assert d["cached_tokens"] == 0
        warm, d = _completion(s, prompt)
        assert d["cached_tokens"] > 0 and len(warm) > 0
        info = json.loads(s.raw("GET", "/server_info")[1])
        assert info["enable_encoder_swa_bounded_replay"] and info["enable_decoder_swa_bounded_replay"], info
    finally:
        s.stop()


def test_speculative_decoding_flags():
    """Models without the drafter asked for are refused; with dspark on V4.1 and mtp on the V4 demo model, greedy,
    seeded and grammar-constrained completions are the same as without, and /metrics and /server_info report the
    verify steps and the accept length."""
    for args, words in ((("--speculative-algorithm", "mtp"), "has no MTP layer"),
                        (("--speculative-algorithm", "dspark"), "has no DSpark head"),
                        (("--speculative-num-draft-tokens", "3"), "needs --speculative-algorithm")):
        p = subprocess.run([BIN, "serve", "--port", "0", "--model", MODEL, *args], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode != 0 and words in p.stderr, p.stderr
    prompt = "Drafts and their verification, a prompt for it. "
    # Seeded samples and a grammar-constrained one: the same text with speculation as without.
    sampled = [{"prompt": prompt, "max_tokens": 16, "temperature": 1.0, "top_p": 0.9, "seed": 7},
               {"prompt": prompt, "max_tokens": 16, "temperature": 0.8, "seed": 3, "frequency_penalty": 0.5,
                "logit_bias": {"65": 3.0}, "logprobs": 2},
               {"prompt": prompt, "max_tokens": 12, "temperature": 1.0, "seed": 11, "n": 2}]
    regex = {"text": prompt, "sampling_params": {"max_new_tokens": 24, "regex": "[a-z]+( [a-z]+)*", "seed": 5}}

    def outputs(server):
        out = [_completion(server, prompt)[0]]
        for body in sampled:
            status, r = server.raw("POST", "/v1/completions", {"model": NAME, **body})
            assert status == 200, r
            out.append(json.loads(r)["choices"])
        status, r = server.raw("POST", "/generate", regex)
        assert status == 200, r
        out.append(json.loads(r)["text"])
        assert re.fullmatch("[a-z]+( [a-z]+)*", out[-1]), out[-1]
        return out

    for model, algorithm in ((DEMO, "nextn"), (os.path.join(FIX, "dsv41-tiny-a"), "dspark")):
        plain = Server(model=model)
        try:
            want = outputs(plain)
        finally:
            plain.stop()
        s = Server("--speculative-algorithm", algorithm, "--speculative-num-draft-tokens", "3", "--speculative-schedule",
                   "fixed", model=model)
        try:
            assert outputs(s) == want, algorithm
            info = json.loads(s.raw("GET", "/server_info")[1])
            assert info["speculative_algorithm"] == algorithm and info["speculative_num_draft_tokens"] == 3, info
            assert info["speculative_schedule"] == "fixed", info
            assert info["avg_spec_accept_length"] >= 1.0, info
            text = s.raw("GET", "/metrics")[1].decode()
            verifies = re.search(r"^peregrine:spec_verify_total\{[^}]*\} (\S+)$", text, re.M)
            assert verifies and float(verifies.group(1)) > 0, text
            assert _metric(s, "spec_num_draft_tokens_per_pos", 'position="2"') > 0
            assert _metric(s, "spec_num_accepted_tokens_per_pos", 'position="0"') >= 0
            assert _metric(s, "spec_verify_step_seconds_count", "") > 0
            r = subprocess.run([BIN, "bench", "serve", "--url", s.url, "--input-len", "16", "--output-len", "8",
                                "--num-prompts", "4", "--max-concurrency", "2"], capture_output=True, text=True,
                               timeout=120)
            assert r.returncode == 0, r.stderr
            assert re.search(r"^Accept length:\s+[1-4]\.\d\d$", r.stdout, re.M), r.stdout
        finally:
            s.stop()


def test_deterministic_inference():
    """--enable-deterministic-inference: the demo model's greedy and seeded completions are the same with whole
    prompts one at a time as side by side in chunks of 16 tokens, and again from the prefix cache; /server_info says
    so; bounded replay, not numerically a full prefill, is refused with it."""
    p = subprocess.run([BIN, "serve", "--port", "0", "--enable-deterministic-inference",
                        "--enable-decoder-swa-bounded-replay"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "not numerically equal" in p.stderr, p.stderr
    bodies = [{"model": NAME, "prompt": f"{i}: " + "the words of a prompt, for a request of its own; " * (1 + i),
               "max_tokens": 24, "temperature": 0.8 if i % 2 else 0.0, "seed": i} for i in range(6)]

    def one(server, body):
        status, r = server.raw("POST", "/v1/completions", body)
        assert status == 200, r
        return json.loads(r)["choices"][0]["text"]

    s = Server("--enable-deterministic-inference", "--chunked-prefill-size", "4096", model=DEMO)
    try:
        info = json.loads(s.raw("GET", "/server_info")[1])
        assert info["enable_deterministic_inference"] is True, info
        alone = [one(s, b) for b in bodies]
    finally:
        s.stop()
    s = Server("--enable-deterministic-inference", "--chunked-prefill-size", "16", model=DEMO)
    try:
        together = [None] * len(bodies)
        threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, one(s, bodies[i])))
                   for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert together == alone
        assert [one(s, b) for b in bodies] == alone
    finally:
        s.stop()


def test_transport_limits_hold_before_the_body_is_read():
    """405 with Allow on routed paths, state changes only on POST, a body-less POST answered at once, the key checked
    before the body is read, and the body limit counted on the wire for chunked and gzip bodies alike."""
    s = Server("--api-key", "sekret")
    key = {"Content-Type": "application/json", "Authorization": "Bearer sekret"}

    def send(method, path, body=None, headers=None, **kw):
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        c.request(method, path, body=body, headers=headers or {}, **kw)
        r = c.getresponse()
        out = (r.status, r.getheader("Allow"), r.read())
        c.close()
        return out

    try:
        assert send("GET", "/flush_cache", headers=key)[:2] == (405, "POST")
        assert send("PUT", "/v1/chat/completions", headers=key)[:2] == (405, "POST")
        assert send("POST", "/v1/models", headers=key)[:2] == (405, "GET")
        t = time.time()
        c = socket.create_connection(("127.0.0.1", s.port), timeout=10)  # no Content-Length, no body
        c.sendall(b"POST /flush_cache HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekret\r\n\r\n")
        assert b" 200 " in c.recv(4096).split(b"\r\n")[0] and time.time() - t < 5
        c.close()
        status, _, body = send("POST", "/v1/completions", b'{"prompt": "' + b"a" * (40 << 20) + b'"}',
                               {"Content-Type": "application/json"})
        assert status == 401 and b"API key" in body

        def chunks():
            yield b'{"prompt": "'
            for _ in range(40):
                yield b"a" * (1 << 20)
            yield b'"}'
        assert send("POST", "/v1/completions", chunks(), {**key, "Transfer-Encoding": "chunked"}, encode_chunked=True)[0] == 413
        bomb = gzip.compress(b'{"prompt": "' + b"a" * (100 << 20) + b'"}')
        assert send("POST", "/v1/completions", bomb, {**key, "Content-Encoding": "gzip"})[0] == 413
        assert s.client("sekret").completions.create(model=NAME, prompt="x", max_tokens=2).choices
    finally:
        s.stop()


def test_type_errors_are_400s_naming_the_field(server):
    """Wrong JSON types inside nested fields: 400s naming the field, never a 500 with a library's text."""
    user = {"role": "user", "content": "hi"}
    for path, body, field in [
        ("/v1/completions", {"model": NAME, "prompt": "x", "stream": True, "stream_options": {"include_usage": "yes"}},
         "include_usage"),
        ("/v1/chat/completions", {"model": NAME, "messages": [user], "stream_options": {"include_usage": "yes"}},
         "include_usage"),
        ("/v1/messages", {"model": NAME, "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": 5}]}]}, "type"),
        ("/v1/messages", {"model": NAME, "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
         "text"),
        ("/v1/messages", {"model": NAME, "max_tokens": 2, "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r", "is_error": "yes"}]}]},
         "is_error")]:
        status, data = server.raw("POST", path, body)
        assert status == 400, (path, status, data[:200])
        assert field in json.loads(data)["error"]["message"] + str(json.loads(data)["error"].get("param")), data[:300]


def test_full_queue_is_429():
    s = Server("--max-running-requests", "1", "--max-queued-requests", "1")
    try:
        body = {"model": NAME, "prompt": "busy", "max_tokens": 150, "ignore_eos": True}
        statuses = []
        threads = [threading.Thread(target=lambda: statuses.append(s.raw("POST", "/v1/completions", body)[0]))
                   for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # One runs, at most one waits: a burst of five gets some 429s, and every other request completes.
        assert statuses.count(429) >= 1 and statuses.count(200) >= 1, statuses
        assert set(statuses) <= {200, 429}, statuses
    finally:
        s.stop()


def test_preemption_under_tiny_kv_memory_loses_nothing(server):
    prompts = [f"request number {i} with some text" for i in range(6)]
    c = server.client()
    expect = [None] * 6

    def ref(i):  # unconstrained memory (batching does not change greedy output: engine tests)
        expect[i] = c.completions.create(model=NAME, prompt=prompts[i], max_tokens=30, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text

    threads = [threading.Thread(target=ref, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 8 pages of 16 tokens: two requests at a time at most.
    status, info = server.raw("GET", "/server_info")
    assert status == 200
    page_bytes = json.loads(info)["state_page_bytes"]
    # So few pages that every row keeps its window page (the window table is never smaller than the history's).
    s = Server("--kv-memory", str(8 * (page_bytes["history"] + page_bytes["window"]) + 100), "--disable-radix-cache")
    try:
        assert s.metrics()["max_total_num_tokens"] == 8 * 16
        got = [None] * 6

        def one(i):
            got[i] = s.client().completions.create(model=NAME, prompt=prompts[i], max_tokens=30, temperature=0,
                                                   extra_body={"ignore_eos": True}).choices[0].text

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == expect
        m = s.metrics()
        assert m["num_preemptions_total"] > 0 and m["num_finished_requests_total"] == 6
    finally:
        s.stop()


def test_bench_serve_reports_sglang_metrics(server, tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run([BIN, "bench", "serve", "--url", server.url, "--dataset", "random", "--input-len", "24", "--output-len", "6",
                        "--num-prompts", "8", "--max-concurrency", "4", "--output-file", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Output token throughput" in r.stdout and "Median TTFT" in r.stdout
    rep = json.loads(out.read_text())
    assert rep["completed"] == 8 and rep["total_input_tokens"] == 8 * 24 and rep["total_output_tokens"] == 8 * 6
    for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms"):
        assert 0 < rep[k]["median"] <= rep[k]["p99"] + 1e-9
    assert rep["output_throughput"] > 0 and rep["request_throughput"] > 0
    assert "accept_length" not in rep and "Accept length" not in r.stdout  # this server does not speculate


def _completion(server, prompt):
    status, body = server.raw("POST", "/v1/completions", {"model": NAME, "prompt": prompt, "max_tokens": 12,
                                                          "temperature": 0})
    assert status == 200, body
    r = json.loads(body)
    return r["choices"][0]["text"], r["usage"]["prompt_tokens_details"]


def _metric(server, name, labels):
    text = server.raw("GET", "/metrics")[1].decode()
    m = re.search(r"^peregrine:%s\{[^}]*%s[^}]*\} (\S+)$" % (name, re.escape(labels)), text, re.M)
    assert m, f"{name}{{{labels}}} missing"
    return float(m.group(1))


DEMO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../models/peregrine-demo-v4")


@pytest.mark.parametrize("model", [MODEL, DEMO], ids=["fixture", "demo"])
def test_hierarchical_cache_serves_from_host_memory_and_storage_across_restarts(tmp_path, model):
    store = tmp_path / "kv"
    store.mkdir()
    args = ("--kv-memory", "64M", "--enable-hierarchical-cache", "--hicache-storage-backend", "file",
            "--hicache-storage-dir", str(store))
    prompt = "A prompt of several pages that comes back from host memory and storage. " * (2 if model == MODEL else 8)
    s = Server(*args, model=model)
    try:
        cold, d = _completion(s, prompt)
        assert d["cached_tokens"] == 0 and d["cached_tokens_details"] == {"device": 0, "host": 0, "storage": 0}
        warm, d = _completion(s, prompt)
        assert warm == cold and d["cached_tokens"] > 0 and d["cached_tokens_details"]["device"] == d["cached_tokens"]
        pages = d["cached_tokens"] // 16
        for _ in range(200):  # storage writes go on in the background
            if _metric(s, "cache_storage_writes_total", 'result="written"') >= pages:
                break
            time.sleep(0.05)
        # A flush empties the device and host memory; storage keeps its entries.
        assert s.raw("POST", "/flush_cache")[0] == 200
        again, d = _completion(s, prompt)
        assert again == cold and d["cached_tokens_details"]["storage"] == d["cached_tokens"] > 0
        assert _metric(s, "cache_hit_tokens_total", 'tier="storage"') == d["cached_tokens"]
        assert _metric(s, "cache_transfer_bytes_total", 'tier="storage",direction="in"') > 0
    finally:
        s.stop()
    s = Server(*args, model=model)  # a restart: storage still serves
    try:
        after, d = _completion(s, prompt)
        assert after == cold and d["cached_tokens_details"]["storage"] == d["cached_tokens"] > 0
        if model != MODEL:
            return
        status, info = s.raw("GET", "/server_info")
        info = json.loads(info)
        assert info["enable_hierarchical_cache"] and info["hicache_storage_backend"] == "file"
        # bench serve prints the hit rate of each tier.
        r = subprocess.run([BIN, "bench", "serve", "--url", s.url, "--dataset-name", "generated-shared-prefix",
                            "--gsp-num-groups", "2", "--gsp-prompts-per-group", "3", "--gsp-system-prompt-len", "64",
                            "--gsp-question-len", "8", "--gsp-output-len", "4", "--max-concurrency", "1",
                            "--warmup-requests", "0", "--output-file", str(tmp_path / "b.json")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "device / host / storage" in r.stdout
        rep = json.loads((tmp_path / "b.json").read_text())
        assert rep["completed"] == 6 and rep["cache_hit_rate"] > 0.5
    finally:
        s.stop()
    r = subprocess.run([BIN, "serve", "--model", MODEL, "--port", "0", "--enable-hierarchical-cache",
                        "--hicache-storage-backend", "file", "--hicache-storage-dir", str(tmp_path / "missing")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "no such directory" in r.stderr


def test_thinking_off_by_default_on_when_asked():
    server = Server("--context-length", "2048", "--kv-memory", "64M")  # V4's effort preamble is long in bytes
    try:
        _thinking(server)
    finally:
        server.stop()


def _thinking(server):
    c = server.client()
    msgs = [{"role": "user", "content": "think?"}]
    off = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=1, temperature=0)
    on = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=1, temperature=0,
                                   extra_body={"chat_template_kwargs": {"thinking": True}})
    effort = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=1, temperature=0, reasoning_effort="high")
    # The thinking prompt ends with <think> instead of </think> (and V4 adds the effort text).
    assert on.usage.prompt_tokens != off.usage.prompt_tokens
    assert effort.usage.prompt_tokens >= on.usage.prompt_tokens
    assert getattr(off.choices[0].message, "reasoning_content", None) is None
    assert on.choices[0].message.model_extra.get("reasoning_content") is not None


def test_data_and_expert_parallel_ranks_give_identical_output(server):
    """`--dp 2 --ep 2`: two ranks (threads on the CPU) with their own requests and KV and half the experts
    each. Greedy completions equal the single-rank server's, concurrent requests spread over the ranks, and
    /metrics sums the ranks."""
    prompts = [f"request {i}: " + "some text to continue " * (1 + i % 3) for i in range(6)]
    single = [server.client().completions.create(model=NAME, prompt=p, max_tokens=10, temperature=0).choices[0].text
              for p in prompts]
    dp = Server("--kv-memory", "32M", "--dp", "2", "--ep", "2")
    try:
        results = [None] * len(prompts)

        def one(i):
            r = dp.client().completions.create(model=NAME, prompt=prompts[i], max_tokens=10, temperature=0)
            results[i] = r.choices[0].text

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == single
        m = dp.metrics()
        assert m["num_requests_total"] == len(prompts)
        assert m["generation_tokens_total"] == 10 * len(prompts)
        # Mismatched --ep is refused with a reason.
        bad = subprocess.run([BIN, "serve", "--model", MODEL, "--dp", "2", "--ep", "1"], capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and "--ep 1 with --dp 2" in bad.stderr
    finally:
        dp.stop()


def test_synthetic_release_dims_and_ids_beyond_the_tokenizer():
    # V4.1-Flash's dimensions and formats with made-up weights (one layer, 8 experts) behind the byte tokenizer:
    # the model samples ids the tokenizer has no bytes for; they come back as ids without text, and the server
    # goes on serving.
    s = Server("--synthetic", "v41-flash", "--synthetic-layers", "1", "--synthetic-experts", "8", "--kv-memory", "64M",
               model=None)
    try:
        for _ in range(2):
            status, body = s.raw("POST", "/generate", {"input_ids": [1, 2, 3], "sampling_params": {
                "temperature": 0, "max_new_tokens": 2, "ignore_eos": True}})
            assert status == 200, body
            r = json.loads(body)
            assert len(r["output_ids"]) == 2 and any(i >= 256 for i in r["output_ids"]), r
        status, body = s.raw("GET", "/v1/models")
        assert status == 200 and json.loads(body)["data"][0]["id"] == "synthetic-v41-flash"
    finally:
        s.stop()


def test_generation_config_gives_the_sampling_defaults(tmp_path):
    """A request that leaves temperature / top_p out gets the model's generation_config.json values (SGLang's
    --sampling-defaults model); --sampling-defaults openai keeps 1.0."""
    for f in os.listdir(MODEL):
        os.symlink(os.path.join(os.path.abspath(MODEL), f), tmp_path / f)
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.3, "top_p": 0.9, "do_sample": True}))

    def texts(server):
        c = server.client()
        kw = dict(model=NAME, prompt="ROMEO:", max_tokens=32, seed=7)
        return [c.completions.create(**kw, **extra).choices[0].text
                for extra in ({}, {"temperature": 0.3, "top_p": 0.9}, {"temperature": 1.0, "top_p": 1.0})]

    server = Server("--kv-memory", "64M", model=str(tmp_path))
    try:
        default, model_values, openai_values = texts(server)
        assert default == model_values and default != openai_values
    finally:
        server.stop()
    server = Server("--kv-memory", "64M", "--sampling-defaults", "openai", model=str(tmp_path))
    try:
        default, model_values, openai_values = texts(server)
        assert default == openai_values and default != model_values
    finally:
        server.stop()
    # `generate` starts from the same defaults; its flags override them.
    gen = lambda *flags: subprocess.run([BIN, "generate", "--model", str(tmp_path), "--ids", "5,17,42", "--max-tokens",
                                         "24", "--seed", "7", "--ignore-eos", "--print-ids", *flags],
                                        capture_output=True, text=True, timeout=60, check=True).stdout
    assert gen() == gen("--temperature", "0.3", "--top-p", "0.9") != gen("--temperature", "1")
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": -1}))
    proc = subprocess.run([BIN, "serve", "--port", "0", "--model", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0 and "generation_config.json" in proc.stderr and "temperature" in proc.stderr


def test_health_generate_server_info_and_abort_request(server):
    status, body = server.raw("GET", "/health_generate")
    assert status == 200 and json.loads(body)["status"] == "ok", body
    status, body = server.raw("GET", "/server_info")
    info = json.loads(body)
    assert status == 200 and info["status"] == "serving" and info["page_size"] == 16, info
    assert info["max_total_num_tokens"] == server.metrics()["max_total_num_tokens"]
    assert {"num_running_reqs", "num_queue_reqs", "state"} <= info.keys()
    assert server.raw("GET", "/get_server_info")[0] == 200

    # A long generation aborted by its rid ends at once with finish_reason "abort".
    got = {}

    def long_request():
        got["r"] = server.raw("POST", "/generate", {"input_ids": [5, 6, 7], "rid": "abort-me", "sampling_params": {
            "temperature": 0, "max_new_tokens": 200, "ignore_eos": True}})

    t = threading.Thread(target=long_request)
    t.start()
    aborted = 0
    for _ in range(200):
        status, body = server.raw("POST", "/abort_request", {"rid": "abort-me"})
        assert status == 200, body
        aborted = json.loads(body)["aborted"]
        if aborted:
            break
        time.sleep(0.02)
    t.join(30)
    assert aborted == 1
    status, body = got["r"]
    r = json.loads(body)
    assert status == 200 and r["meta_info"]["finish_reason"]["type"] == "abort", r
    assert len(r["output_ids"]) < 200
    status, body = server.raw("POST", "/abort_request", {})
    assert status == 400 and json.loads(body)["error"]["param"] == "rid"
    assert json.loads(server.raw("POST", "/abort_request", {"abort_all": True})[1])["aborted"] == 0


def start_generation(s, max_new_tokens):
    """A greedy /generate of max_new_tokens in a thread; returns the thread and where its (status, body) will be,
    once the server runs it."""
    got = {}

    def request():
        got["r"] = s.raw("POST", "/generate", {"input_ids": [5, 6, 7], "sampling_params": {
            "temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}})

    t = threading.Thread(target=request)
    t.start()
    while json.loads(s.raw("GET", "/server_info")[1])["num_running_reqs"] == 0:
        time.sleep(0.01)
    return t, got


def test_sigterm_lets_running_requests_finish():
    s = Server("--kv-memory", "64M")
    t, got = start_generation(s, 40)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    # Draining: no new generation, and /health tells load balancers to go elsewhere.
    status, body = s.raw("POST", "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}})
    assert status == 503, body
    assert s.raw("GET", "/health")[0] == 503
    t.join(60)
    status, body = got["r"]
    r = json.loads(body)
    assert status == 200 and len(r["output_ids"]) == 40 and r["meta_info"]["finish_reason"]["type"] == "length", r
    assert s.proc.wait(30) == 0


def test_sigterm_cancels_what_outlasts_the_shutdown_timeout():
    s = Server("--kv-memory", "64M", "--shutdown-timeout", "0.5", "--context-length", "100000")
    t, got = start_generation(s, 50000)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(30) == 0
    assert time.time() - t0 < 5
    t.join(10)
    status, body = got["r"]
    assert status == 200 and json.loads(body)["meta_info"]["finish_reason"]["type"] == "abort", body
