#!/usr/bin/env python3
"""Golden fixtures for the tokenizer room, made by Hugging Face `tokenizers` and `transformers`.

Writes into tests/data/tokenizer/:
  glm_like/tokenizer.json, variant/tokenizer.json   trained byte-level BPE tokenizers
  encode_cases.json                                 hard strings with HF's ids and decodes
  chat_cases.json                                   conversations rendered by apply_chat_template
Run from the repository root: python3 tools/golden/tokenizer/make_fixtures.py
"""
import json
import os
import pathlib
import sys

os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = pathlib.Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "tokenizer"

GPT4_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GLM_SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                "<|assistant|>", "<|observation|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]


def training_corpus():
    """Text from the Python standard library sources plus multilingual lines: deterministic for a given Python."""
    import inspect
    import email, json as js, argparse, textwrap, difflib, collections
    lines = []
    for mod in (email, js, argparse, textwrap, difflib, collections):
        try:
            lines += inspect.getsource(mod).splitlines()
        except (OSError, TypeError):
            pass
    lines += ["机器学习是人工智能的一个分支。", "今天天气很好，我们去公园吧。", "東京は日本の首都です。",
              "한국어 문장도 조금 넣습니다.", "Привет, как дела? Всё хорошо.", "Ελληνικά γράμματα", "مرحبا بالعالم",
              "emoji 😀😃😄 👩‍👩‍👧‍👦 🏳️‍🌈", "café naïve résumé façade", "numbers 1234567890 3.14159 2024-01-01"] * 20
    return lines


HARD_STRINGS = [
    "", " ", "  ", "\n", "\r\n", "\t", "Hello world", " Hello world", "Hello  world   ", "hello\n\nworld\n",
    "line one\r\nline two\r\n\r\nline four", "   leading and trailing   ", "\t\ttabs\tand spaces \t ",
    "机器学习是人工智能的一个分支。", "中文English混合text测试", "日本語のテキスト、カタカナとひらがな。", "한국어 텍스트입니다",
    "😀", "👩‍👩‍👧‍👦 family", "🏳️‍🌈 flag and 👍🏽 skin tone", "e\u0301 combining acute, a\u0308\u0301 stacked",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319 zalgo", "café naïve", "ﬁ ligature ＦＵＬＬ width ①②",
    "1234567890", "3.14159265358979", "1,000,000 and 1e-10", "2024-01-01T12:34:56Z", "v1.2.3-rc.4",
    "def foo(x):\n    return x ** 2  # square\n", "int main() { return 0; }\n", "if (a && b || !c) { x += 1; }",
    "<html><body class=\"x\">&amp;</body></html>", "SELECT * FROM t WHERE id = 'abc';", "I'm you're they'll we'd it's",
    "DON'T SHOUT'S", "[gMASK]<sop><|user|>\nhi<|assistant|>", "text<|endoftext|>more", "<think>reason</think>answer",
    "a<|user|>b<|user|>c", "<|user |> not special", "<tool_call>get<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>",
    "x" * 300, "supercalifragilisticexpialidocious" * 8, "ab" * 200, "🙂" * 50, "   \n   \n   ",
    "mixed\u00a0nbsp\u2003em space\u3000ideographic", "zero\u200bwidth\u200djoiner", "\u0000 nul and \u007f del",
    "https://example.com/path?query=1&b=2#frag", "user@example.com", "$$\\frac{a}{b}$$", "~!@#$%^&*()_+`-=[]{}|;':\",./<>?",
    "Ünïcödé ÀÉÎÕÜ ß ẞ", "İstanbul ǅ ǈ", "Gruß Gott", "ΑΒΓ αβγ", "foo_word alone", "xfoo_word glued", "spaced   <|custom|>   token",
]

CUSTOM_TOKENS = [AddedToken("<|custom|>", lstrip=True, rstrip=True, special=False, normalized=False),
                 AddedToken("foo_word", single_word=True, special=False, normalized=False),
                 AddedToken("Normed", normalized=True, special=False)]


