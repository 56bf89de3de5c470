#!/usr/bin/env bash
# The GPU runs that check issues 45-47, one part per device call of under
# 10 minutes on one H200 (Keras and keras-hub as wheels on PYTHONPATH):
#   bash benchmarks/gpu/open_issues.sh capacity   # 45: cold, warm, fit's first step
#   bash benchmarks/gpu/open_issues.sh layers     # 46: by-layer on decoders
#   bash benchmarks/gpu/open_issues.sh ways       # 47: ways to fit GPT-2 base
# Each command's output is kept in $OUT (default out/gpu) and its end shown.
set -uo pipefail
out=${OUT:-out/gpu}
mkdir -p "$out"
export TF_CPP_MIN_LOG_LEVEL=3
run() { local seconds=$1 name=$2; shift 2
  timeout "$seconds" "$@" > "$out/$name.txt" 2>&1
  echo "== $name (exit $?)"
  grep -v "hlo_rematerialization\|^[WI][0-9]\|Warning\|warn(" "$out/$name.txt" | tail -n 24; }

case ${1:-} in
capacity)
  run 400 gpt2-speed env KERAS_BACKEND=jax python3 -m benchmarks.gpu.capacity_speed gpt2 --limit-mb 8192
  run 170 bert-speed env KERAS_BACKEND=jax python3 -m benchmarks.gpu.capacity_speed bert --limit-mb 8192 \
      --skip-uncached-fit ;;
layers)
  run 280 layers-torch env KERAS_BACKEND=torch python3 -m benchmarks.gpu.by_layer_lm --json "$out/torch.json"
  run 280 layers-jax env KERAS_BACKEND=jax python3 -m benchmarks.gpu.by_layer_lm --json "$out/jax.json" \
      --against "$out/torch.json" ;;
ways)
  run 240 ways-torch env KERAS_BACKEND=torch python3 -m benchmarks.gpu.ways_check gpt2 --limit-mb 8192 \
      --batch 16 --levers mixed_precision,adafactor,sgd_momentum,gradient_accumulation \
      --no-combinations --verify
  run 300 ways-jax env KERAS_BACKEND=jax python3 -m benchmarks.gpu.ways_check gpt2 --limit-mb 8192 \
      --batch 48 --levers mixed_precision,sgd_momentum,shorter_sequence --no-combinations ;;
*)
  echo "usage: $0 capacity|layers|ways" >&2; exit 2 ;;
esac
