"""`ways_to_fit` on a GPU under a cap: the table, and the as-is row's
largest batch against jobs that really train in fresh processes.

One model a run (the cap is per process, set before the model is built):

    KERAS_BACKEND=jax python3 -m benchmarks.gpu.ways_check gpt2 --limit-mb 8192 \\
        --batch 32
    KERAS_BACKEND=torch python3 -m benchmarks.gpu.ways_check resconv \\
        --limit-mb 6144 --batch 256

`--verify` then trains the model as it is, in new processes, at the
as-is row's `largest_batch` and 3% above it
(`benchmarks.capacity_check trial`), and prints whether each ran.
On a CPU, a tiny model without a cap (`conv_tiny`, `gpt2_tiny`) is a
smoke test. Models: `benchmarks.models`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="ways_check")
    parser.add_argument("model", help="a name from benchmarks.models (gpt2, resconv, ...)")
    parser.add_argument("--limit-mb", type=float, default=None,
                        help="cap the allocator at this many MiB (configure_memory)")
    parser.add_argument("--batch", type=int, required=True, help="the wanted batch")
    parser.add_argument("--samples", type=int, default=8,
                        help="samples in the sample batch (default: 8)")
    parser.add_argument("--levers", default="all",
                        help="comma-separated lever names (default: all)")
    parser.add_argument("--no-combinations", action="store_true")
    parser.add_argument("--verify", action="store_true",
                        help="train the as-is largest batch and 3%% above it in "
                             "fresh processes")
    parser.add_argument("--json", default=None, help="write the table here as JSON")
    args = parser.parse_args(argv)
    if args.limit_mb:
        from keras_memwatch import configure_memory

        configure_memory(memory_limit_mb=args.limit_mb)
    import keras
    import pandas as pd

    from benchmarks.models import build, data
    from keras_memwatch.explain.ways_text import format_ways
    from keras_memwatch.ways import ways_to_fit

    model = build(args.model)
    x, y = data(args.model, args.samples)
    began = time.perf_counter()
    levers = "all" if args.levers == "all" else args.levers.split(",")
    table = ways_to_fit(model, x, y, batch_size=args.batch, levers=levers,
                        combinations=not args.no_combinations,
                        progress=lambda line: print("  " + line, flush=True))
    seconds = time.perf_counter() - began
    print(f"\n{args.model} on {keras.backend.backend()}, cap "
          f"{args.limit_mb or 'none'} MiB, {seconds:.1f} s")
    print(format_ways(table))
    with pd.option_context("display.width", 200, "display.max_columns", 10):
        print(table.drop(columns=["change", "notes"]).to_string(index=False))
    record = {"model": args.model, "backend": keras.backend.backend(),
              "limit_mb": args.limit_mb, "batch": args.batch, "seconds": seconds,
              "table": json.loads(table.to_json(orient="records"))}
    if args.verify and args.limit_mb:
        largest = table.iloc[0]["largest_batch"]
        if pd.notna(largest):
            record["jobs"] = {}
            for size in (int(largest), int(largest * 1.03) + 1):
                ran = _trial(args.model, size, args.limit_mb)
                record["jobs"][size] = ran
                print(f"as is, batch {size} in a fresh process: {ran}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2, default=str)
    return 0


def _trial(model: str, size: int, limit_mb: float) -> Any:
    """Whether a job of `size` ran (`benchmarks.capacity_check trial`)."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.capacity_check", "trial", model,
         str(size), "--limit-mb", str(limit_mb)],
        capture_output=True, text=True, env=dict(os.environ), timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return f"no result (exit {done.returncode}): {done.stderr[-300:]}"
    return json.loads(lines[-1]).get("ran")


if __name__ == "__main__":
    sys.exit(main())
