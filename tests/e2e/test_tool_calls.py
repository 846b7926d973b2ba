"""Tool calls with the official openai client, through echo-server's scripted replies (a model would not make
them) rendered by the published GLM-4.6 and DeepSeek-V3 chat templates: the model's markup becomes
`tool_calls` (arguments typed by the tool's schema), in whole answers and in stream deltas; the tool's result
goes back through the template; tool_choice none, required and a named function."""
import json
import os

import openai
import pytest
import requests

from conftest import Server

TEMPLATES = os.path.join(os.path.dirname(__file__), "..", "data", "tokenizer", "templates")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
            "required": ["city"],
        },
    },
}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}}}}

GLM_SCRIPT = {
    "Weather in Paris?": "<think>The user wants the weather.</think>\nLet me look that up.\n<tool_call>get_weather\n"
                         "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
                         "<arg_value>2</arg_value>\n<arg_key>metric</arg_key>\n<arg_value>true</arg_value>\n"
                         "</tool_call>",
    # The tool's result as the GLM template renders it: the next turn of the conversation.
    "<tool_response>\n{\"temp\": 21}\n</tool_response>": "<think>Easy.</think>\nIt is 21 degrees in Paris.",
    "Say hi": "<think></think>Hi there!",
}
DS_SCRIPT = {
    "Paris and cats?": "Two calls.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                       "```json\n{\"city\": \"Paris\", \"days\": 3}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>"
                       "function<｜tool▁sep｜>search\n```json\n{\"query\": \"cats\"}\n```<｜tool▁call▁end｜>"
                       "<｜tool▁calls▁end｜>",
    "<｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>": "It is sunny.",
}


def start(tmp_path_factory, name, template, parser, script, *extra):
    path = tmp_path_factory.mktemp(name) / "script.json"
    path.write_text(json.dumps(script, ensure_ascii=False))
    s = Server("echo-server", "--chat-template", os.path.join(TEMPLATES, template), "--tool-call-parser", parser,
               "--script", str(path), "--served-model-name", name, *extra)
    s.model = name
    return s


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    s = start(tmp_path_factory, "glm", "glm-4.6.jinja", "glm", GLM_SCRIPT, "--reasoning-parser", "glm45")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    s = start(tmp_path_factory, "deepseek", "deepseek-v3.jinja", "deepseek_v3", DS_SCRIPT)
    yield s
    s.stop()


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def rendered(server, messages, tools):
    ids = requests.post(server.url + "/tokenize", json={"messages": messages, "tools": tools}, timeout=10).json()
    # echo-server's tokenizer: one byte per token
    return bytes(ids["tokens"]).decode()


def collect_stream(stream):
    """Joins stream chunks as a client would: content, reasoning and tool calls by index."""
    content, reasoning, calls, finish, pieces = "", "", {}, None, []
    for chunk in stream:
        for ch in chunk.choices:
            d = ch.delta
            if d.content:
                content += d.content
                pieces.append(d.content)
            reasoning += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    assert call["id"] is None, "a call's id comes once"
                    call["id"] = tc.id
                    assert tc.type == "function"
                if tc.function and tc.function.name:
                    call["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    call["arguments"] += tc.function.arguments
            if ch.finish_reason:
                finish = ch.finish_reason
    return content, reasoning, [calls[i] for i in sorted(calls)], finish, pieces


def test_glm_tool_call_then_its_result(glm):
    c = client(glm)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    r = c.chat.completions.create(model=glm.model, messages=messages, tools=[WEATHER, SEARCH])
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.reasoning_content == "The user wants the weather."
    assert ch.message.content == "Let me look that up.\n"
    [call] = ch.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    # Typed by the schema: days an integer, metric a boolean, city a string.
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2, "metric": True}

    # The call and its result go back; the template renders them as GLM expects, and the answer is text.
    messages.append(ch.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'})
    prompt = rendered(glm, messages, [WEATHER, SEARCH])
    assert ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n<arg_key>metric</arg_key>\n"
            "<arg_value>true</arg_value>\n</tool_call>") in prompt
    assert prompt.endswith('<|observation|>\n<tool_response>\n{"temp": 21}\n</tool_response><|assistant|>')
    r2 = c.chat.completions.create(model=glm.model, messages=messages, tools=[WEATHER, SEARCH])
    assert r2.choices[0].finish_reason == "stop"
    assert r2.choices[0].message.content == "It is 21 degrees in Paris."
    assert not r2.choices[0].message.tool_calls


def test_glm_tool_call_streamed(glm):
    c = client(glm)
    whole = c.chat.completions.create(model=glm.model, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                      tools=[WEATHER])
    stream = c.chat.completions.create(model=glm.model, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                       tools=[WEATHER], stream=True)
    content, reasoning, calls, finish, pieces = collect_stream(stream)
    assert finish == "tool_calls"
    assert reasoning == "The user wants the weather."
    assert content == whole.choices[0].message.content
    assert not any("<" in p or ">" in p for p in pieces), pieces  # no markup leaks into content deltas
    assert len(calls) == 1 and calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    assert calls[0]["arguments"] == whole.choices[0].message.tool_calls[0].function.arguments
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 2, "metric": True}


