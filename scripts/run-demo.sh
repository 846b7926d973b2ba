#!/usr/bin/env bash
# `make run`: the OpenAI-compatible server on the built-in model (models/builtin: a small GLM-5-architecture
# model trained on Debian, Python and Linux documentation; it answers in short, loosely sensible English). It
# prints its address and a curl command to try, and runs until Ctrl-C. PORT=... picks another port.
set -euo pipefail
bin=${1:-build/moeserve}
exec "$bin" serve --host 127.0.0.1 --port "${PORT:-30000}"
