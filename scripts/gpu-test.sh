#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (also one without package access, see the README's GPU section): CUDA build,
# every GPU test (ctest -L gpu) including the CUDA executor on the golden fixtures and on a full-width
# glm5-slice checkpoint, bench-one-batch on that checkpoint, the e2e suite against `serve` on the GPU, the
# kernel benchmarks, and one summary table at the end.
# Switches: GPU_TEST_SLICE=0 (no glm5-slice checkpoint), GPU_TEST_SLICE_FORMATS (default "nvfp4 fp8 bf16"; the
# first is benchmarked and served), GPU_TEST_E2E=0, GPU_TEST_E2E_SLICE=0 (the e2e suite on the built-in model
# only), GPU_TEST_BENCH=0 (no bench-one-batch, profiles or kernel benchmarks), GPU_TEST_KERNEL_BENCH=0 (no
# kernel benchmarks),
# GPU_TEST_NO_GRAPH_BENCH=0 (bench-one-batch with graphs only),
# GPU_TEST_NO_PDL_BENCH=0 (no bench-one-batch run with --disable-pdl), GPU_TEST_TESTS=0 (no ctest: e.g. a second
# run for the e2e suite on the same machine where one run would pass a time limit),
# GPU_TEST_BENCH_TIMEOUT=seconds (each kernel benchmark), GPU_TEST_SHARD=K/N (a shard of the GPU tests),
# BUILD=dir.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build-gpu}
archs=${MOESERVE_CUDA_ARCHS:-90a}
log=${GPU_TEST_LOG:-$(mktemp -d)}
mkdir -p "$log"
status() { printf '%-28s %s\n' "$1" "$2" >>"$log/summary"; }

source scripts/gpu-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
# The kernel benchmarks that exist in this tree (each issue's kernels bring their own).
benches=(bench_cuda_kernels bench_moe_experts bench_moe_prefill bench_mla_decode bench_stream_patterns bench_decode_layout)
if cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOESERVE_CUDA=ON -DMOESERVE_CUDA_ARCHS="$archs" \
     -DMOESERVE_WERROR=ON "${MS_BUNDLE_CMAKE_ARGS[@]}" >"$log/configure" 2>&1 &&
   cmake --build "$build" -j "$(nproc)" --target moeserve >"$log/build" 2>&1; then
  status "build moeserve" ok
else
  tail -n 40 "$log/configure" "$log/build"
  status build FAILED
  cat "$log/summary"
  exit 1
fi
bin="$build/moeserve"

