#!/usr/bin/env python3
"""Chat requests with tools, rendered by a reference renderer, for the server's rendering parity test.

Each case is an OpenAI request body as a client sends it (keys in the client's order: "type" before
"function", schema properties unsorted), and the prompt text the template gives for it.

  --renderer transformers   apply_chat_template of Hugging Face transformers (the reference), on a fast
                            tokenizer of tests/data/tokenizer/glm_like; also writes its token ids ("ids") for the
                            GLM cases, and "error" for a case it refuses to render
  --renderer jinja2         jinja2 with the environment transformers uses (trim_blocks, lstrip_blocks, its
                            tojson without key sorting, raise_exception, message keys whose value is null
                            dropped): runnable without transformers, text only

Writes tests/data/tokenizer/tool_chat_cases.json (or --out). The committed file names its renderer; re-run with
--renderer transformers where transformers is installed and compare (--check) to confirm the two agree.
Run from the repository root: python3 tools/golden/tokenizer/make_tool_chat_fixtures.py --renderer transformers
(transformers needs no torch here: pip install transformers).
"""
import argparse
import datetime
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "tokenizer"

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "required": ["city"],
                          "properties": {"city": {"type": "string", "description": "City name"},
                                         "days": {"type": "integer", "minimum": 1},
                                         "alpha": {"type": "boolean"}}}}}
SEARCH = {"type": "function", "function": {"name": "web_search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["query", "limit"]}, "description": "Search the web"}}

CASES = [
    ("glm-4.6.jinja", "", "<|endoftext|>", {
        "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]}),
    ("glm-4.6.jinja", "", "<|endoftext|>", {
        "messages": [{"role": "system", "content": "Be brief."}, {"content": "Find cats", "role": "user"}],
        "tools": [SEARCH, WEATHER]}),
    ("glm-4.6.jinja", "", "<|endoftext|>", {
        "messages": [{"role": "user", "content": "Weather in Paris for 2 days?"},
                     {"role": "assistant", "content": "", "tool_calls": [
                         {"id": "call_1", "type": "function",
                          "function": {"name": "get_weather", "arguments": {"days": 2, "city": "Paris"}}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}],
        "tools": [WEATHER]}),
    ("glm-4.6.jinja", "", "<|endoftext|>", {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Part one. "},
                                                  {"text": "Part two.", "type": "text"}]}],
        "tools": [WEATHER], "chat_template_kwargs": {"enable_thinking": False}}),
    ("deepseek-v3.jinja", "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>", {
        "messages": [{"role": "system", "content": "You can call tools."}, {"role": "user", "content": "Paris?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "call_9", "type": "function",
                          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                     {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}],
        "tools": [WEATHER]}),
    # What the official client sends back after a tool call: the assistant message with "content": null.
    ("glm-4.6.jinja", "", "<|endoftext|>", {
        "messages": [{"role": "user", "content": "Weather in Paris?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "call_2", "type": "function",
                          "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                     {"role": "tool", "tool_call_id": "call_2", "content": "sunny"}],
        "tools": [WEATHER]}),
]


def flatten_parts(messages):
    """What the server gives the template: a content given as text parts becomes their concatenation; keys
    whose value is null are dropped (as transformers' apply_chat_template does)."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        if isinstance(m.get("content"), list):
            m["content"] = "".join(p["text"] for p in m["content"] if p.get("type") == "text")
        out.append(m)
    return out


def render_jinja2(source, bos, eos, body):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda f: datetime.datetime.now().strftime(f)
    kwargs = dict(body.get("chat_template_kwargs") or {})
    return env.from_string(source).render(messages=flatten_parts(body["messages"]), tools=body.get("tools"),
                                          add_generation_prompt=True, bos_token=bos, eos_token=eos, **kwargs)


_TOKENIZER = None


def transformers_tokenizer():
    global _TOKENIZER
    if _TOKENIZER is None:
        from transformers import PreTrainedTokenizerFast
        _TOKENIZER = PreTrainedTokenizerFast(tokenizer_file=str(DATA / "glm_like" / "tokenizer.json"))
    return _TOKENIZER


def render_transformers(source, bos, eos, body):
    """Text, and token ids as transformers encodes the rendered chat (no special tokens added)."""
    tok = transformers_tokenizer()
    kwargs = dict(body.get("chat_template_kwargs") or {})
    args = dict(tools=body.get("tools"), chat_template=source, add_generation_prompt=True, bos_token=bos,
                eos_token=eos, **kwargs)
    text = tok.apply_chat_template(flatten_parts(body["messages"]), tokenize=False, **args)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return text, ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--renderer", choices=["jinja2", "transformers"], required=True)
    ap.add_argument("--out", default=str(DATA / "tool_chat_cases.json"))
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    a = ap.parse_args()
    render = render_jinja2 if a.renderer == "jinja2" else render_transformers
    if a.renderer == "jinja2":
        import jinja2
        version = "jinja2 " + jinja2.__version__
    else:
        import transformers
        version = "transformers " + transformers.__version__
    cases = []
    for tmpl, bos, eos, body in CASES:
        source = (DATA / "templates" / tmpl).read_text()
        body = dict({"model": "m"}, **body)
        case = {"template": tmpl, "bos_token": bos, "eos_token": eos, "body": json.dumps(body, ensure_ascii=False)}
        try:
            out = render(source, bos, eos, body)
        except Exception as e:  # the reference refuses this chat: so must the server
            case["error"] = f"{type(e).__name__}: {e}"
        else:
            if isinstance(out, tuple):
                case["expected"] = out[0]
                if tmpl.startswith("glm"):  # the glm_like tokenizer belongs to these templates
                    case["ids"] = out[1]
            else:
                case["expected"] = out
        cases.append(case)
    doc = {"renderer": version, "cases": cases}
    if a.check:
        old = json.loads(pathlib.Path(a.out).read_text())
        bad = [i for i, (x, y) in enumerate(zip(old["cases"], cases))
               if x.get("expected") != y.get("expected") or ("error" in x) != ("error" in y)]
        print(f"{version} vs {old['renderer']}: {len(cases) - len(bad)}/{len(cases)} cases agree", bad)
        return 1 if bad or len(old["cases"]) != len(cases) else 0
    pathlib.Path(a.out).write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {len(cases)} cases rendered by {version} to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
