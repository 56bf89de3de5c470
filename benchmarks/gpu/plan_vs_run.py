"""XLA's plan of `fit`'s step against what a user's `fit` at that size does.

In one new process under a cap: the step at `--size` compiled as `fit`
compiles it (its memory analysis, field by field), then Keras's `fit`
trains `--steps` steps at that size as a user's call would (nothing
awaits its results), then the step is compiled again (found in JAX's cache
when it is `fit`'s). Prints the allocator's peak and NVML's view of the
process after each, whether `fit` raised and whether the weights can still
be read; with `--watch`, `fit` runs with a `MemWatch` and no guard, and
what the watch logged at ERROR is printed too:

    KERAS_BACKEND=jax python3 -m benchmarks.gpu.plan_vs_run gpt2 --size 36 \
        --limit-mb 8192 [--watch]
"""

from __future__ import annotations

import argparse
import logging
import os
import time

MIB = 2**20


def _nvml() -> str:
    """NVML's view: this process's memory and the device's."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    mine = sum((p.usedGpuMemory or 0) for p in
               pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
               if p.pid == os.getpid()) / MIB
    used = pynvml.nvmlDeviceGetMemoryInfo(handle).used / MIB
    return f"this process {mine:.0f} MiB, the device {used:.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--limit-mb", type=float, default=8192)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--watch", action="store_true",
                        help="fit with a MemWatch (no guard)")
    args = parser.parse_args()

    from keras_memwatch import MemWatch, configure_memory

    configure_memory(memory_limit_mb=args.limit_mb)
    import keras

    from benchmarks.models import build, data
    from keras_memwatch.judge import xla_plan
    from keras_memwatch.measure.batches import Batches
    from keras_memwatch.measure.device import Device

    device = Device("jax", None)
    model = build(args.model)
    x, y = data(args.model, args.size)
    model.optimizer.build(model.trainable_variables)

    def memory() -> str:
        return (f"in use {device.in_use() / MIB:.0f}, peak "
                f"{(device.peak() or 0) / MIB:.0f} MiB")

    def plan(label: str) -> None:
        began = time.perf_counter()
        lowered, state, _ = xla_plan.lower_step(model, (x, y), args.size, 0)
        m = lowered.compile().memory_analysis()
        print(f"{label}: {time.perf_counter() - began:.1f} s; state {state / MIB:.0f}"
              f" MiB; arguments {m.argument_size_in_bytes / MIB:.0f}, outputs "
              f"{m.output_size_in_bytes / MIB:.0f}, aliased "
              f"{m.alias_size_in_bytes / MIB:.0f}, temporaries "
              f"{m.temp_size_in_bytes / MIB:.0f} MiB; {memory()}", flush=True)

    errors: list[str] = []

    class Errors(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                errors.append(record.getMessage()[:300])

    logging.getLogger("keras_memwatch").addHandler(Errors())
    print(f"before: NVML: {_nvml()}", flush=True)
    plan("plan before fit")
    raised = "nothing"
    try:
        keras.Model.fit(model, *Batches(x, y).take(args.size * args.steps),
                        batch_size=args.size, epochs=1, verbose=0,
                        callbacks=[MemWatch(verbose=0)] if args.watch else [])
    except Exception as e:  # noqa: BLE001
        raised = f"{type(e).__name__}: {str(e)[:200]}"
    try:
        keras.ops.convert_to_numpy(model.trainable_variables[0])
        weights = "readable"
    except Exception as e:  # noqa: BLE001
        weights = f"{type(e).__name__}: {str(e)[:120]}"
    print(f"fit, {args.steps} steps at {args.size}: {memory()}; NVML: {_nvml()}; "
          f"fit raised {raised}; weights {weights}", flush=True)
    if args.watch:
        print(f"the watch logged at ERROR: {errors or 'nothing'}", flush=True)
    plan("plan after fit")


if __name__ == "__main__":
    main()
