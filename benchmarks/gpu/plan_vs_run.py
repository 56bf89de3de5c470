"""XLA's plan of `fit`'s step against the device's peak while `fit` runs it.

In one new process under a cap: the step at `--size` compiled as `fit`
compiles it (its memory analysis, field by field), then `fit` trains
`--steps` steps at that size, then the step is compiled again (found in
JAX's cache when it is `fit`'s). Prints the allocator's peak after each:

    KERAS_BACKEND=jax python3 -m benchmarks.gpu.plan_vs_run gpt2 --size 36 \
        --limit-mb 8192
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--limit-mb", type=float, default=8192)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    from keras_memwatch import configure_memory

    configure_memory(memory_limit_mb=args.limit_mb)
    from benchmarks.models import build, data
    from keras_memwatch.judge import xla_plan
    from keras_memwatch.measure.batches import fit_steps
    from keras_memwatch.measure.device import Device

    device = Device("jax", None)
    model = build(args.model)
    x, y = data(args.model, args.size)
    model.optimizer.build(model.trainable_variables)

    def process_mib() -> float:
        import os

        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        mine = sum((p.usedGpuMemory or 0) for p in
                   pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                   if p.pid == os.getpid()) / 2**20
        used = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
        return f"{mine:.0f} MiB, the device {used:.0f} MiB"

    def plan(label: str) -> None:
        began = time.perf_counter()
        lowered, state, _ = xla_plan.lower_step(model, (x, y), args.size, 0)
        m = lowered.compile().memory_analysis()
        print(f"{label}: {time.perf_counter() - began:.1f} s; state {state / 2**20:.0f}"
              f" MiB; arguments {m.argument_size_in_bytes / 2**20:.0f}, outputs "
              f"{m.output_size_in_bytes / 2**20:.0f}, aliased "
              f"{m.alias_size_in_bytes / 2**20:.0f}, temporaries "
              f"{m.temp_size_in_bytes / 2**20:.0f} MiB; in use "
              f"{device.in_use() / 2**20:.0f}, peak {(device.peak() or 0) / 2**20:.0f} MiB",
              flush=True)

    print(f"before: NVML: this process {process_mib()}", flush=True)
    plan("plan before fit")
    fit_steps(model, (x, y), args.steps)
    print(f"fit, {args.steps} steps at {args.size}: peak "
          f"{(device.peak() or 0) / 2**20:.0f} MiB, in use "
          f"{device.in_use() / 2**20:.0f} MiB; NVML: this process "
          f"{process_mib()}", flush=True)
    plan("plan after fit")


if __name__ == "__main__":
    main()
