"""Predicts the largest batch that fits, from a few small training steps.

`estimate_max_batch_size` trains the user's model for two steps at each of
a few small batch sizes, measures each step's *working memory* (its peak
above the memory in use before the ladder began: activations kept for the
backward pass, gradients, workspaces, the batch itself), fits

    working(batch) = static + per_sample x batch

by least squares, checks that the line really fits, and solves for the
largest batch under the device's limit less a headroom. The model's
weights, optimizer state (slots and iteration counter) and metric states
are put back bit for bit afterwards.

How a step's working memory is measured, per device (`method="auto"`):

- JAX on a GPU (`"xla"`): XLA's own memory plan of the compiled train step
  (see `keras_memwatch.judge.xla_plan`): arguments + outputs - donated +
  temporaries, less the training state, which is already in memory, plus
  the batches a `fit` holds on the device ahead of the running step
  (Keras sends the next one ahead and its loop dispatches steps ahead of
  the device). Where they are a part of the answer that matters, the
  estimate trains some steps at its answer and counts them (`run_ahead`);
  elsewhere it counts `xla_plan.BATCHES_AHEAD`. JAX's allocator has no
  peak that can be reset (its peak is a high-water mark for the life of
  the process), so the plan is the figure here: a step's exactly, a long
  job's up to the batches ahead.
  The line's answer is then checked by compiling (not running) the step
  at the sizes around it, and the ceiling is searched for the same way:
  once a plan would not fit, XLA recomputes activations rather than run
  out of memory, so far more fits than the line says. On an H200 under
  an 8 GiB limit the line gave 855 for a convnet, the ceiling 1264, and
  1260 was the largest batch that trained (see `ceiling_batch_size`).
- Otherwise (`"probes"`: PyTorch and TensorFlow on a GPU, every backend on
  the CPU): keras_memwatch's probes, the same readings MemWatch records: the
  allocator's peak since the previous sample (PyTorch, TensorFlow), or the
  host's peak resident set size (Linux; reset through `/proc/self/clear_refs`).
  On the host, freed heap memory is handed back to the system
  (`malloc_trim`, glibc) before each measured step, and the working memory
  is the peak above the RSS measured once after the first step, since CPU
  allocators (oneDNN, Eigen) keep what they freed. Where a device only has
  a high-water mark (JAX on a GPU with `method="probes"`), a size counts
  only when the mark rose during its steps, and then includes its first
  step (compilation, autotuning).
- On a GPU measured by the allocator (PyTorch, TensorFlow) the ladder climbs
  to a quarter of the free memory (never trying a size expected above
  half), PyTorch's reserved peak of each step is recorded beside its
  allocated peak, and the answer is then confirmed by real steps
  (`confirm`): under an allocator cap, the largest batch that trains under
  the whole limit is searched (at most 8 steps, from the allocated line's
  answer down towards the reserved line's); the answer under the headroom
  is the line's scaled by what the allocator needed there, and one real
  step at it must run (else it steps down 5%). On PyTorch the boundary is
  then searched again, and the recommendation trained, in new processes,
  each a job of 4 epochs of 15 steps (`fresh_process`): a process that has
  trained can fit more than a job started afresh, and a job's peak rises
  above its first steps' as reference cycles hold memory (`collector`).
  The steps measured in this process run with Python's garbage collector
  paused (`collector`). The allocator settings in effect are reported, and
  where `expandable_segments` is off the boundary is searched again with
  it switched on in this process (see `allocator`), then switched back.
- JAX on a GPU: the ladder trains nothing: it compiles every size, side by
  side, the memory in use being the training state as built; the checks
  compile in rounds side by side, aimed by compilations without
  autotuning or Triton's matrix multiplications (half the time, plans
  nearer `fit`'s), and the answer is confirmed by the compilation `fit`
  makes, which `fit` then finds in JAX's cache; the ceiling is left to the
  aimed plans (`xla_compile`, `xla_check`).
- JAX on the CPU: the host's peak RSS answers; XLA's plan at the same
  sizes (from JAX's cache) is reported beside it, and the smaller answer
  is used, saying why (`alternatives`).
- PyTorch on a GPU can also be measured by the caching allocator's peak
  *reserved* bytes (`method="reserved"`), which its per-process cap bounds.
  On an H200 under an 8 GiB cap (a 4-layer convnet) it predicted 785 where
  917 was the largest batch that ran (-14%), while the allocated peak of
  `"probes"` predicted 921 (+0.4%): hence not the default.

The limit is the GPU allocator's limit where the framework reports one
(JAX's pool, PyTorch's per-process cap, TensorFlow's logical-device limit
set through `configure_memory`), else the device's total memory from NVML;
on the CPU it is the memory still available to the host (`MemAvailable`,
or the cgroup's limit when lower) plus what this process already holds.

On the CPU, predictions are rougher than on a GPU: a step's RSS moves by
a few MiB from one run to the next, so the ladder must reach hundreds of
MiB of working memory (the default one does), and CPU allocators keep
freed memory between steps, so a long `fit` may hold more than one step's
peak (the headroom is there for that). Under `RLIMIT_AS` the limit is the
address space left, which allocators consume faster than resident memory.

The default ladder starts at batch 2 and grows (x2 to x8 a step) until a
step's working memory reaches 5% of the free memory, with at least four
sizes; it never tries a size whose working memory, extrapolated from the
sizes before it, would exceed 20% of the free memory, and stops at 12
sizes or batch 65536. A fit is trusted when every measurement lies within
10% (of the largest) of the line, and the line through all sizes but the
largest predicts the largest within 10% (extrapolation, tested); the
smallest sizes are dropped first (down to three) where a constant part
still dominates them.
Otherwise no batch size is predicted (`predicted_batch_size` is `None`)
and `explanation` says why: a result, not an exception, so the
measurements can still be read.

The package's modules, one job each: `fit` (the line), `result`
(`CapacityEstimate` and its text), `host_memory` (the host's available
memory), `batches` (the sample batch, grown to any size), `model_state`
(building the model and putting its state back), `meter` (a step's working
memory on one device), `ladder` (the batch sizes tried), `allocator`
(PyTorch's caching allocator: settings, cache, peaks), `confirm` (real
steps near the limit on a GPU), `xla_compile` (XLA's plans, side by side,
and the searches over them), `xla_check` (checking the answer by compiling
the step) and `estimate` (`estimate_max_batch_size`).

This package imports no framework and no Keras until a function runs.
"""

from __future__ import annotations

from keras_memwatch.capacity.estimate import estimate_max_batch_size
from keras_memwatch.capacity.fit import LinearFit, fit_linear, predict_batch_size
from keras_memwatch.capacity.host_memory import host_available_bytes
from keras_memwatch.capacity.meter import HOST, METHODS
from keras_memwatch.capacity.result import (
    LIMIT_ALLOCATOR,
    LIMIT_HOST,
    LIMIT_NVML,
    Alternative,
    CapacityEstimate,
    Trial,
    sizes_text,
)

__all__ = [
    "HOST",
    "LIMIT_ALLOCATOR",
    "LIMIT_HOST",
    "LIMIT_NVML",
    "METHODS",
    "Alternative",
    "Trial",
    "CapacityEstimate",
    "LinearFit",
    "estimate_max_batch_size",
    "fit_linear",
    "host_available_bytes",
    "predict_batch_size",
    "sizes_text",
]
