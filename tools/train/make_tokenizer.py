#!/usr/bin/env python3
"""Byte-level BPE tokenizer for the built-in model, trained with `tokenizers` on the training split only.

It has GLM-5's special tokens and split regex (as the random built-in tokenizer has), ids 0..19 for the special
tokens, and a GLM-style chat template in tokenizer_config.json that moeserve's Jinja subset renders.

Usage: python3 tools/train/make_tokenizer.py --data tools/train/data --vocab 8192
writes DATA/tokenizer.json and DATA/tokenizer_config.json.
"""
import argparse
import gzip
import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
            "<|assistant|>", "<|observation|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
            "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>"]
# An assistant turn ends where the next role begins, as GLM-5's eos list says.
EOS_TOKENS = ["<|endoftext|>", "<|user|>", "<|observation|>"]
SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# The same template as the random built-in model's (src/tokenizer/builtin.cpp); the training script renders
# chats with render_chat() below, and the parity test checks both agree.
CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}<|system|>{{ '\n' + m.content }}"
    "{%- elif m.role == 'user' -%}<|user|>{{ '\n' + m.content }}"
    "{%- elif m.role == 'assistant' -%}<|assistant|>{{ '\n' }}"
    "{%- if m.reasoning_content -%}<think>{{ m.reasoning_content | trim }}</think>"
    "{%- else -%}<think></think>{%- endif -%}{{ '\n' + (m.content | trim) }}"
    "{%- elif m.role == 'tool' -%}<|observation|>{{ '\n<tool_response>\n' + m.content + "
    "'\n</tool_response>' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{ '\n<think></think>' }}{%- endif -%}"
    "{%- endif -%}")


def render_chat(messages, add_generation_prompt=False):
    """CHAT_TEMPLATE for system/user/assistant messages without reasoning, in Python."""
    out = "[gMASK]<sop>"
    for m in messages:
        if m["role"] == "system":
            out += "<|system|>\n" + m["content"]
        elif m["role"] == "user":
            out += "<|user|>\n" + m["content"]
        elif m["role"] == "assistant":
            out += "<|assistant|>\n<think></think>\n" + m["content"].strip()
        else:
            raise ValueError(m["role"])
    if add_generation_prompt:
        out += "<|assistant|>"
    return out


def documents(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        doc = []
        for line in f:
            if line.rstrip("\n") == "\f":
                yield "".join(doc)
                doc = []
            else:
                doc.append(line)
        if doc:
            yield "".join(doc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="tools/train/data")
    ap.add_argument("--vocab", type=int, default=8192)
    a = ap.parse_args()
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(documents(os.path.join(a.data, "corpus.train.txt.gz")), trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    tok.save(os.path.join(a.data, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 2048,
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "additional_special_tokens": SPECIALS[1:],
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(a.data, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    valid = "".join(documents(os.path.join(a.data, "corpus.valid.txt.gz")))
    n = len(tok.encode(valid).ids)
    print(f"vocab {tok.get_vocab_size()}; validation text {len(valid.encode())} bytes -> {n} tokens "
          f"({len(valid.encode()) / n:.2f} bytes/token)")


if __name__ == "__main__":
    main()
