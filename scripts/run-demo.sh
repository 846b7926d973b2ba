#!/usr/bin/env bash
# `make run`: the main job on the built-in model (a tiny GLM-5-architecture model with deterministic random
# weights, so its text is gibberish; what matters is that it runs and how fast).
set -euo pipefail
bin=${1:-build/moeserve}
exec "$bin" generate --prompt "Hello, world! The model" --max-tokens 48 --temperature 0.8 --top-p 0.95 --seed 1
