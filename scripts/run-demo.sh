#!/usr/bin/env bash
# `make run`: the main job on the built-in model.
set -euo pipefail
bin=${1:-build/moeserve}
exec "$bin" --help
