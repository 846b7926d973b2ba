#!/usr/bin/env python3
"""Encoding throughput on one core: Hugging Face `tokenizers` vs `moeserve tokenize --jsonl`, same corpus.

usage: scripts/bench-tokenizer.py [--binary build/moeserve] [--tokenizer FILE] [--mb 8]
The corpus is the golden hard strings plus the Python standard library's sources, one JSON string per line,
repeated to about --mb megabytes. Both sides encode each line separately without special tokens; the ids
are compared line by line. Needs `pip install tokenizers`.
"""
import argparse
import glob
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
ROOT = pathlib.Path(__file__).resolve().parents[1]


def corpus(mb):
    lines = [c["text"] for s in json.loads((ROOT / "tests/data/tokenizer/encode_cases.json").read_text())
             for c in s["cases"]]
    for path in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))[:80]:
        text = pathlib.Path(path).read_text(errors="replace")
        lines += [text[i:i + 2000] for i in range(0, len(text), 2000)]
    out, size = [], 0
    while size < mb * 1e6:
        for line in lines:
            out.append(line)
            size += len(line.encode())
    return out, size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=str(ROOT / "build/moeserve"))
    ap.add_argument("--tokenizer", default=str(ROOT / "tests/data/tokenizer/glm_like/tokenizer.json"))
    ap.add_argument("--mb", type=float, default=8)
    args = ap.parse_args()
    from tokenizers import Tokenizer
    lines, size = corpus(args.mb)
    tok = Tokenizer.from_file(args.tokenizer)
    t0 = time.perf_counter()
    hf_ids = [tok.encode(s, add_special_tokens=False).ids for s in lines]
    hf_s = time.perf_counter() - t0
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for s in lines:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
        path = f.name
    cmd = ["taskset", "-c", "0", args.binary, "tokenize", "--tokenizer", args.tokenizer, "--jsonl", path,
           "--no-special-tokens"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    ms_s = time.perf_counter() - t0
    os.unlink(path)
    ours = [json.loads(l) for l in res.stdout.splitlines()]
    mismatches = sum(a != b for a, b in zip(ours, hf_ids)) + abs(len(ours) - len(hf_ids))
    n_tok = sum(len(x) for x in hf_ids)
    print(f"corpus: {len(lines)} strings, {size / 1e6:.1f} MB, {n_tok} tokens")
    print(f"hf tokenizers (1 thread, encode per string): {hf_s:.2f} s  {size / 1e6 / hf_s:.2f} MB/s")
    print(f"moeserve tokenize --jsonl (1 core, incl. process start, JSON in/out): {ms_s:.2f} s  "
          f"{size / 1e6 / ms_s:.2f} MB/s")
    print(f"ratio moeserve/hf time: {ms_s / hf_s:.2f}   id mismatches: {mismatches}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
