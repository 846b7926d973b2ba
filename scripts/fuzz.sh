#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang and runs each for a bounded time (FUZZ_SECONDS, default 20).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
secs=${FUZZ_SECONDS:-20}
shopt -s nullglob
targets=(tests/fuzz/fuzz_*.cpp)
[ ${#targets[@]} -eq 0 ] && { echo "fuzz: no targets"; exit 0; }
mkdir -p "$build/fuzz"
for t in "${targets[@]}"; do
  name=$(basename "$t" .cpp)
  srcs=$(sed -n 's#^// fuzz-sources: ##p' "$t")
  echo "fuzz: building $name"
  clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -Isrc "$t" $srcs -lfmt -o "$build/fuzz/$name"
  corpus="$build/fuzz/${name}_corpus"
  mkdir -p "$corpus"
  seeds="tests/fuzz/${name#fuzz_}_seeds"
  [ -d "$seeds" ] && cp -n "$seeds"/* "$corpus"/ 2>/dev/null || true
  echo "fuzz: running $name for ${secs}s"
  "$build/fuzz/$name" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 "$corpus" 2>&1 | tail -n 5
done
