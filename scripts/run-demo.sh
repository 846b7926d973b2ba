#!/usr/bin/env bash
# `make run`: the OpenAI-compatible server on the built-in model (a tiny GLM-5-architecture model with
# deterministic random weights, so its text is gibberish; what matters is that it serves and how fast). It
# prints its address and a curl command to try, and runs until Ctrl-C. PORT=... picks another port.
set -euo pipefail
bin=${1:-build/moeserve}
exec "$bin" serve --host 127.0.0.1 --port "${PORT:-30000}"
