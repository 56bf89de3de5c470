"""A job's memory step by step (PyTorch on a GPU): does it grow with the
steps of one `fit`?

Builds a model of `benchmarks.models` under a cap in this new process and
trains `--steps` steps of `fit` at `--size`, with a callback that prints,
at every batch end, the memory allocated and the peak since the last
batch end (`torch.cuda`), and what the caching allocator reserved
(`--quiet`: nothing); `--first-fit N` runs a `fit` of N steps first;
`--collect N` adds `keras_memwatch.CollectCycles(every=N)`; `--check-first
A,B` first measures those sizes as `estimate_max_batch_size`'s checks do
(`capacity.steps.Steps`), in this process. The last line is the job's end:
ran, or the allocator's message.

    KERAS_BACKEND=torch python3 -m benchmarks.gpu.job_steps phi3 --size 16 \\
        --steps 30 --limit-mb 8192
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--limit-mb", type=float, default=None)
    parser.add_argument("--collect", type=int, default=0,
                        help="CollectCycles(every=N); 0: none")
    parser.add_argument("--quiet", action="store_true",
                        help="print nothing at batch ends (Python allocates less, "
                             "so its collector runs at other moments)")
    parser.add_argument("--first-fit", type=int, default=0,
                        help="a `fit` of this many steps before the job's own, as "
                             "the estimate's steps run (one step, then the measured)")
    parser.add_argument("--check-first", default="",
                        help="sizes measured as the checks measure them, first")
    args = parser.parse_args(argv)
    if args.limit_mb:
        from keras_memwatch import configure_memory

        configure_memory(memory_limit_mb=args.limit_mb)
    import keras
    import torch

    from benchmarks.models import build, data
    from keras_memwatch import CollectCycles
    from keras_memwatch.measure.batches import Batches
    from keras_memwatch.oom_errors import is_oom_error

    mib = 2**20

    class EachStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            print(f"step {batch}: allocated {torch.cuda.memory_allocated() / mib:.0f} "
                  f"MiB, peak {torch.cuda.max_memory_allocated() / mib:.0f} MiB, "
                  f"reserved {torch.cuda.memory_reserved() / mib:.0f} MiB", flush=True)
            torch.cuda.reset_peak_memory_stats()

    model = build(args.model)
    sample = Batches(*data(args.model, min(args.size, 64)))
    if args.check_first:
        from keras_memwatch.capacity.steps import Steps
        from keras_memwatch.measure.device import Device

        checks = Steps(model, sample, Device("torch", None), print)
        checks.check([int(b) for b in args.check_first.split(",")])
        torch.cuda.reset_peak_memory_stats()
    x, y = sample.take(args.size * args.steps)
    callbacks = [] if args.quiet else [EachStep()]
    if args.collect:
        callbacks.append(CollectCycles(every=args.collect))
    try:
        if args.first_fit:
            print(f"a first fit of {args.first_fit} steps:")
            first = sample.take(args.size * args.first_fit)
            keras.Model.fit(model, *first, batch_size=args.size, epochs=1,
                            shuffle=False, verbose=0, callbacks=callbacks)
            print("the job's fit:")
        keras.Model.fit(model, x, y, batch_size=args.size, epochs=1, shuffle=False,
                        verbose=0, callbacks=callbacks)
    except Exception as e:  # noqa: BLE001
        if not is_oom_error(e):
            raise
        print(f"out of memory: {str(e).splitlines()[0]}")
        return 0
    print("ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
