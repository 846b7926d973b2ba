"""Requests with the official openai client: several prompts in one completion, logit_bias, refused fields,
a dropped non-streaming client freeing its pages, and a failed engine step answered with a 500."""
import openai
import pytest
import requests

from conftest import start_server
from test_openai_api import client, greedy, only, wait_idle


def test_several_prompts_in_one_completion(server):
    r = client(server).completions.create(model=server.model, prompt=["ab", "cde"], max_tokens=3, n=2,
                                          **greedy())
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    if server.kind == "echo":
        assert [c.text for c in r.choices] == ["aba", "aba", "cde", "cde"]
    else:
        assert r.choices[0].text == r.choices[1].text  # greedy: the same answer for the same prompt
    assert r.usage.completion_tokens == 12
    single = client(server).completions.create(model=server.model, prompt="cde", max_tokens=3, **greedy())
    assert r.choices[2].text == single.choices[0].text


def test_refused_fields_and_logit_bias(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hi"}],
                                  response_format={"type": "json_object"})
    assert e.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hi"}],
                                  logit_bias={"5": 150})
    assert e.value.body["param"] == "logit_bias"
    # A +100 bias all but forces its token.
    only_token = c.completions.create(model=server.model, prompt="hello", max_tokens=4, temperature=1.0,
                                      logit_bias={"120": 100}, extra_body={"ignore_eos": True})
    if server.kind == "builtin":
        # The built-in tokenizer may merge the repeated token's text; its ids all come from token 120's bytes.
        one = requests.post(server.url + "/detokenize", json={"tokens": [120]}, timeout=5).json()["prompt"]
        assert only_token.choices[0].text == one * 4


def test_dropped_non_streaming_client_frees_its_pages(server):
    cancelled = server.metrics()['moeserve_requests_total{outcome="cancelled"}']
    # The built-in model on a GPU makes 700 tokens in well under half a second: the client gives up sooner.
    wait = 0.5 if server.kind == "echo" else 0.1
    slow = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=wait)
    with pytest.raises(openai.APITimeoutError):
        # Longer than the client waits on either backend (the echo one makes a token per 0.3 ms step).
        slow.completions.create(model=server.model, prompt="z" * 300,
                                max_tokens=3500 if server.kind == "echo" else 700,
                                extra_body={"ignore_eos": True})
    m = wait_idle(server)
    assert m['moeserve_requests_total{outcome="cancelled"}'] == cancelled + 1


def test_failed_step_is_a_500_and_the_server_goes_on():
    s = start_server("echo", "--fail-at-step", "3")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        with pytest.raises(openai.InternalServerError) as e:
            c.completions.create(model="echo", prompt="abc", max_tokens=5)
        assert "injected step failure" in str(e.value)
        r = c.completions.create(model="echo", prompt="abc", max_tokens=5)
        assert r.choices[0].text == "abcab"
    finally:
        s.stop()
