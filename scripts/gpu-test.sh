#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: CUDA build, every GPU test (ctest -L gpu), the kernel benchmarks, and one
# summary table at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build-gpu}
archs=${MOESERVE_CUDA_ARCHS:-90a}
log=$(mktemp -d)
status() { printf '%-28s %s\n' "$1" "$2" >>"$log/summary"; }

source scripts/gpu-env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
if cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOESERVE_CUDA=ON -DMOESERVE_CUDA_ARCHS="$archs" \
     -DMOESERVE_WERROR=ON "${MS_BUNDLE_CMAKE_ARGS[@]}" >"$log/configure" 2>&1 &&
   cmake --build "$build" -j "$(nproc)" >"$log/build" 2>&1; then
  status build ok
else
  tail -n 40 "$log/configure" "$log/build"
  status build FAILED
  cat "$log/summary"
  exit 1
fi
(cd "$build" && ctest -L gpu --output-on-failure) 2>&1 | tee "$log/ctest"
if grep -q "100% tests passed" "$log/ctest"; then status "gpu tests" ok; else status "gpu tests" FAILED; fi
if [ -x "$build/bench_cuda_kernels" ]; then
  "$build/bench_cuda_kernels" | tee "$log/bench"
  status "kernel benchmarks" "ran ($(grep -c '%$' "$log/bench") rows)"
fi
echo
echo "== summary"
cat "$log/summary"
grep -q FAILED "$log/summary" && exit 1
exit 0
