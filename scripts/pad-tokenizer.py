#!/usr/bin/env python3
"""Writes a copy of a byte-level BPE tokenizer.json whose vocabulary covers ids up to a model's vocab_size.

Usage: pad-tokenizer.py SRC_TOKENIZER_JSON MODEL_CONFIG_JSON DST_TOKENIZER_JSON

A generated checkpoint (gen-model) has no tokenizer; serving it with a smaller model's tokenizer would decode
every id past that tokenizer's vocabulary to nothing. Each missing id gets the entry "<tok_ID>" (printable
ASCII, which byte-level BPE maps to itself), so every token the model can sample decodes to its own text.
No merges lead to the new entries: encoding is unchanged.
"""
import json
import sys


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    src, config, dst = sys.argv[1:]
    with open(src, encoding="utf-8") as f:
        tok = json.load(f)
    with open(config, encoding="utf-8") as f:
        vocab_size = json.load(f).get("vocab_size")
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        print(f"{config}: vocab_size missing or not a positive integer", file=sys.stderr)
        return 1
    model = tok.get("model", {})
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        print(f"{src}: not a BPE tokenizer.json (model.type / model.vocab)", file=sys.stderr)
        return 1
    taken = set(model["vocab"].values()) | {a["id"] for a in tok.get("added_tokens", [])}
    added = 0
    for i in range(vocab_size):
        if i not in taken:
            model["vocab"][f"<tok_{i}>"] = i
            added += 1
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    print(f"{dst}: {added} ids added up to vocab_size {vocab_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