def test_tool_choice_none_required_and_named(glm):
    c = client(glm)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    # none: the tools are not offered and the answer is text, whatever it holds.
    r = c.chat.completions.create(model=glm.model, messages=ask, tools=[WEATHER], tool_choice="none")
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "stop"
    assert "<tool_call>get_weather" in r.choices[0].message.content
    assert "# Tools" not in rendered(glm, ask, None)
    # required: satisfied by the call; an answer without one is refused.
    r = c.chat.completions.create(model=glm.model, messages=ask, tools=[WEATHER], tool_choice="required")
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    hi = [{"role": "user", "content": "Say hi"}]
    with pytest.raises(openai.InternalServerError) as e:
        c.chat.completions.create(model=glm.model, messages=hi, tools=[WEATHER], tool_choice="required")
    assert e.value.body["code"] == "tool_choice_unsatisfied"
    # A named function: the call must be to it.
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = c.chat.completions.create(model=glm.model, messages=ask, tools=[WEATHER, SEARCH], tool_choice=named)
    assert r.choices[0].finish_reason == "tool_calls"
    other = {"type": "function", "function": {"name": "search"}}
    with pytest.raises(openai.InternalServerError) as e:
        c.chat.completions.create(model=glm.model, messages=ask, tools=[WEATHER, SEARCH], tool_choice=other)
    assert "search" in e.value.body["message"]
    # Streamed, the refusal is an error event.
    with pytest.raises(openai.APIError):
        collect_stream(c.chat.completions.create(model=glm.model, messages=hi, tools=[WEATHER],
                                                 tool_choice="required", stream=True))


def test_deepseek_v3_two_calls_streamed_and_not(deepseek):
    c = client(deepseek)
    messages = [{"role": "user", "content": "Paris and cats?"}]
    r = c.chat.completions.create(model=deepseek.model, messages=messages, tools=[WEATHER, SEARCH])
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content == "Two calls."
    assert [t.function.name for t in ch.message.tool_calls] == ["get_weather", "search"]
    assert json.loads(ch.message.tool_calls[0].function.arguments) == {"city": "Paris", "days": 3}
    assert json.loads(ch.message.tool_calls[1].function.arguments) == {"query": "cats"}
    assert len({t.id for t in ch.message.tool_calls}) == 2

    content, _, calls, finish, pieces = collect_stream(
        c.chat.completions.create(model=deepseek.model, messages=messages, tools=[WEATHER, SEARCH], stream=True))
    assert finish == "tool_calls" and content == "Two calls."
    assert not any("｜" in p for p in pieces)
    assert [(x["name"], x["arguments"]) for x in calls] == [
        (t.function.name, t.function.arguments) for t in ch.message.tool_calls]

    # The result of the first call goes back through the DeepSeek template, arguments in its json fence.
    messages.append(ch.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": ch.message.tool_calls[0].id, "content": "sunny"})
    prompt = rendered(deepseek, messages, [WEATHER, SEARCH])
    assert '<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris", "days": 3}\n```' in prompt
    r2 = c.chat.completions.create(model=deepseek.model, messages=messages, tools=[WEATHER, SEARCH])
    assert r2.choices[0].message.content == "It is sunny."
    assert r2.choices[0].finish_reason == "stop"