# glm5-slice checkpoints (full GLM-5 widths, 1 dense + 1 MoE layer) in the formats of GPU_TEST_SLICE_FORMATS
# (nvfp4 about 10 GB, fp8 about 15 GB, bf16 about 25 GB on disk). The first is written while the tests build
# and is the one the GPU tests, the benchmarks and the e2e suite use; the others are written while those run,
# and the GPU Executor is compared with the CPU Executor on each of them at the end.
read -r -a formats <<<"${GPU_TEST_SLICE_FORMATS:-nvfp4 fp8 bf16}"
[ "${GPU_TEST_SLICE:-1}" = 1 ] || formats=()
slices=()
gen_slices() {
  for fmt in "$@"; do
    dir="$PWD/$build/slices/glm5_$fmt"
    if [ ! -f "$dir/config.json" ]; then
      start=$(date +%s)
      if "$bin" gen-model --arch glm5 --preset glm5-slice --layers 2 --weights "$fmt" --out "$dir" \
           >"$log/gen-model-$fmt" 2>&1; then
        status "glm5-slice $fmt" "written in $(($(date +%s) - start)) s"
      else
        tail -n 5 "$log/gen-model-$fmt"
        status "glm5-slice $fmt" FAILED
      fi
    fi
  done
}
[ ${#formats[@]} -gt 0 ] && { gen_slices "${formats[0]}" & gen_pid=$!; }
targets=(test_gpu)
known=$(cmake --build "$build" --target help 2>/dev/null)
for t in "${benches[@]}"; do grep -q "\b$t\b" <<<"$known" && targets+=("$t"); done
if cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >>"$log/build" 2>&1; then
  status build "ok (${targets[*]})"
else
  tail -n 40 "$log/build"
  status build FAILED
fi
[ -n "${gen_pid:-}" ] && wait "$gen_pid"
slice=""
if [ ${#formats[@]} -gt 0 ] && [ -f "$PWD/$build/slices/glm5_${formats[0]}/config.json" ]; then
  slice="$PWD/$build/slices/glm5_${formats[0]}"
  export MOESERVE_TEST_SLICES="$slice"
fi
[ ${#formats[@]} -gt 1 ] && { gen_slices "${formats[@]:1}" & rest_pid=$!; }

# GPU_TEST_SHARD=K/N runs the K-th of N shards of every GPU test binary (gtest sharding; K from 0), so that
# the whole suite can be spread over several shorter runs.
if [ -n "${GPU_TEST_SHARD:-}" ]; then
  case "$GPU_TEST_SHARD" in
    */*) export GTEST_SHARD_INDEX="${GPU_TEST_SHARD%/*}" GTEST_TOTAL_SHARDS="${GPU_TEST_SHARD#*/}" ;;
    *) echo "GPU_TEST_SHARD must be K/N (e.g. 0/2), got '$GPU_TEST_SHARD'" >&2; exit 2 ;;
  esac
  if ! [[ "$GTEST_SHARD_INDEX" =~ ^[0-9]+$ && "$GTEST_TOTAL_SHARDS" =~ ^[1-9][0-9]*$ ]] ||
     [ "$GTEST_SHARD_INDEX" -ge "$GTEST_TOTAL_SHARDS" ]; then
    echo "GPU_TEST_SHARD must be K/N with 0 <= K < N, got '$GPU_TEST_SHARD'" >&2
    exit 2
  fi
fi
if [ "${GPU_TEST_TESTS:-1}" = 1 ]; then
  (cd "$build" && ctest -L gpu -V) >"$log/ctest" 2>&1
  grep -h "^\[ measured \]" "$log/ctest" | sed 's/^\[ measured \] /  /'
  grep -E "^\[  FAILED  \]|Failure$" -A3 "$log/ctest" | head -60
  if grep -q "100% tests passed" "$log/ctest"; then status "gpu tests" ok; else status "gpu tests" FAILED; fi
fi

if [ "${GPU_TEST_BENCH:-1}" = 1 ] && [ -n "$slice" ]; then
  graph_modes=("")
  [ "${GPU_TEST_NO_GRAPH_BENCH:-1}" = 1 ] && graph_modes+=("--disable-cuda-graph")
  # Graphs without programmatic dependent launch: what PDL saves per step.
  [ "${GPU_TEST_NO_PDL_BENCH:-1}" = 1 ] && graph_modes+=("--disable-pdl")
  for g in "${graph_modes[@]}"; do
    if "$bin" bench-one-batch --model "$slice" --device cuda --batch-size 1,8,64 --input-len 128 \
         --output-len 32 --kv-cache-dtype fp8_e4m3 $g >"$log/bench-one-batch$g" 2>&1; then
      status "bench-one-batch ${g:-graphs}" ok
    else
      status "bench-one-batch ${g:-graphs}" FAILED
    fi
    tail -n 8 "$log/bench-one-batch$g"
  done
fi

if [ "${GPU_TEST_BENCH:-1}" = 1 ] && [ -n "$slice" ]; then
  for b in 1 64; do
    if "$bin" profile --model "$slice" --device cuda --batch $b --context 512 --steps 3 \
         --kv-cache-dtype fp8_e4m3 >"$log/profile-b$b" 2>&1; then
      status "profile batch $b" ok
    else
      status "profile batch $b" FAILED
    fi
    head -n 40 "$log/profile-b$b"
  done
fi

if [ "${GPU_TEST_E2E:-1}" = 1 ]; then
  if bash scripts/e2e.sh "$bin" >"$log/e2e" 2>&1; then status "e2e (serve on the GPU)" ok; else
    status "e2e (serve on the GPU)" FAILED
  fi
  tail -n 15 "$log/e2e"
  # The same suite against `serve` on the glm5-slice checkpoint (full GLM-5 widths). It has no tokenizer of
  # its own: the built-in model's chat template and tokenizer go beside it, the tokenizer's vocabulary padded
  # to the checkpoint's vocab_size (scripts/pad-tokenizer.py) so that every sampled id decodes to text.
  if [ -n "$slice" ] && [ "${GPU_TEST_E2E_SLICE:-1}" = 1 ]; then
    cp models/builtin/tokenizer_config.json "$slice/tokenizer_config.json"
    python3 scripts/pad-tokenizer.py models/builtin/tokenizer.json "$slice/config.json" "$slice/tokenizer.json"
    if MOESERVE_BUILTIN_MODEL="$slice" bash scripts/e2e.sh "$bin" >"$log/e2e-slice" 2>&1; then
      status "e2e (glm5-slice on the GPU)" ok
    else
      status "e2e (glm5-slice on the GPU)" FAILED
    fi
    tail -n 15 "$log/e2e-slice"
  fi
fi

# The other storage formats' slices: GPU Executor against the CPU Executor (CudaExecutorSlice).
if [ -n "${rest_pid:-}" ]; then
  wait "$rest_pid"
  for fmt in "${formats[@]:1}"; do
    dir="$PWD/$build/slices/glm5_$fmt"
    [ -f "$dir/config.json" ] && slices+=("$dir")
  done
  if [ ${#slices[@]} -gt 0 ] && [ -x "$build/tests/test_gpu" ]; then
    if MOESERVE_TEST_SLICES=$(IFS=,; echo "${slices[*]}") "$build/tests/test_gpu" \
         --gtest_filter='CudaExecutorSlice.*' >"$log/slices" 2>&1; then
      status "slices ${formats[*]:1}" ok
    else
      status "slices ${formats[*]:1}" FAILED
    fi
    grep -h "^\[ measured \]" "$log/slices" | sed 's/^\[ measured \] /  /'
  fi
fi

if [ "${GPU_TEST_BENCH:-1}" = 1 ] && [ "${GPU_TEST_KERNEL_BENCH:-1}" = 1 ]; then
  for t in "${benches[@]}"; do
    [ -x "$build/$t" ] || continue
    if timeout "${GPU_TEST_BENCH_TIMEOUT:-240}" "$build/$t" >"$log/$t" 2>&1; then status "$t" ran; else
      status "$t" FAILED
    fi
    cat "$log/$t"
  done
  # The PyTorch references a user would otherwise run, on the same shapes (where PyTorch is installed).
  for py in tools/bench/*_torch.py; do
    [ -f "$py" ] || continue
    n=$(basename "$py" .py)
    if timeout "${GPU_TEST_BENCH_TIMEOUT:-240}" python3 "$py" >"$log/$n" 2>&1; then status "$n" ran; else
      status "$n" FAILED
    fi
    cat "$log/$n"
  done
fi
echo
echo "== summary (logs in $log)"
cat "$log/summary"
grep -q FAILED "$log/summary" && exit 1
exit 0
