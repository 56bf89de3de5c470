#!/usr/bin/env bash
# The GPU checks of the spike scenarios, on a machine with two GPUs (one
# will do for all but --data-parallel). Writes one JSON or text file per
# check into $1 (default: out/gpu), runs independent checks side by side on
# GPU 0 and GPU 1, and prints each result as it ends.
#   bash benchmarks/gpu/gpu_checks.sh OUTDIR
set -uo pipefail
out=${1:-out/gpu}
mkdir -p "$out"
scenario=tests/scenarios/oversized_batches.py
on() { local gpu=$1 backend=$2 name=$3; shift 3
  (CUDA_VISIBLE_DEVICES=$gpu KERAS_BACKEND=$backend "$@" > "$out/$name" 2> "$out/$name.err";
   echo "== $name (exit $?)"; tail -c 1500 "$out/$name") ; }

# One GPU each: the scenario over two epochs on JAX and PyTorch, side by side.
on 0 jax scenario-jax.json python3 $scenario --gpu --epochs 2 &
on 1 torch scenario-torch.json python3 $scenario --gpu --epochs 2 &
wait
# The seed demo, as a user runs it.
on 0 jax demo-jax.txt python3 -m keras_memwatch demo --backend jax --seed-model --epochs 1 --out "$out/demo-jax" &
on 1 torch demo-torch.txt python3 -m keras_memwatch demo --backend torch --seed-model --epochs 1 --out "$out/demo-torch" &
wait
# Both GPUs: keras.distribution.DataParallel, with and without oversized batches.
on 0,1 jax dp.json python3 $scenario --gpu --epochs 2 --data-parallel
on 0,1 jax dp-uniform.json python3 $scenario --gpu --data-parallel --uniform
# Ranks: two JAX processes, one GPU each, and the report across their logs.
port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
mkdir -p "$out/ranks"
(XLA_PYTHON_CLIENT_PREALLOCATE=false KERAS_BACKEND=jax python3 benchmarks/gpu/gpu_ranks.py proc 0 $port "$out/ranks" > "$out/ranks/p0.json" 2> "$out/ranks/p0.err" &
 XLA_PYTHON_CLIENT_PREALLOCATE=false KERAS_BACKEND=jax python3 benchmarks/gpu/gpu_ranks.py proc 1 $port "$out/ranks" > "$out/ranks/p1.json" 2> "$out/ranks/p1.err"; wait)
cat "$out/ranks/p0.json" "$out/ranks/p1.json"
KERAS_BACKEND=jax python3 -m keras_memwatch report "$out/ranks/mem.rank*.csv" > "$out/ranks/report.txt" 2>&1
echo "== report across ranks (exit $?)"; tail -n 16 "$out/ranks/report.txt"
