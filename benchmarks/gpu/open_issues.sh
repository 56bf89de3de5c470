#!/usr/bin/env bash
# The GPU runs that check issues 45 and 47 on one GPU (Keras and keras-hub
# as wheels on PYTHONPATH). Each job keeps its output in $OUT (default
# out/gpu) and shows its end:
#   bash benchmarks/gpu/open_issues.sh capacity   # 45: GPT-2 base cold, warm, fit's
#                                                 # first step (alone: it times
#                                                 # compilations); the held-out OPT
#   bash benchmarks/gpu/open_issues.sh layers     # 46: by-layer on decoders
#   bash benchmarks/gpu/open_issues.sh together bert_speed   # the last round's rule
#   bash benchmarks/gpu/open_issues.sh together jax_row_jobs # JAX rows as jobs
#   bash benchmarks/gpu/open_issues.sh together ways_jax_table   # then, warm:
#   bash benchmarks/gpu/open_issues.sh together ways_jax
#   BREAK_CYCLES=1 FRESH=1 resconv_levers=sgd_momentum \
#     bash benchmarks/gpu/open_issues.sh together ways_resconv_torch  # then, alone,
#   BREAK_CYCLES=1 FRESH=1 PHI3_LEVERS=sgd_momentum,remat \
#     bash benchmarks/gpu/open_issues.sh together ways_phi3_torch
#   bash benchmarks/gpu/open_issues.sh together device_full  # alone on the card
#   JAX_ROWS=resconv@6144 bash benchmarks/gpu/open_issues.sh together jax_rows
#   bash benchmarks/gpu/open_issues.sh together check_widths  # alone on the card:
#                                     # one, two and four checks side by side
#   bash benchmarks/gpu/open_issues.sh together conv_checks   # alone on the card
#   LAYERS_MODELS=gpt2,llama,mistral,gemma,opt,phi3 \
#     bash benchmarks/gpu/open_issues.sh together layers_jax layers_jax_test
# (run on 2026-12-05: ways_room heldout_capacity heldout_jobs accumulation_edge
# ways_resconv_torch; then phases, bert_speed, bert_jobs, ways_resconv_jax,
# resconv_jax_edge, resconv_in_flight; on 2026-12-06: jax_row_jobs quiet_oom,
# then ways_check with sgd_momentum, then remat; later ways_phi3_torch,
# phi3_edge; on 2026-12-07, with BREAK_CYCLES=1 FRESH=1: ways_phi3_torch,
# ways_resconv_torch; later, Phi-3's rows a few levers a table with
# `ways_check` directly, alone and two tables side by side (an 80 GiB card
# does not hold two tables' jobs under 8 GiB caps); docs/gpu-validation.md;
# later, JAX_ROWS=resconv@6144 jax_rows, then check_widths: docs/capacity.md;
# in the next session conv_checks, JAX_ROWS=transformer@6144 jax_rows and
# device_full, the filler filling once; in the next, jax_rows with
# JAX_ROWS=transformer@6144, gpt@6144 and resconv@6144, each alone, and
# device_full with the filler topping up; in the next, gpt2_speed, then the
# transformer's one compilation and cold estimate alone, docs/capacity.md)
# `together` runs the named jobs side by side, then compares the two
# by-layer runs where both ran.
set -uo pipefail
out=${OUT:-out/gpu}
cache=${CACHE:-out/cache}  # JAX's compilation caches: kept between calls, not sent back
mkdir -p "$out" "$cache"
export TF_CPP_MIN_LOG_LEVEL=3
run() { local seconds=$1 name=$2; shift 2
  timeout "$seconds" "$@" > "$out/$name.txt" 2>&1
  local status=$?
  { echo "== $name (exit $status)"
    grep -v "hlo_rematerialization\|^[WI][0-9]\|Warning\|warn(" "$out/$name.txt" | tail -n 24
  } | cat; }

