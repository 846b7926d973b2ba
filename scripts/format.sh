#!/usr/bin/env bash
# format.sh check|fix: every C++/CUDA source of the project formatted by the repo's .clang-format.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-check}
mapfile -t files < <(git ls-files -co --exclude-standard -- 'src/*' 'tests/*' 'tools/*' 'bench/*' |
  grep -E '\.(cpp|h|hpp|cu|cuh)$' || true)
[ ${#files[@]} -eq 0 ] && exit 0
if [ "$mode" = fix ]; then
  clang-format -i "${files[@]}"
else
  if ! clang-format --dry-run --Werror "${files[@]}" 2>/tmp/moeserve-format.log; then
    grep -E '^[^ ].*: (error|warning)' /tmp/moeserve-format.log | cut -d: -f1 | sort -u | sed 's/^/  not formatted: /'
    echo "format check failed: run 'make format'"
    exit 1
  fi
  echo "format check: ${#files[@]} files formatted"
fi
