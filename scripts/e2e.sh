#!/usr/bin/env bash
# End-to-end tests: pytest over tests/e2e with the built command.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-build/moeserve}")
shopt -s nullglob
tests=(tests/e2e/test_*.py)
if [ ${#tests[@]} -eq 0 ]; then echo "e2e: no tests yet"; exit 0; fi
MOESERVE_BIN="$bin" python3 -m pytest -q tests/e2e