# BREAK_CYCLES=1: the PyTorch tables and their jobs after break_tree_cycles();
# FRESH=1: the PyTorch tables check each row near its limit with jobs of its
# change in new processes (ways_to_fit(fresh_process=True))
break_cycles=${BREAK_CYCLES:+--break-cycles}
fresh=${FRESH:+--fresh-process}
gpt2_speed() { run 590 gpt2-speed env KERAS_BACKEND=jax python3 -m benchmarks.gpu.capacity_speed \
  gpt2 --limit-mb 8192; }
bert_speed() { run 450 bert-speed env KERAS_BACKEND=jax python3 -m benchmarks.gpu.capacity_speed \
  bert --limit-mb 8192 --skip-uncached-fit; }
# written after the code: keras-hub OPT with Lion, its answers against jobs
heldout_capacity() { run 360 heldout-capacity env KERAS_BACKEND=jax python3 -m \
  benchmarks.gpu.capacity_check verify opt@8192 --parallel 4 --json "$out/opt.json"; }
# LAYERS_MODELS: by_layer_lm's --models (opt,phi3 were written after the
# buffer-sharing rule)
layer_models=${LAYERS_MODELS:-gpt2,llama,mistral,gemma}
layers_torch() { run 300 layers-torch env KERAS_BACKEND=torch python3 -m benchmarks.gpu.by_layer_lm \
  --models "$layer_models" --json "$out/torch.json"; }
# compiles only: JAX's allocator need not take the card
layers_jax() { run 420 layers-jax env KERAS_BACKEND=jax XLA_PYTHON_CLIENT_PREALLOCATE=false \
  python3 -m benchmarks.gpu.by_layer_lm --models "$layer_models" --json "$out/jax.json" \
  --hlo-dir "$out/hlo"; }
# the GPU test of the JAX split: it reads XLA's GPU plan
layers_jax_test() { run 300 layers-jax-test env KERAS_BACKEND=jax \
  XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -m gpu tests/test_gpu.py \
  -k language_models -q -p no:cacheprovider -s; }
# written after ways_to_fit's GPU tables: keras-hub Phi-3 (AdamW, 256 tokens)
# under 8 GiB at a batch of 32, every lever; on PyTorch with its jobs, on JAX
# the rows that fit the time (then again, warm, with its jobs: PHI3_VERIFY=1);
# PHI3_LEVERS: the PyTorch rows (every lever and the combinations by default)
phi3_levers=${PHI3_LEVERS:+--levers $PHI3_LEVERS --no-combinations}
ways_phi3_torch() { run 560 ways-phi3-torch env KERAS_BACKEND=torch python3 -m \
  benchmarks.gpu.ways_check phi3 --limit-mb 8192 --batch 32 --verify --parallel 4 \
  --json "$out/phi3-torch.json" $phi3_levers $break_cycles $fresh; }
ways_phi3_jax() { run 580 ways-phi3-jax env KERAS_BACKEND=jax python3 -m \
  benchmarks.gpu.ways_check phi3 --limit-mb 8192 --batch 32 --levers "$jax_levers" \
  --no-combinations --max-seconds ${WAYS_JAX_SECONDS:-520} --parallel 3 \
  --compilation-cache "$cache/jax-cache" ${PHI3_VERIFY:+--verify}; }
ways_torch() { run 300 ways-torch env KERAS_BACKEND=torch python3 -m benchmarks.gpu.ways_check gpt2 \
  --limit-mb 8192 --batch 16 --levers mixed_precision,adafactor,sgd_momentum,gradient_accumulation \
  --no-combinations --verify --parallel 2 $break_cycles $fresh; }
# the room an optimizer variant meets beside the user's model: widened, or
# with the held slots on the host; ROOM_SIZES in the order asked (the row's
# search asks 4, 8 and 16 before the sizes near its limit)
ways_room() { run 200 ways-room env KERAS_BACKEND=torch python3 -m benchmarks.gpu.ways_room gpt2 \
  --limit-mb 8192 --sizes ${ROOM_SIZES:-13,14,15}; }