def train_glm_like(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT4_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=GLM_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens(CUSTOM_TOKENS)
    tok.post_processor = processors.TemplateProcessing(
        single="[gMASK] <sop> $A", special_tokens=[("[gMASK]", tok.token_to_id("[gMASK]")),
                                                    ("<sop>", tok.token_to_id("<sop>"))])
    return tok


def train_variant(corpus):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("\r\n", "\n"),
                                           normalizers.Lowercase(), normalizers.Strip(left=False, right=True)])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(Regex(r"[\p{P}]"), behavior="merged_with_next"),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens(CUSTOM_TOKENS)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>",
                                                       special_tokens=[("<s>", 0), ("</s>", 1)])
    return tok


def encode_cases(name, tok):
    cases = []
    for s in HARD_STRINGS:
        ids = tok.encode(s, add_special_tokens=False).ids
        cases.append({"text": s, "ids": ids,
                      "ids_special": tok.encode(s, add_special_tokens=True).ids,
                      "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    return {"tokenizer": f"{name}/tokenizer.json", "cases": cases}


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "天气 lookup",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}, "days": {"type": "integer"}},
                                               "required": ["city"]}}}]

CONVERSATIONS = [
    {"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": True},
    {"messages": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "思考一下"},
                  {"role": "assistant", "content": "答案", "reasoning_content": "让我想想"}],
     "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "q1"},
                  {"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\nold answer"},
                  {"role": "user", "content": "q2"}], "add_generation_prompt": True, "kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "q"}], "add_generation_prompt": True, "kwargs": {"enable_thinking": True}},
    {"messages": [{"role": "system", "content": "sys A"}, {"role": "system", "content": "sys B"},
                  {"role": "user", "content": "  spaced  "}], "add_generation_prompt": False},
]
GLM_TOOL_CONVS = [
    {"messages": [{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"type": "function", "function": {"name": "get_weather",
                                                        "arguments": {"city": "Paris", "days": 3}}}]},
                  {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "tool", "content": "second"}],
     "tools": TOOLS, "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "two"}]}],
     "tools": TOOLS, "add_generation_prompt": True},
]
DS_TOOL_CONVS = [
    {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "Calling.", "tool_calls": [
                      {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                      {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
                  {"role": "tool", "content": "21C"}, {"role": "tool", "content": "25C"},
                  {"role": "assistant", "content": "Paris 21C, Rome 25C."}, {"role": "user", "content": "thanks"}],
     "add_generation_prompt": True},
]


def chat_cases():
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_file=str(DATA / "glm_like" / "tokenizer.json"))
    suites = [("glm-4.6.jinja", "", "<|endoftext|>", CONVERSATIONS + GLM_TOOL_CONVS),
              ("deepseek-v3.1.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", CONVERSATIONS + DS_TOOL_CONVS),
              ("deepseek-v3.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
               CONVERSATIONS + DS_TOOL_CONVS + [dict(DS_TOOL_CONVS[0], tools=TOOLS)])]
    out = []
    for template, bos, eos, convs in suites:
        text = (DATA / "templates" / template).read_text()
        for conv in convs:
            kwargs = dict(conv.get("kwargs", {}))
            hf.bos_token, hf.eos_token = bos or None, eos
            try:
                rendered = hf.apply_chat_template(conv["messages"], tools=conv.get("tools"), chat_template=text,
                                                  add_generation_prompt=conv["add_generation_prompt"],
                                                  tokenize=False, **kwargs)
            except Exception as e:  # the template refuses this conversation: not a fixture
                print(f"skip {template}: {type(e).__name__}: {e}")
                continue
            out.append({"template": template, "bos_token": bos, "eos_token": eos, "messages": conv["messages"],
                        "tools": conv.get("tools"), "add_generation_prompt": conv["add_generation_prompt"],
                        "kwargs": kwargs, "expected": rendered})
    return out


def main():
    corpus = training_corpus()
    for name, fn in (("glm_like", train_glm_like), ("variant", train_variant)):
        tok = fn(corpus)
        (DATA / name).mkdir(parents=True, exist_ok=True)
        tok.save(str(DATA / name / "tokenizer.json"))
    enc = [encode_cases(n, Tokenizer.from_file(str(DATA / n / "tokenizer.json"))) for n in ("glm_like", "variant")]
    (DATA / "encode_cases.json").write_text(json.dumps(enc, ensure_ascii=False, indent=1))
    (DATA / "chat_cases.json").write_text(json.dumps(chat_cases(), ensure_ascii=False, indent=1))
    print("fixtures written to", DATA)


if __name__ == "__main__":
    sys.exit(main())
