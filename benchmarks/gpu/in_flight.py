"""How many batches a JAX `fit` holds on the GPU beyond XLA's plan (issue 15).

Keras's JAX loop dispatches steps ahead of the device, and each step
dispatched holds its batch on the device until it runs; the estimate counts
them (`xla_plan.BATCHES_AHEAD`). This trains one epoch of `--steps` steps
of one batch repeated, in this process, and reads the device memory in use
at every batch end (on Keras's worker thread, so nothing waits for a step)
less what was in use before and the plan: the batches dispatched and not
yet run (far below zero where the device was between steps, its
temporaries freed).
It prints the most batches seen above XLA's plan of the step, which is
what the estimate must count, as JSON:

    KERAS_BACKEND=jax python -m benchmarks.gpu.in_flight block 200 --steps 1000

`--mode sync` waits for each step (a callback that reads the loss), for
comparison; `--series` adds the count and the gap at every batch end. Run
each model in a new process; on a GPU only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Optional


def batches_held(in_use: list[int], before: int, plan: int,
                 batch_bytes: int) -> list[float]:
    """The batches held beyond the step's plan at each batch end: the device
    memory in use less what was in use before and the plan, in batches."""
    return [(b - before - plan) / batch_bytes for b in in_use]


def in_flight(name: str, batch: int, steps: int, sync: bool,
              series: bool = False) -> dict[str, Any]:
    import jax
    import keras

    from benchmarks.models import build, data
    from keras_memwatch.judge import xla_plan
    from keras_memwatch.measure.batches import repeated

    device = jax.devices()[0]
    if device.memory_stats() is None:
        raise SystemExit(f"in_flight: {device.platform} gives no memory statistics; "
                         "run it on a GPU")
    model = build(name)
    x, y = data(name, batch)
    model.train_on_batch(x[:2], y[:2])  # the state, and the step compiled once
    lowered, state_bytes, _ = xla_plan.lower_step(model, (x, y), batch)
    plan = xla_plan.compiled_working_bytes(lowered, state_bytes, 0)
    one = xla_plan.batch_bytes((x, y), batch)

    class InUse(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.async_safe = not sync
            self.seen: list[int] = []
            self.times: list[float] = []

        def on_train_batch_end(self, index: int, logs: Optional[dict] = None) -> None:
            if sync:
                float(logs["loss"])
            self.seen.append(device.memory_stats()["bytes_in_use"])
            self.times.append(time.perf_counter())

    watch = InUse()
    before = device.memory_stats()["bytes_in_use"]
    began = time.perf_counter()
    model.fit(repeated(x, y, steps), epochs=1, verbose=0, callbacks=[watch])
    jax.block_until_ready([v.value for v in model.trainable_variables])
    seconds = time.perf_counter() - began
    held = [round(h, 1) for h in batches_held(watch.seen, before, plan, one)]
    gaps = [1000 * (b - a) for a, b in zip(watch.times, watch.times[1:])]
    result = {"model": name, "batch": batch, "steps": steps,
              "mode": "sync" if sync else "async", "plan_bytes": plan,
              "batch_bytes": one, "most_above_plan": max(held),
              "most_above_plan_by_step": {n: max(held[:n]) for n in
                                          (10, 100, 1000, 10000) if n <= len(held)},
              "ms_per_step": round(1000 * seconds / steps, 2),
              # while the run-ahead builds, batch ends come as fast as the host
              # dispatches; once it stops growing, as fast as the device runs
              "ms_between_batch_ends": {"first_20": _median(gaps[:20]),
                                        "last_100": _median(gaps[-100:])}}
    if series:
        result["held_by_step"] = held
        result["ms_gaps"] = [round(g, 2) for g in gaps]
    return result


def _median(values: list[float]) -> Optional[float]:
    return round(sorted(values)[len(values) // 2], 2) if values else None


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a model of benchmarks.models")
    parser.add_argument("batch", type=int)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--mode", choices=("async", "sync"), default="async")
    parser.add_argument("--limit-mb", type=float, default=10240,
                        help="memory limit through configure_memory (default 10240)")
    parser.add_argument("--series", action="store_true",
                        help="print the batches held and the gaps at every batch end")
    args = parser.parse_args(argv)
    from keras_memwatch import configure_memory

    configure_memory(memory_limit_mb=args.limit_mb)
    print(json.dumps(in_flight(args.model, args.batch, args.steps,
                               args.mode == "sync", args.series)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