# each JAX row is bracketed (a few minutes a row on GPT-2 base), so the table
# takes two calls on a warm machine: the rows that fit the time, kept in one
# cache; then the table again from it (the warm time), the rows left, and
# every row's jobs
jax_levers=${JAX_LEVERS:-remat,remat_layers,mixed_precision,sgd_momentum,shorter_sequence}
ways_jax_table() { run 580 ways-jax-table env KERAS_BACKEND=jax python3 -m \
  benchmarks.gpu.ways_check gpt2 --limit-mb 8192 --batch 48 --levers $jax_levers \
  --no-combinations --max-seconds 520 --compilation-cache "$cache/jax-cache"; }
ways_jax() { run 580 ways-jax env KERAS_BACKEND=jax python3 -m benchmarks.gpu.ways_check gpt2 \
  --limit-mb 8192 --batch 48 --levers $jax_levers --no-combinations --verify --parallel 3 \
  --max-seconds ${WAYS_JAX_SECONDS:-200} --compilation-cache "$cache/jax-cache"; }
# RESCONV_REPEAT: each job that many times, each in a new process (at this
# convnet's limit one process trains a size and the next does not, as
# Python's collector frees Keras's cycles or not)
ways_resconv_torch() { run 400 ways-resconv-torch env KERAS_BACKEND=torch python3 -m \
  benchmarks.gpu.ways_check resconv --limit-mb 6144 --batch 512 --no-combinations --verify \
  --parallel 3 --levers ${resconv_levers:-all} --repeat ${RESCONV_REPEAT:-1} \
  $break_cycles $fresh; }
ways_resconv_jax() { run 585 ways-resconv-jax env KERAS_BACKEND=jax python3 -m \
  benchmarks.gpu.ways_check resconv --limit-mb 6144 --batch 512 --no-combinations --verify \
  --levers gradient_accumulation --parallel 4 --max-seconds 370; }
# alone: where one compilation of GPT-2 base's step goes (HLO passes by name)
phases() { run 150 phases env KERAS_BACKEND=jax python3 -m benchmarks.gpu.compile_phases \
  gpt2 --limit-mb 8192 --size 30; }
