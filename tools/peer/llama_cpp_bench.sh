#!/usr/bin/env bash
# moeserve next to llama.cpp on the CPU, same checkpoint, same machine, same run; prints one Markdown table.
# Not part of `make test`: it downloads the llama-cpp-python sdist from PyPI, builds the llama.cpp vendored in
# it (llama-bench, llama-batched-bench), converts the checkpoint with its convert_hf_to_gguf.py (bf16 and
# q8_0), measures the memory-read bandwidth, and runs both engines with 1 and 2 threads.
#
# Usage: tools/peer/llama_cpp_bench.sh [--work DIR] [--model CKPT] [--threads "1 2"] [--python PY]
#   --work    scratch folder for the sdist, the llama.cpp build, the checkpoint and the GGUFs
#             (default: ${XDG_CACHE_HOME:-$HOME/.cache}/moeserve-peer)
#   --model   Hugging Face checkpoint (default: gen-model --arch deepseek_v3 --preset small, bf16)
#   --model-fp8  the same model as FP8 (128x128 blocks) for moeserve's 8-bit row (default: gen-model
#             --weights fp8 with the same seed, i.e. the same weights quantised; none when --model is given)
#   --python  a Python with torch, transformers, numpy, safetensors, sentencepiece (the converter's needs);
#             default: a venv under --work, installed from PyPI on first use (several GB: torch)
# Environment: MOESERVE (the moeserve binary, default build/moeserve), LLAMA_CPP_PYTHON_VERSION (sdist pin).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${XDG_CACHE_HOME:-$HOME/.cache}/moeserve-peer
MODEL=""
MODEL_FP8=""
THREADS="1 2"
PY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --work) WORK=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --model-fp8) MODEL_FP8=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
MOESERVE=${MOESERVE:-$ROOT/build/moeserve}
[ -x "$MOESERVE" ] || { echo "no moeserve binary at $MOESERVE (build it or set MOESERVE)" >&2; exit 1; }
mkdir -p "$WORK"
log() { echo "[peer] $*" >&2; }

# ---- llama.cpp from the llama-cpp-python sdist ------------------------------------------------------------
SDIST_SPEC="llama-cpp-python${LLAMA_CPP_PYTHON_VERSION:+==$LLAMA_CPP_PYTHON_VERSION}"
if ! ls "$WORK"/llama_cpp_python-*.tar.gz > /dev/null 2>&1; then
  log "downloading the $SDIST_SPEC sdist"
  python3 -m pip download --no-binary :all: --no-deps "$SDIST_SPEC" -d "$WORK" >&2
fi
SDIST=$(ls -t "$WORK"/llama_cpp_python-*.tar.gz | head -1)
SRC="$WORK/$(basename "$SDIST" .tar.gz)"
[ -d "$SRC" ] || tar xzf "$SDIST" -C "$WORK"
LLAMA="$SRC/vendor/llama.cpp"
LB="$LLAMA/build/bin"
if [ ! -x "$LB/llama-bench" ] || [ ! -x "$LB/llama-batched-bench" ]; then
  log "building llama.cpp ($(basename "$SRC")) with -march=native"
  cmake -S "$LLAMA" -B "$LLAMA/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF > "$WORK/llama_cmake.log" 2>&1
  nice -n 5 cmake --build "$LLAMA/build" -j"$(nproc)" --target llama-bench llama-batched-bench \
    > "$WORK/llama_build.log" 2>&1
fi

# ---- the converter's Python -------------------------------------------------------------------------------
if [ -z "$PY" ]; then
  if [ ! -x "$WORK/venv/bin/python" ]; then
    log "making a venv for convert_hf_to_gguf.py (torch, transformers: several GB)"
    python3 -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" install -q torch transformers numpy safetensors sentencepiece protobuf >&2
  fi
  PY="$WORK/venv/bin/python"
fi

