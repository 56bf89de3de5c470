"""What Keras's PyTorch steps leave in reference cycles, before and after
`keras_memwatch.break_tree_cycles()`, and what the fix does to a step's time.

For each model of `benchmarks.models`, in this process: the tensors (and
their distinct storages' bytes) that `--steps` steps of `fit` leave for
Python's cyclic collector, with the collector paused; then the seconds of
those steps with the collector running, the median of `--repeats`. Then
the same after `break_tree_cycles()`:

    KERAS_BACKEND=torch python -m benchmarks.tree_cycles --models resconv,gpt2_cpu
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from typing import Any, Optional

MIB = 2**20


def left_in_cycles(model: Any, batch: tuple, steps: int) -> tuple[int, int]:
    """The tensors `steps` steps leave for the collector, and their bytes."""
    import torch

    from keras_memwatch.measure.batches import fit_steps

    gc.collect()
    gc.disable()
    try:
        fit_steps(model, batch, steps)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
    finally:
        gc.set_debug(0)
        gc.enable()
    tensors = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
    gc.garbage.clear()
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors}
    return len(tensors), sum(storages.values())


def step_seconds(model: Any, batch: tuple, steps: int, repeats: int) -> float:
    from keras_memwatch.measure.batches import fit_steps

    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fit_steps(model, batch, steps)
        times.append((time.perf_counter() - began) / steps)
    return statistics.median(times)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="resconv_tiny,gpt2_tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    import keras

    from benchmarks.models import build, data
    from keras_memwatch import break_tree_cycles
    from keras_memwatch.measure.batches import Batches, fit_steps

    if keras.backend.backend() != "torch":
        print("the cycles are Keras's PyTorch backend's: run with KERAS_BACKEND=torch")
        return 2
    models = {}
    for name in args.models.split(","):
        model = build(name)
        batch = Batches(*data(name, args.batch)).take(args.batch)
        fit_steps(model, batch, 2)  # built, compiled, warm
        models[name] = (model, batch)
    rows = {name: [] for name in models}
    for stage in ("Keras as it is", "break_tree_cycles()"):
        if stage != "Keras as it is":
            print(f"break_tree_cycles() -> {break_tree_cycles()}")
        for name, (model, batch) in models.items():
            count, nbytes = left_in_cycles(model, batch, args.steps)
            seconds = step_seconds(model, batch, args.steps, args.repeats)
            rows[name].append((count, nbytes, seconds))
            print(f"{name}, {stage}: {args.steps} steps at {args.batch} leave "
                  f"{count} tensors ({nbytes / MIB:.2f} MiB) in cycles; "
                  f"{seconds * 1e3:.1f} ms a step")
    for name, ((_, _, before), (_, _, after)) in rows.items():
        print(f"{name}: a step's time after the fix x{after / before:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
