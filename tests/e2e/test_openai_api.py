"""The OpenAI-compatible API with the official openai client, against the echo backend (exact answers: they
repeat the prompt) and against `moeserve serve` on the built-in model (random weights: answers are checked for
structure, greedy determinism, token accounting and KV pages, not for words)."""
import concurrent.futures
import math
import os
import signal
import threading
import time

import openai
import pytest
import requests

from conftest import builtin_moe_layers, start_server


def client(server, **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120, **kw)


def only(server, kind):
    if server.kind != kind:
        pytest.skip(f"{kind} server only")


def greedy(**kw):
    # Greedy and to the full length, so answers are reproducible and lengths known on either backend.
    kw.setdefault("temperature", 0)
    kw.setdefault("extra_body", {"ignore_eos": True})
    return kw


def test_models(server):
    models = client(server).models.list()
    assert [m.id for m in models.data] == [server.model]


def test_tokenize_detokenize(server):
    r = requests.post(server.url + "/tokenize", json={"prompt": "Hello, world"}, timeout=10).json()
    assert r["count"] == len(r["tokens"]) > 0
    back = requests.post(server.url + "/detokenize", json={"tokens": r["tokens"]}, timeout=10).json()
    assert back["prompt"] == "Hello, world"


def test_chat_and_completions(server):
    c = client(server)
    msgs = [{"role": "user", "content": "hello"}]
    r = c.chat.completions.create(model=server.model, messages=msgs, max_tokens=7, **greedy())
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7
    rendered = requests.post(server.url + "/tokenize", json={"messages": msgs}, timeout=10).json()
    assert r.usage.prompt_tokens == rendered["count"]
    if server.kind == "echo":
        assert r.choices[0].message.content == "hellohe"
    r = c.completions.create(model=server.model, prompt="abc", max_tokens=4, n=2, **greedy())
    assert sorted(ch.index for ch in r.choices) == [0, 1]
    assert r.choices[0].text == r.choices[1].text  # greedy: both choices take the same path
    assert r.usage.completion_tokens == 8
    if server.kind == "echo":
        assert r.choices[0].text == "abca"


def test_stream_equals_non_stream(server):
    c = client(server)
    args = dict(model=server.model, prompt="The quick brown fox", max_tokens=24, **greedy())
    whole = c.completions.create(**args).choices[0].text
    parts = [ch.choices[0].text for ch in c.completions.create(stream=True, **args) if ch.choices]
    assert "".join(parts) == whole
    msgs = [{"role": "user", "content": "Tell me a story."}]
    whole = c.chat.completions.create(model=server.model, messages=msgs, max_tokens=24, **greedy())
    stream = c.chat.completions.create(model=server.model, messages=msgs, max_tokens=24, stream=True, **greedy())
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == whole.choices[0].message.content