# GPT-2 base's plans just above an answer (A: 34 on the H100, 31 on the
# H200), as `fit` compiles them: alone, side by side as the checks compile
# them; jobs at A+1 and A+2; and alone with 1 GiB more in use (run on
# 2026-12-05: the plans do not move; docs/ways-to-fit.md)
plan_noise() { local a=${A:-34}; run 560 plan-noise bash -c "P='python3 -m \
  benchmarks.gpu.jax_compile_options gpt2 --limit-mb 8192'; export KERAS_BACKEND=jax
  \$P --sizes $((a + 1)) $((a + 2)) --sets fit --together fit \
    --together-sizes $a $((a + 1)) $((a + 2)) $((a + 3))
  for n in $((a + 1)) $((a + 2)); do python3 -m benchmarks.gpu.ways_check trial gpt2 \
    --size \$n --setting '{}' --limit-mb 8192 --steps 30 | tail -n 1 | sed \"s/^/job \$n: /\" &
  done; wait
  \$P --sizes $((a + 2)) --sets fit --hold-mb 1024"; }
# GPT-2 base's JAX rows as jobs that wait for their steps (`fit_steps`;
# the jobs before 2026-12-05's seventh session did not, and a step out of
# memory went unseen): "setting:size" pairs in ROW_JOBS, four at a time;
# by default the card's table answers and one above, and SGD around its
# answer (35 on the H100, run on 2026-12-06; not known on the H200); the
# remat rows name their layers in the table's record (`ways_jax`)
h100_rows='{}:34 {}:35 {"sequence":128}:71 {"sequence":128}:72
  {"policy":"mixed_bfloat16"}:62 {"policy":"mixed_bfloat16"}:63
  {"optimizer":"sgd"}:33 {"optimizer":"sgd"}:34 {"optimizer":"sgd"}:35 {"optimizer":"sgd"}:36'
h200_rows='{}:31 {}:32 {"policy":"mixed_bfloat16"}:57 {"policy":"mixed_bfloat16"}:58
  {"optimizer":"sgd"}:31 {"optimizer":"sgd"}:32 {"optimizer":"sgd"}:33 {"optimizer":"sgd"}:34'
card_rows() { nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 \
  && echo "$h200_rows" || echo "$h100_rows"; }
jax_row_jobs() { local i=0 job; : > "$out/jax-row-jobs.txt"; set -f
  for job in ${ROW_JOBS:-$(card_rows)}; do
    timeout 300 env KERAS_BACKEND=jax python3 -m benchmarks.gpu.ways_check trial gpt2 \
      --size "${job##*:}" --setting "${job%:*}" --limit-mb 8192 --steps 30 2>/dev/null \
      | tail -n 1 | sed "s/^/${job%:*} ${job##*:}: /" >> "$out/jax-row-jobs.txt" &
    i=$((i + 1)); [ $((i % 4)) = 0 ] && wait; done; wait; set +f
  echo "== jax-row-jobs"; cat "$out/jax-row-jobs.txt"; }
# a user's fit of GPT-2 base at 48 under 8 GiB (out of memory) with a
# MemWatch and no guard: does fit raise, and does the watch say so?
quiet_oom() { run 200 quiet-oom env KERAS_BACKEND=jax python3 -m benchmarks.gpu.plan_vs_run \
  gpt2 --size 48 --limit-mb 8192 --watch; }
# BERT base's ceiling of the H100 run of 2026-12-05 (47), and one size each side
bert_jobs() { run 240 bert-jobs bash -c 'for b in 46 47 48; do KERAS_BACKEND=jax \
  python3 -m benchmarks.gpu.capacity_check trial bert $b --limit-mb 8192 & done; wait'; }
# the convnet on JAX above its answer (765), 60 steps a job; and the batches
# its fit holds ahead of the step
resconv_jax_edge() { run 240 resconv-jax-edge bash -c 'for n in 765 788 800 812 825; do
  KERAS_BACKEND=jax python3 -m benchmarks.gpu.ways_check trial resconv --size $n \
  --setting "{}" --limit-mb 6144 --steps 60 | tail -n 1 | sed "s/^/$n: /" & done; wait'; }
resconv_in_flight() { run 200 resconv-in-flight env KERAS_BACKEND=jax python3 -m \
  benchmarks.gpu.in_flight resconv 765 --steps 300 --limit-mb 6144; }
# written after the code: the held-out OPT's answers of the H100 run of
# 2026-12-05 (11 under 10% headroom, ceiling 17), and 18 above it, as jobs
heldout_jobs() { run 240 heldout-jobs bash -c 'for b in 11 17 18; do
  KERAS_BACKEND=jax python3 -m benchmarks.gpu.capacity_check trial opt $b --limit-mb 8192 \
  --steps 5 --epochs 1 & done; wait'; }
# the residual convnet near its limit in fresh processes: as it is, and with
# two steps of gradient accumulation at the same device batch (the peak of each)
accumulation_edge() { run 240 accumulation-edge bash -c 'for b in 184 188 190; do
  for s in "{}" "{\"accumulation\": 2}"; do n=$b; [ "$s" = "{}" ] || n=$((2 * b))
  KERAS_BACKEND=torch python3 -m benchmarks.gpu.ways_check trial resconv --size $n \
  --setting "$s" --limit-mb 6144 | tail -n 1 | sed "s/^/$s $n: /"; done; done'; }
# does a PyTorch job's memory grow with the steps of one fit? Phi-3, each
# job in a new process (job_steps prints every batch end): at 16, 18, 19
# and 20; at 20 with expandable segments; at 20 after the checks' steps
job_growth() { run 300 job-growth bash -c 'J="python3 -m benchmarks.gpu.job_steps phi3 \
  --limit-mb 8192 --steps 30"; export KERAS_BACKEND=torch
  for a in "--size 16" "--size 18" "--size 19" "--size 20" "--size 20 --check-first 16,20" \
      "--size 20 --expandable"; do f="$0/job-steps-${a// /_}.txt"
    if [ "${a#*--expandable}" != "$a" ]; then
      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $J ${a% --expandable} > "$f" 2>&1 &
    else $J $a > "$f" 2>&1 & fi; done; wait
  for f in "$0"/job-steps-*; do echo "${f##*/}: $(tail -n 2 "$f" | cut -c1-600 | tr "\n" " ")"; done' "$out"; }
# Phi-3 on PyTorch at the table's answer as is (19 on the H100) and above
# it, one fit a new process: as a user runs it, and with CollectCycles,
# which frees what Keras's build for the first batch leaves in cycles
phi3_edge() { run 300 phi3-edge bash -c 'J="python3 -m benchmarks.gpu.job_steps phi3 \
  --limit-mb 8192 --steps 30"; export KERAS_BACKEND=torch
  for a in "--size 19" "--size 19" "--size 20" "--size 20 --collect 1000" \
      "--size 20 --collect 1000" "--size 21 --collect 1000"; do
    $J $a 2>/dev/null | tail -n 1 | sed "s/^/$a: /" & done; wait'; }
# a card another process fills mid-run (the device-full path of
# 2026-12-07): FILL_AFTER seconds into Phi-3's table, after it sized its
# jobs for the whole card, a filler takes what is free beyond ROOM_MB, each
# second (the table's own process and one job under 8 GiB). The table's
# jobs should find the device full, say so once and train one at a time to
# the rows of the card alone (SGD: 19 on the H100); the benchmark's jobs
# train one at a time. (Run on 2026-12-07 with one fill at 45 s: the jobs
# then running freed 22 GiB and no job found the device full; the filler
# now tops up.)
device_full() { run 560 device-full bash -c 'python3 -c "
import time, torch
time.sleep(${FILL_AFTER:-45})
held = []
while True:
    free, total = torch.cuda.mem_get_info()
    take = free - ${ROOM_MB:-14336} * 2**20
    if take > 2**28:
        held.append(torch.empty(take, dtype=torch.uint8, device=\"cuda\"))
        print(\"holding\", sum(h.numel() for h in held) >> 20, \"MiB of\",
              total >> 20, flush=True)
    time.sleep(1)" > "$0/filler.txt" 2>&1 & filler=$!
  KERAS_BACKEND=torch python3 -m benchmarks.gpu.ways_check phi3 --limit-mb 8192 \
    --batch 32 --verify --parallel 1 --no-combinations --break-cycles --fresh-process \
    --levers ${FULL_LEVERS:-sgd_momentum} 2>&1 | tee "$0/device-full-table.txt" \
    | grep -i "device\|one at a time\|largest\|right\|low\|above\|result"
  cat "$0/filler.txt"; kill $filler' "$out"; }
# issue 45's convnet and token transformer on JAX (JAX_ROWS: model@cap, one
# after another: they time compilations), each with the search of 2026-12-05
# on: cold, warm, one compilation of `fit`'s step at the answer, `fit`'s
# first step; then jobs in new processes at the answer, the ceiling and
# above it, side by side
jax_rows() { local spec m mb sizes
  for spec in ${JAX_ROWS:-resconv@6144 transformer@6144}; do m=${spec%@*} mb=${spec#*@}
    run 420 "speed-$m" env KERAS_BACKEND=jax python3 -m benchmarks.gpu.capacity_speed \
      "$m" --limit-mb "$mb"
    sizes=$(tail -n 1 "$out/speed-$m.txt" | python3 -c "
import json, sys
c = json.loads(sys.stdin.read()).get('cold') or {}
a, t = c.get('answer'), c.get('ceiling')
print(*sorted({a, t, t + 1, t + max(1, t * 3 // 100)}) if a and t else '')")
    for b in $sizes; do KERAS_BACKEND=jax timeout 240 python3 -m benchmarks.gpu.capacity_check \
      trial "$m" "$b" --limit-mb "$mb" 2>/dev/null | tail -n 1 | sed "s/^/job $m $b: /" &
    done; wait; done; }
# compilations as `fit` compiles them (the checks of a round): one size
# alone, two side by side, then four, in one process as the checks compile
# them, then the four each in its own process (WIDTH_ROWS: model cap alone
# pair four sizes, no size twice; run on 2026-12-07 without the pair,
# docs/capacity.md)
check_widths() { run 560 check-widths bash -c 'P="python3 -m benchmarks.gpu.jax_compile_options"
  export KERAS_BACKEND=jax; f() { grep "batch\|side"; }
  while read -r m mb alone pair sizes; do [ -n "$m" ] || continue
    echo "== $m: one alone, two, then four in one process"
    $P $m --limit-mb $mb --sizes $alone --sets fit --together fit \
      --together-sizes ${pair//,/ } --together-sizes $sizes < /dev/null 2>&1 | f
    echo "== $m: four processes"; s=$(date +%s)
    for n in $sizes; do $P $m --limit-mb $mb --sizes $n --sets fit 2>&1 | f & done; wait
    echo "wall $(( $(date +%s) - s )) s"
  done <<< "${WIDTH_ROWS:-transformer 6144 157 158,161 180 200 220 240
gpt2 8192 29 28,34 30 31 32 33}"'; }
# a convnet's checks one at a time (2026-12-07): the held-out ResNet's
# estimate, then again with its checks side by side (as before), each
# alone; then jobs at its answers and above; then the convnet of the runs
# above (SKIP_RESCONV=1: not)
conv_checks() { run 590 conv-checks bash -c 'C="python3 -m benchmarks.gpu.capacity_check"
  export KERAS_BACKEND=jax; s() { tee -a "$0/conv-checks-full.txt" | python3 -c "import json, sys
for line in sys.stdin:
    if line.startswith(\"{\"):
        e = json.loads(line); print(e[\"model\"], e[\"seconds\"], \"s\", e[\"answers\"])
    elif \"round \" in line or \"one at a time\" in line: print(line.strip()[:200])"; }
  $C estimate resnet --limit-mb 6144 2>&1 | s
  $C estimate resnet --limit-mb 6144 --checks-side-by-side 2>&1 | s
  sizes=$(grep "^{" "$0/conv-checks-full.txt" | head -n 1 | python3 -c "import json, sys
a = json.loads(sys.stdin.read())[\"answers\"]; c = a[\"0.0\"]
print(*sorted({a[\"0.1\"], c, c + 1, c + max(1, c * 3 // 100)}))")
  for b in $sizes; do $C trial resnet $b --limit-mb 6144 2>/dev/null | tail -n 1 &
  done; wait
  [ -n "${SKIP_RESCONV:-}" ] || $C estimate resconv --limit-mb 6144 2>&1 | s' "$out"; }
compare_layers() {
  if [ -s "$out/torch.json" ] && [ -s "$out/jax.json" ]; then
    python3 -m benchmarks.gpu.by_layer_lm --compare "$out/torch.json" "$out/jax.json" \
      > "$out/layers-compare.txt" 2>&1
    grep "torch vs jax\|within 25%\|TARGET" "$out/layers-compare.txt"
  fi; }

case ${1:-} in
capacity) gpt2_speed; heldout_capacity ;;
layers) layers_torch; layers_jax; compare_layers ;;
together)
  shift
  for job in "$@"; do "$job" & done
  wait
  compare_layers ;;
*)
  echo "usage: $0 capacity|layers|together JOB..." >&2; exit 2 ;;
esac
