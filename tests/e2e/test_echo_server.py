"""The HTTP layer with the official openai client, over the model-free echo backend (answers repeat the
prompt; one byte is one token)."""
import concurrent.futures
import signal
import threading
import time

import openai
import pytest
import requests

from conftest import Server


def client(server, **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, **kw)


def test_models(echo_server):
    models = client(echo_server).models.list()
    assert [m.id for m in models.data] == ["echo"]


def test_chat_and_completions(echo_server):
    c = client(echo_server)
    r = c.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hello"}], max_tokens=7)
    assert r.choices[0].message.content == "hellohe"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7 and r.usage.prompt_tokens == 5
    r = c.completions.create(model="echo", prompt="abc", max_tokens=4, n=2)
    assert [ch.text for ch in r.choices] == ["abca", "abca"]
    assert sorted(ch.index for ch in r.choices) == [0, 1]


def test_streaming_with_usage_stop_and_logprobs(echo_server):
    c = client(echo_server)
    stream = c.chat.completions.create(
        model="echo",
        messages=[{"role": "user", "content": "one two STOP three"}],
        max_tokens=50,
        stop=["STOP"],
        logprobs=True,
        top_logprobs=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, lps = "", None, None, 0
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            if ch.logprobs and ch.logprobs.content:
                lps += len(ch.logprobs.content)
                assert len(ch.logprobs.content[0].top_logprobs) == 2
            finish = ch.finish_reason or finish
    assert text == "one two "
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == lps


def test_completion_logprobs(echo_server):
    r = client(echo_server).completions.create(model="echo", prompt="xyz", max_tokens=3, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.tokens == ["x", "y", "z"]
    assert len(lp.token_logprobs) == 3 and len(lp.top_logprobs[0]) == 2


def test_reasoning_content(echo_server):
    prompt = "<think>hmm</think>Yes."
    r = client(echo_server).chat.completions.create(
        model="echo", messages=[{"role": "user", "content": prompt}], max_tokens=len(prompt)
    )
    msg = r.choices[0].message
    assert msg.content == "Yes."
    assert msg.model_extra["reasoning_content"] == "hmm"


@pytest.mark.parametrize(
    "kwargs, status, param",
    [
        (dict(model="gpt-4"), 404, "model"),
        (dict(temperature=5), 400, "temperature"),
        (dict(n=1000), 400, "n"),
        (dict(max_tokens=10**6), 400, "max_tokens"),
        (dict(top_p=2), 400, "top_p"),
        (dict(messages=[]), 400, "messages"),
        (dict(messages=[{"role": "user", "content": "x" * 5000}]), 400, "messages"),
    ],
)
def test_bad_requests(echo_server, kwargs, status, param):
    args = dict(model="echo", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    args.update(kwargs)
    with pytest.raises(openai.APIStatusError) as e:
        client(echo_server).chat.completions.create(**args)
    assert e.value.status_code == status
    assert e.value.body["param"] == param


def test_malformed_and_oversized_bodies(echo_server):
    r = requests.post(echo_server.url + "/v1/chat/completions", data="{oops", timeout=5)
    assert r.status_code == 400 and "error" in r.json()
    r = requests.post(echo_server.url + "/v1/completions", data="x" * (2 << 20), timeout=30)
    assert r.status_code == 413 and "error" in r.json()


def test_64_concurrent_streams(echo_server):
    c = client(echo_server)

    def one(i):
        prompt = f"client {i} "
        stream = c.completions.create(model="echo", prompt=prompt, max_tokens=30, stream=True)
        return "".join(ch.choices[0].text for ch in stream if ch.choices) == (prompt * 30)[:30]

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        assert all(pool.map(one, range(64)))


def wait_idle(server, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = server.metrics()
        if m["moeserve_num_requests_active"] == 0 and m["moeserve_kv_pages_used"] == m["moeserve_kv_pages_cached"]:
            return m
        time.sleep(0.05)
    raise AssertionError(f"server did not settle: {m}")


def test_killed_client_frees_pages(echo_server):
    with requests.post(
        echo_server.url + "/v1/completions",
        json={"model": "echo", "prompt": "z" * 300, "max_tokens": 3000, "stream": True, "ignore_eos": True},
        stream=True,
        timeout=10,
    ) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
        # Still streaming; leaving the block closes the connection mid-stream.
        m = echo_server.metrics()
        assert m["moeserve_num_requests_active"] == 1
        assert m["moeserve_kv_pages_used"] > m["moeserve_kv_pages_cached"]
    m = wait_idle(echo_server)
    assert m['moeserve_requests_total{outcome="cancelled"}'] >= 1


def test_sigterm_drains():
    s = Server("echo-server", "--step-time-us", "2000")
    result = {}

    def long_request():
        r = client(s).completions.create(model="echo", prompt="abc", max_tokens=200)
        result["tokens"] = r.usage.completion_tokens

    t = threading.Thread(target=long_request)
    t.start()
    while s.metrics()["moeserve_num_requests_active"] == 0:
        time.sleep(0.01)
    s.proc.send_signal(signal.SIGTERM)
    t.join(timeout=30)
    assert s.proc.wait(timeout=30) == 0
    assert result["tokens"] == 200
