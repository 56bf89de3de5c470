#!/usr/bin/env bash
# The GPU runs that check issues 45-47 on one H200 (Keras and keras-hub as
# wheels on PYTHONPATH). Each job keeps its output in $OUT (default
# out/gpu) and shows its end:
#   bash benchmarks/gpu/open_issues.sh capacity   # 45: cold, warm, fit's first step
#   bash benchmarks/gpu/open_issues.sh layers     # 46: by-layer on decoders
#   bash benchmarks/gpu/open_issues.sh ways       # 47: ways to fit GPT-2 base
#   bash benchmarks/gpu/open_issues.sh ways_more  # 47: the other JAX rows, then
#                                                 # all of them again from the cache
#   bash benchmarks/gpu/open_issues.sh together layers_torch layers_jax ways_torch ways_jax
# `together` runs the named jobs side by side (none of them timed against
# another: the capacity jobs, which time compilations, run alone), then
# compares the two by-layer runs where both ran.
set -uo pipefail
out=${OUT:-out/gpu}
mkdir -p "$out"
export TF_CPP_MIN_LOG_LEVEL=3
run() { local seconds=$1 name=$2; shift 2
  timeout "$seconds" "$@" > "$out/$name.txt" 2>&1
  local status=$?
  { echo "== $name (exit $status)"
    grep -v "hlo_rematerialization\|^[WI][0-9]\|Warning\|warn(" "$out/$name.txt" | tail -n 24
  } | cat; }

gpt2_speed() { run 400 gpt2-speed env KERAS_BACKEND=jax python3 -m benchmarks.gpu.capacity_speed \
  gpt2 --limit-mb 8192; }
bert_speed() { run 170 bert-speed env KERAS_BACKEND=jax python3 -m benchmarks.gpu.capacity_speed \
  bert --limit-mb 8192 --skip-uncached-fit; }
layers_torch() { run 300 layers-torch env KERAS_BACKEND=torch python3 -m benchmarks.gpu.by_layer_lm \
  --json "$out/torch.json"; }
# compiles only: JAX's allocator need not take the card
layers_jax() { run 300 layers-jax env KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false \
  python3 -m benchmarks.gpu.by_layer_lm --json "$out/jax.json" --hlo-dir "$out/hlo"; }
ways_torch() { run 300 ways-torch env KERAS_BACKEND=torch python3 -m benchmarks.gpu.ways_check gpt2 \
  --limit-mb 8192 --batch 16 --levers mixed_precision,adafactor,sgd_momentum,gradient_accumulation \
  --no-combinations --verify; }
# each JAX row is bracketed (a few minutes a row on GPT-2 base): two runs,
# each within its time budget, their rows kept in one cache; then the
# three rows again from it, without jobs (the warm time)
ways_jax() { run 560 ways-jax env KERAS_BACKEND=jax python3 -m benchmarks.gpu.ways_check gpt2 \
  --limit-mb 8192 --batch 48 --levers mixed_precision --no-combinations --verify \
  --max-seconds 360 --compilation-cache "$out/jax-cache"; }
ways_jax_more() { run 560 ways-jax-more env KERAS_BACKEND=jax python3 -m benchmarks.gpu.ways_check \
  gpt2 --limit-mb 8192 --batch 48 --levers sgd_momentum,shorter_sequence,remat,remat_layers \
  --no-combinations --verify --max-seconds 360 --compilation-cache "$out/jax-cache"; }
ways_jax_warm() { run 200 ways-jax-warm env KERAS_BACKEND=jax python3 -m benchmarks.gpu.ways_check \
  gpt2 --limit-mb 8192 --batch 48 --levers mixed_precision,sgd_momentum,shorter_sequence,remat,remat_layers \
  --no-combinations --compilation-cache "$out/jax-cache"; }
compare_layers() {
  if [ -s "$out/torch.json" ] && [ -s "$out/jax.json" ]; then
    python3 -m benchmarks.gpu.by_layer_lm --compare "$out/torch.json" "$out/jax.json" \
      > "$out/layers-compare.txt" 2>&1
    grep "torch vs jax\|within 25%\|TARGET" "$out/layers-compare.txt"
  fi; }

case ${1:-} in
capacity) gpt2_speed; bert_speed ;;
layers) layers_torch; layers_jax; compare_layers ;;
ways) ways_torch; ways_jax ;;
ways_more) ways_jax_more; ways_jax_warm ;;
together)
  shift
  for job in "$@"; do "$job" & done
  wait
  compare_layers ;;
*)
  echo "usage: $0 capacity|layers|ways|ways_more|together JOB..." >&2; exit 2 ;;
esac