# ---- checkpoint and GGUFs -----------------------------------------------------------------------------------
if [ -z "$MODEL" ]; then
  MODEL="$WORK/ds_small"
  if [ ! -f "$MODEL/config.json" ]; then
    log "gen-model --arch deepseek_v3 --preset small"
    "$MOESERVE" gen-model --arch deepseek_v3 --preset small --weights bf16 --out "$MODEL" > /dev/null
  fi
  MODEL_FP8="$WORK/ds_small_fp8"
  if [ ! -f "$MODEL_FP8/config.json" ]; then
    log "gen-model --arch deepseek_v3 --preset small --weights fp8"
    "$MOESERVE" gen-model --arch deepseek_v3 --preset small --weights fp8 --out "$MODEL_FP8" > /dev/null
  fi
fi
# The converter needs a tokenizer and recognises it by a hash of its output: the generated checkpoints have
# none, so a copy of the checkpoint (links) gets the test tokenizer, and the converter is told it is
# DeepSeek-V3's pre-tokenizer. Neither engine tokenizes text here (both benchmarks use token ids).
CONV="$WORK/convert_input"
rm -rf "$CONV" && mkdir -p "$CONV"
for f in "$MODEL"/*; do ln -s "$(readlink -f "$f")" "$CONV/$(basename "$f")"; done
[ -e "$CONV/tokenizer.json" ] || cp "$ROOT/tests/data/tokenizer/glm_like/tokenizer.json" "$CONV/tokenizer.json"
[ -e "$CONV/tokenizer_config.json" ] || echo '{"tokenizer_class": "PreTrainedTokenizerFast"}' > "$CONV/tokenizer_config.json"
STAMP=$(stat -c %Y "$MODEL/config.json")
for q in bf16 q8_0; do
  out="$WORK/model-$q-$STAMP.gguf"
  if [ ! -f "$out" ]; then
    log "converting to $q"
    (cd "$LLAMA" && "$PY" - "$CONV" --outtype "$q" --outfile "$out" > "$WORK/convert_$q.log" 2>&1) << 'PYEOF'
import runpy, sys
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
sys.path.insert(0, ".")
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "deepseek-v3"
runpy.run_path("convert_hf_to_gguf.py", run_name="__main__")
PYEOF
  fi
done

# ---- runs ---------------------------------------------------------------------------------------------------
RES="$WORK/results"
rm -rf "$RES" && mkdir -p "$RES"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
log "load average at start: $LOAD_START"
# Bandwidth: moeserve's roofline ceilings (multi-threaded reads of a buffer far past the L3), per thread count.
for t in $THREADS; do
  OMP_NUM_THREADS=$t "$MOESERVE" profile --model "$MODEL" --batch 1 --context 128 --steps 10 \
    --kv-cache-dtype bf16 --json > "$RES/profile_t$t.json" 2> "$RES/profile_t$t.err" || true
done
"$MOESERVE" inspect --json "$MODEL" > "$RES/inspect.json"
for t in $THREADS; do
  for q in bf16 q8_0; do
    g="$WORK/model-$q-$STAMP.gguf"
    "$LB/llama-bench" -m "$g" -t "$t" -p 128 -n 0 -r 5 -o json > "$RES/llama_${q}_t${t}_pp.json" 2> /dev/null
    "$LB/llama-bench" -m "$g" -t "$t" -p 0 -n 32 -d 128 -r 5 -o json > "$RES/llama_${q}_t${t}_tg.json" 2> /dev/null
    "$LB/llama-batched-bench" -m "$g" -t "$t" -tb "$t" -c 4096 -b 2048 -ub 512 -npp 128 -ntg 32 -npl 8 \
      --output-format jsonl > "$RES/llama_${q}_t${t}_b8.jsonl" 2> /dev/null
  done
  OMP_NUM_THREADS=$t "$MOESERVE" bench-one-batch --model "$MODEL" --batch-size 1,8 --input-len 128 \
    --output-len 32 --kv-cache-dtype bf16 --json > "$RES/moeserve_t$t.json" 2> /dev/null
  if [ -n "$MODEL_FP8" ]; then
    OMP_NUM_THREADS=$t "$MOESERVE" bench-one-batch --model "$MODEL_FP8" --batch-size 1,8 --input-len 128 \
      --output-len 32 --kv-cache-dtype bf16 --json > "$RES/moeserve_fp8_t$t.json" 2> /dev/null
  fi
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$RES" "$THREADS" "$LOAD_START" "$LOAD_END" "$(uname -m)" "$(nproc)" << 'PYEOF'
import json, pathlib, sys
res, threads, load0, load1, arch, ncpu = sys.argv[1:]
res = pathlib.Path(res)

def jl(p):
    p = res / p
    if not p.exists() or p.stat().st_size == 0:
        return None
    txt = p.read_text().strip()
    try:
        return json.loads(txt)
    except json.JSONDecodeError:
        return [json.loads(l) for l in txt.splitlines() if l.startswith("{")]

def llama_bench(name):
    # The median of llama-bench's repetitions (moeserve reports its median decode step).
    r = jl(name)
    if not r:
        return None
    ts = sorted(r[0].get("samples_ts") or [r[0]["avg_ts"]])
    return ts[len(ts) // 2]

def batched(name):
    r = jl(name)
    if not r:
        return None
    r = r if isinstance(r, list) else [r]
    for row in r:
        if row.get("pl") == 8:
            return row.get("speed_tg")
    return None

insp = jl("inspect.json") or {}
floor_bytes = insp.get("decode_floor_bytes")
def fmt(v, unit=" tok/s"):
    return "n/a" if v is None else f"{v:.0f}{unit}"

print(f"machine: {ncpu}-core {arch}; load average (1, 5, 15 min) at start {load0}, at end {load1}")
print(f"decode floor bytes per token (batch 1, weights read): {floor_bytes}")
print()
print("| threads | engine | prefill 128 tokens | decode batch 1 (context 128) | % of floor | decode batch 8 |")
print("| --- | --- | --- | --- | --- | --- |")
for t in threads.split():
    prof = jl(f"profile_t{t}.json") or {}
    ce = prof.get("decode", {}).get("ceilings", {}) if isinstance(prof, dict) else {}
    bw = ce.get("mem_read_gbps") or ce.get("mem_gbps")
    floor_tps = bw * 1e9 / floor_bytes if bw and floor_bytes else None
    def pct(v):
        return "n/a" if v is None or floor_tps is None else f"{100 * v / floor_tps:.0f}%"
    rows = []
    for q in ("bf16", "q8_0"):
        pp = llama_bench(f"llama_{q}_t{t}_pp.json")
        tg = llama_bench(f"llama_{q}_t{t}_tg.json")
        b8 = batched(f"llama_{q}_t{t}_b8.jsonl")
        rows.append((f"llama.cpp {q}", pp, tg, b8))
    for tag, name in (("", "moeserve bf16"), ("_fp8", "moeserve fp8 block 128")):
        ms = jl(f"moeserve{tag}_t{t}.json") or {}
        runs = {r["batch_size"]: r for r in ms.get("results", [])} if isinstance(ms, dict) else {}
        if not runs:
            continue
        b1, b8 = runs.get(1, {}), runs.get(8, {})
        rows.append((name, b1.get("prefill_tokens_per_s"), b1.get("decode_tokens_per_s"),
                     b8.get("decode_tokens_per_s")))
    for name, pp, tg, b8v in rows:
        ref = rows[1] if "fp8" in name else rows[0]  # 8-bit against q8_0, bf16 against bf16
        rel = lambda v, r: "" if name.startswith("llama.cpp") or v is None or r is None else f" ({v / r:.2f}x)"
        print(f"| {t} | {name} | {fmt(pp)}{rel(pp, ref[1])} | {fmt(tg)}{rel(tg, ref[2])} | {pct(tg)} | "
              f"{fmt(b8v)}{rel(b8v, ref[3])} |")
    if bw:
        print(f"| {t} | floor | | {floor_tps:.0f} tok/s at {bw:.1f} GB/s read | 100% | |")
PYEOF
