#!/usr/bin/env bash
# Calls go down only: a room may include only rooms below it (DESIGN.md, "Rooms").
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A allowed=(
  [core]="core"
  [quant]="core quant"
  [io]="core quant io"
  [kernels]="core quant kernels"
  [ops]="core quant kernels ops"
  [profiler]="core profiler"
  [kv]="core quant kv"
  [moe]="core quant kernels ops moe"
  [dist]="core dist"
  [model]="core quant io kernels ops kv moe profiler dist model"
  [tokenizer]="core tokenizer"
  [scheduler]="core kv scheduler"
  [runtime]="core quant io kernels ops kv moe profiler dist model scheduler tokenizer runtime"
  [server]="core quant io kernels ops kv moe profiler dist model scheduler tokenizer runtime server"
  [loadgen]="core loadgen"
  [eval]="core quant io kernels ops kv moe profiler dist model scheduler tokenizer runtime eval"
  [cli]="core quant io kernels ops kv moe profiler dist model scheduler tokenizer runtime server loadgen eval cli"
)
bad=0
while IFS= read -r line; do
  file=${line%%:*}
  room=$(echo "$file" | cut -d/ -f2)
  inc=$(echo "$line" | sed -E 's/.*#include "([a-z_]+)\/.*/\1/')
  ok=0
  for r in ${allowed[$room]:-}; do [ "$r" = "$inc" ] && ok=1; done
  if [ $ok = 0 ]; then echo "layering: $file includes $inc/ (room $room may include: ${allowed[$room]:-nothing})"; bad=1; fi
done < <(grep -rnE '^#include "[a-z_]+/' src || true)
[ $bad = 0 ] && echo "layering check: ok"
exit $bad