def test_stop_string(server):
    """A stop string taken from the middle of a greedy answer: the answer with it ends just before it."""
    c = client(server)
    args = dict(model=server.model, prompt="one two STOP three", max_tokens=40, **greedy())
    full = c.completions.create(**args).choices[0].text
    stop = None
    for k in range(3, len(full) - 2):
        cand = full[k : k + 2]
        if cand.isascii() and cand.isprintable() and cand.strip() == cand and full.index(cand) == k:
            stop = cand
            break
    assert stop is not None, f"no usable stop string in {full!r}"
    r = c.completions.create(stop=[stop], **args)
    assert r.choices[0].text == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    stream = c.completions.create(stop=[stop], stream=True, **args)
    chunks = [ch for ch in stream if ch.choices]
    assert "".join(ch.choices[0].text for ch in chunks) == full[: full.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_echo_stop_and_usage(server):
    only(server, "echo")
    stream = client(server).chat.completions.create(
        model="echo",
        messages=[{"role": "user", "content": "one two STOP three"}],
        max_tokens=50,
        stop=["STOP"],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert text == "one two " and finish == "stop" and usage is not None


def test_streaming_logprobs_and_usage(server):
    stream = client(server).chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Count with me."}],
        max_tokens=12,
        logprobs=True,
        top_logprobs=3,
        stream=True,
        stream_options={"include_usage": True},
        **greedy(),
    )
    entries, usage = [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for ch in chunk.choices:
            if ch.logprobs and ch.logprobs.content:
                entries.extend(ch.logprobs.content)
    assert usage is not None and usage.completion_tokens == len(entries) == 12
    for e in entries:
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 3
        assert tops == sorted(tops, reverse=True)
        assert all(t <= 0 for t in tops) and e.logprob <= 0
        if server.kind == "builtin":
            # Greedy picks the most likely token: its logprob is the first of the top ones.
            assert math.isclose(e.logprob, tops[0], abs_tol=1e-4)
            assert e.token == e.top_logprobs[0].token


def test_completion_logprobs(server):
    r = client(server).completions.create(model=server.model, prompt="xyz", max_tokens=3, logprobs=2, **greedy())
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert all(len(t) == 2 for t in lp.top_logprobs)
    if server.kind == "echo":
        assert lp.tokens == ["x", "y", "z"]
    else:
        # Probabilities: the top two of each position sum to at most 1.
        assert all(sum(math.exp(v) for v in t.values()) <= 1 + 1e-4 for t in lp.top_logprobs)


def test_seeded_sampling_repeats(server):
    only(server, "builtin")
    c = client(server)
    args = dict(model=server.model, prompt="Once upon a time", max_tokens=16, temperature=1.0,
                extra_body={"ignore_eos": True})
    a = c.completions.create(seed=7, **args).choices[0].text
    b = c.completions.create(seed=7, **args).choices[0].text
    assert a == b
    others = {c.completions.create(seed=s, **args).choices[0].text for s in (8, 9, 10)}
    assert len(others | {a}) > 1  # different seeds give different draws


def test_reasoning_content(server):
    only(server, "echo")
    prompt = "<think>hmm</think>Yes."
    r = client(server).chat.completions.create(
        model="echo", messages=[{"role": "user", "content": prompt}], max_tokens=len(prompt)
    )
    msg = r.choices[0].message
    assert msg.content == "Yes."
    assert msg.model_extra["reasoning_content"] == "hmm"


def too_long_text(server):
    """A message that renders past the context, measured with the server's own tokenizer."""
    ctx = requests.get(server.url + "/v1/models", timeout=10).json()["data"][0]["max_model_len"]
    text = "x"
    while True:
        n = requests.post(server.url + "/tokenize", json={"prompt": text}, timeout=10).json()["count"]
        if n > ctx:
            return text
        text = text + " " + "".join(chr(97 + (i * 7) % 26) for i in range(len(text)))


BAD = [
    (dict(model="gpt-4"), 404, "model"),
    (dict(temperature=5), 400, "temperature"),
    (dict(n=1000), 400, "n"),
    (dict(max_tokens=10**6), 400, "max_tokens"),
    (dict(top_p=2), 400, "top_p"),
    (dict(top_logprobs=50, logprobs=True), 400, "top_logprobs"),
    (dict(messages=[]), 400, "messages"),
    ("too_long", 400, "messages"),
]


@pytest.mark.parametrize("kwargs, status, param", BAD)
def test_bad_requests(server, kwargs, status, param):
    args = dict(model=server.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    if kwargs == "too_long":
        kwargs = dict(messages=[{"role": "user", "content": too_long_text(server)}])
    args.update(kwargs)
    with pytest.raises(openai.APIStatusError) as e:
        client(server).chat.completions.create(**args)
    assert e.value.status_code == status
    assert e.value.body["param"] == param


def test_bad_prompt_ids(server):
    vocab = requests.get(server.url + "/v1/models", timeout=10).json()["data"][0]["vocab_size"]
    r = requests.post(server.url + "/v1/completions",
                      json={"model": server.model, "prompt": [1, vocab], "max_tokens": 2}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_malformed_and_oversized_bodies(server):
    r = requests.post(server.url + "/v1/chat/completions", data="{oops", timeout=5)
    assert r.status_code == 400 and "error" in r.json()
    r = requests.post(server.url + "/v1/completions", data="x" * (2 << 20), timeout=30)
    assert r.status_code == 413 and "error" in r.json()
    r = requests.post(server.url + "/v1/completions", json={"model": server.model, "prompt": 5}, timeout=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_64_concurrent_streams(server):
    c = client(server)

    def one(i):
        prompt = f"client {i} "
        stream = c.completions.create(model=server.model, prompt=prompt, max_tokens=30, stream=True, **greedy())
        chunks = [ch for ch in stream if ch.choices]
        text = "".join(ch.choices[0].text for ch in chunks)
        if chunks[-1].choices[0].finish_reason != "length":
            return False
        return text == (prompt * 30)[:30] if server.kind == "echo" else True

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        assert all(pool.map(one, range(64)))
    wait_idle(server)


def wait_idle(server, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = server.metrics()
        if m["moeserve_num_requests_active"] == 0 and m["moeserve_kv_pages_used"] == m["moeserve_kv_pages_cached"]:
            return m
        time.sleep(0.05)
    raise AssertionError(f"server did not settle: {m}")


def test_killed_client_frees_pages(server):
    cancelled = server.metrics()['moeserve_requests_total{outcome="cancelled"}']
    with requests.post(
        server.url + "/v1/completions",
        json={"model": server.model, "prompt": "z" * 300, "max_tokens": 700, "stream": True, "ignore_eos": True},
        stream=True,
        timeout=10,
    ) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
        # Still streaming; leaving the block closes the connection mid-stream.
        m = server.metrics()
        assert m["moeserve_num_requests_active"] == 1
        assert m["moeserve_kv_pages_used"] > m["moeserve_kv_pages_cached"]
    m = wait_idle(server)
    assert m['moeserve_requests_total{outcome="cancelled"}'] == cancelled + 1


def test_profile_endpoints(server, tmp_path):
    if server.kind == "echo":
        r = requests.post(server.url + "/start_profile", json={}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["code"] == "not_supported"
        return
    r = requests.post(server.url + "/stop_profile", timeout=10)
    assert r.status_code == 400  # nothing started
    r = requests.post(server.url + "/start_profile", json={"num_steps": "3"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "num_steps"
    trace = tmp_path / "trace.json"
    r = requests.post(server.url + "/start_profile", json={"num_steps": 3, "output_path": str(trace)}, timeout=60)
    assert r.status_code == 200, r.text
    assert requests.post(server.url + "/start_profile", json={}, timeout=10).status_code == 409
    client(server).completions.create(model=server.model, prompt="profile me", max_tokens=8, **greedy())
    r = requests.post(server.url + "/stop_profile", json={"timeout_s": 30}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["steps"] == 3
    assert "moe.experts" in body["table"] and body["summary"]["steps"] == 3
    assert body["trace_path"] == str(trace) and trace.stat().st_size > 0


def test_sigterm_drains(server):
    # A generous drain timeout: on a shared 2-core machine a CPU model's steps can slow down many times over,
    # and this test is about what draining does, not how fast.
    s = start_server(server.kind, "--drain-timeout", "300")
    result = {}

    def long_request():
        r = client(s).completions.create(model=s.model, prompt="abc", max_tokens=400, **greedy())
        result["tokens"] = r.usage.completion_tokens

    try:
        t = threading.Thread(target=long_request)
        t.start()
        while s.metrics()["moeserve_num_requests_active"] == 0:
            time.sleep(0.01)
        s.proc.send_signal(signal.SIGTERM)
        # Draining: new requests are refused while the running one finishes. The signal is handled on another
        # thread, so wait until /health says draining before sending one.
        try:
            deadline = time.time() + 30
            while requests.get(s.url + "/health", timeout=5).status_code != 503 and time.time() < deadline:
                time.sleep(0.005)
            r = requests.post(s.url + "/v1/completions", json={"model": s.model, "prompt": "x"}, timeout=5)
            assert r.status_code == 503
        except requests.ConnectionError:
            pass  # already stopped listening
        t.join(timeout=300)
        assert s.proc.wait(timeout=300) == 0
        assert result["tokens"] == 400
    finally:
        s.stop(signal.SIGKILL)


def test_distinct_experts_histogram(server):
    only(server, "builtin")
    m0 = server.metrics()
    before = m0.get('moeserve_moe_distinct_experts_count{kind="baseline"}', 0)
    # Earlier tests' batched steps may have read more than 16 experts: the bucket has its own starting count.
    before_16 = m0.get('moeserve_moe_distinct_experts_bucket{kind="baseline",le="16"}', 0)
    client(server).completions.create(model=server.model, prompt="experts", max_tokens=6, **greedy())
    m = server.metrics()
    # 5 decode steps (the first token comes from the prefill) x the MoE layers, each reading 1..16 experts
    # (one token: its top-k, at most 8 in the architectures served).
    n = 5 * builtin_moe_layers()
    assert m['moeserve_moe_distinct_experts_count{kind="baseline"}'] == before + n
    assert m['moeserve_moe_distinct_experts_bucket{kind="baseline",le="16"}'] == before_16 + n
    assert 'moeserve_moe_distinct_experts_count{kind="oea"}' not in m  # OEA is off
