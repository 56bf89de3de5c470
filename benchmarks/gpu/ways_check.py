"""`ways_to_fit` on a GPU under a cap: the table, then each row's largest
batch against jobs that really train, in fresh processes.

One model a run (the cap is per process, set before the model is built):

    KERAS_BACKEND=jax python3 -m benchmarks.gpu.ways_check gpt2 --limit-mb 8192 \\
        --batch 32 --verify
    KERAS_BACKEND=torch python3 -m benchmarks.gpu.ways_check resconv \\
        --limit-mb 6144 --batch 512 --verify

The table is measured with `--headroom` (default 0: the largest batch
under the whole cap, what a job can reach). `--verify` then trains, for
every measured row, its `largest_batch` and 3% above it as jobs in new
processes side by side (`trial`: a dtype policy set before the model is
built, as the row's `change` says, the rest of the row's setting made
with `keras_memwatch.ways.variant.realized`, then one `fit`, as a user
runs it, timed after its first step), and prints whether each ran and
its time a sample: an answer is right when its size runs and the size
3% above does not. With `--repeat N` each job runs N times, each in its
own process, and the verdict counts them: at a limit where one process
trains a size and the next does not, an answer that trains some of the
times is "at the edge", not right or above. `--collect N` runs the jobs
with `CollectCycles(every=N)`, `--break-cycles` the table and the jobs
after `break_tree_cycles()` (PyTorch), `--fresh-process` the table with
each row's checks as jobs in new processes. On a CPU, a
tiny model without a cap (`conv_tiny`, `gpt2_tiny`) is a smoke test.
Models: `benchmarks.models`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import sys
import time
from typing import Any, Optional

from benchmarks.gpu.children import json_child

ABOVE = 0.03


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The table, printed; returns it as records with the settings."""
    if args.limit_mb:
        from keras_memwatch import configure_memory

        configure_memory(memory_limit_mb=args.limit_mb)
    import keras
    import pandas as pd

    from benchmarks.models import build, data
    from keras_memwatch.explain.ways_text import format_ways
    from keras_memwatch.units import format_bytes
    from keras_memwatch.ways import ways_to_fit

    model = build(args.model)
    x, y = data(args.model, args.samples)
    began = time.perf_counter()
    levers = "all" if args.levers == "all" else args.levers.split(",")
    table = ways_to_fit(model, x, y, batch_size=args.batch, levers=levers,
                        headroom=args.headroom,
                        combinations=not args.no_combinations,
                        max_seconds=args.max_seconds,
                        compilation_cache=args.compilation_cache,
                        fresh_process=args.fresh_process,
                        progress=lambda line: print("  " + line, flush=True))
    seconds = time.perf_counter() - began
    print(f"\n{args.model} on {keras.backend.backend()}, cap "
          f"{args.limit_mb or 'none'} MiB, {seconds:.1f} s\n")
    print(format_ways(table), flush=True)
    with pd.option_context("display.width", 200, "display.max_columns", 10):
        print(table.drop(columns=["change", "notes"]).to_string(index=False))
    print("\nThe user's state held beside each variant while it was measured, and "
          "what the allocator's cap was widened by for it:")
    for lever, (held, widened) in table.attrs["held_bytes"].items():
        print(f"  {lever}: {format_bytes(held)} held, cap widened by "
              f"{format_bytes(widened)}")
    return {"model": args.model, "backend": keras.backend.backend(),
            "limit_mb": args.limit_mb, "batch": args.batch, "seconds": seconds,
            "settings": table.attrs["settings"],
            "held_bytes": table.attrs["held_bytes"],
            "table": json.loads(table.to_json(orient="records"))}


def trial(model_name: str, setting: dict[str, Any], size: int,
          limit_mb: Optional[float], steps: int, collect: int = 0,
          break_cycles: bool = False) -> dict[str, Any]:
    """A job of `size` (the effective batch) with `setting`, in this new
    process, as a user runs it: one `fit` of `steps` steps (`collect` > 0:
    with `CollectCycles(every=collect)`; `break_cycles`: after
    `break_tree_cycles()`). Returns whether
    it ran, its time a sample after the first step, and the device's peak
    (the variant alone: what the table's need, measured beside the user's
    model, stands for); a step out of memory prints the allocator's
    message on stderr."""
    if limit_mb:
        from keras_memwatch import configure_memory

        configure_memory(memory_limit_mb=limit_mb)
    import keras

    from benchmarks.models import build, data
    from keras_memwatch import CollectCycles, break_tree_cycles
    from keras_memwatch.measure.batches import Batches, fit_steps, wait_for_steps
    from keras_memwatch.measure.device import Device
    from keras_memwatch.oom_errors import device_ran_out, first_line, is_oom_error
    from keras_memwatch.ways.variant import Setting, realized

    class Clock(keras.callbacks.Callback):
        """The seconds from the end of the first step to the end of fit."""

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch == 0:
                wait_for_steps(self.model)
                self.began = time.perf_counter()

        def on_train_end(self, logs: Any = None) -> None:
            wait_for_steps(self.model)
            self.seconds = time.perf_counter() - self.began

    if break_cycles:
        break_tree_cycles()
    chosen = Setting.from_dict(setting)
    if chosen.policy:
        # as the row's change says: the policy set before the model is
        # built, so that no float32 original stays beside it
        keras.config.set_dtype_policy(chosen.policy)
        chosen = dataclasses.replace(chosen, policy=None)
    device = Device(keras.backend.backend(), None)  # its peak, from here
    model = build(model_name)
    x, y = data(model_name, min(size, 64))
    clock = Clock()
    callbacks = [clock] + ([CollectCycles(every=collect)] if collect else [])
    try:
        with realized(model, Batches(x, y), size, chosen) as v:
            fit_steps(v.model, v.data.take(v.batch_size), steps + 1, callbacks)
            per_sample = clock.seconds / (steps * v.batch_size)
    except Exception as e:  # noqa: BLE001
        if not is_oom_error(e):
            raise
        print(f"out of memory: {first_line(e)}", file=sys.stderr)
        return {"ran": False, "device_full": device_ran_out(e)}
    return {"ran": True, "seconds_per_sample": per_sample, "peak_bytes": device.peak()}


def _child(args: list[str]) -> dict[str, Any]:
    """A job in a new process (a failed one says why on stderr)."""
    result = json_child("benchmarks.gpu.ways_check", args, 900, label=" ".join(args[:4]))
    return result if result is not None else {"ran": None}


def _release_cached_memory() -> None:
    """Gives PyTorch's cached blocks back to the card (nothing elsewhere)."""
    import keras

    if keras.backend.backend() == "torch":
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()


def verify(record: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each measured row's largest batch and 3% above it, as jobs."""
    jobs = []
    for row in record["table"]:
        setting = record["settings"].get(row["lever"])
        largest = row["largest_batch"]
        if setting is None or largest is None:
            continue
        # the size above: 3% more, and at least one more sample a device
        # batch where the row accumulates gradients (31 in 2 steps is 15 a step)
        every = setting.get("accumulation", 1)
        above = max(int(largest * (1 + ABOVE)) + 1, (int(largest) // every + 1) * every)
        for size in [int(largest)] * args.repeat + [above] * args.repeat:
            jobs.append((row["lever"], size, ["trial", args.model, "--size", str(size),
                                               "--setting", json.dumps(setting),
                                               "--steps", str(args.steps),
                                               "--collect", str(args.collect)]
                         + (["--break-cycles"] if args.break_cycles else [])
                         + (["--limit-mb", str(args.limit_mb)] if args.limit_mb else [])))
    _release_cached_memory()  # the jobs share the card with this process
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        done = list(pool.map(lambda job: _child(job[2]), jobs))
    results = [{"lever": lever, "size": size, **result}
               for (lever, size, _), result in zip(jobs, done)]
    print(f"\nJobs in fresh processes ({args.steps} steps each"
          + (f", each {args.repeat} times" if args.repeat > 1 else "")
          + (f", CollectCycles(every={args.collect})" if args.collect else "")
          + (", after break_tree_cycles()" if args.break_cycles else "") + "):")
    by_lever: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_lever.setdefault(r["lever"], []).append(r)
    for lever, runs in by_lever.items():
        at, above = runs[:args.repeat], runs[args.repeat:]
        print(f"  {lever}: batch {at[0]['size']} {_ran(at)}, batch {above[0]['size']} "
              f"{_ran(above)}: {_verdict(at, above)}{_figures(at)}")
    return results


def _ran(runs: list[dict[str, Any]]) -> str:
    """`ran=True` for one job; `ran 2 of 3` for several."""
    if len(runs) == 1:
        return f"ran={runs[0]['ran']}"
    return f"ran {sum(r['ran'] is True for r in runs)} of {len(runs)}"


def _verdict(at: list[dict[str, Any]], above: list[dict[str, Any]]) -> str:
    """Right: every job at the answer ran and none above it did."""
    if any(r["ran"] is None for r in at + above):
        return "no result"
    if any(r.get("device_full") for r in at + above):
        return "no result (a job found the device full: other processes held it)"
    ran_at = sum(r["ran"] for r in at)
    ran_above = sum(r["ran"] for r in above)
    if ran_at == 0:
        return "ABOVE the limit"
    if ran_at < len(at):
        return f"at the edge (the answer ran {ran_at} of {len(at)} times)"
    if ran_above == len(above):
        return "more than 3% low"
    if ran_above:
        return (f"right, at the edge (the size above ran {ran_above} of "
                f"{len(above)} times)")
    return "right"


def _figures(at: list[dict[str, Any]]) -> str:
    """The first job at the answer that ran: its time a sample and peak."""
    from keras_memwatch.units import format_bytes

    ran = next((r for r in at if r["ran"]), {})
    text = (f", {ran['seconds_per_sample'] * 1e3:.3f} ms a sample"
            if ran.get("seconds_per_sample") else "")
    if ran.get("peak_bytes"):
        text += f", peak {format_bytes(ran['peak_bytes'])} alone"
    return text


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="ways_check")
    parser.add_argument("command", nargs="?", default="measure",
                        choices=("measure", "trial"))
    parser.add_argument("model", help="a name from benchmarks.models (gpt2, resconv, ...)")
    parser.add_argument("--limit-mb", type=float, default=None,
                        help="cap the allocator at this many MiB (configure_memory)")
    parser.add_argument("--batch", type=int, default=None, help="the wanted batch")
    parser.add_argument("--samples", type=int, default=8,
                        help="samples in the sample batch (default: 8)")
    parser.add_argument("--headroom", type=float, default=0.0)
    parser.add_argument("--levers", default="all",
                        help="comma-separated lever names (default: all)")
    parser.add_argument("--no-combinations", action="store_true")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="ways_to_fit's time budget (default: none)")
    parser.add_argument("--compilation-cache", default=None, metavar="DIR",
                        help="JAX's persistent compilation cache, and each row's "
                             "record, in DIR (default: none)")
    parser.add_argument("--verify", action="store_true")
    parser.add_argument("--steps", type=int, default=30,
                        help="steps of each job (default: 30; on JAX the batches "
                             "`fit` holds ahead pile up over the first steps)")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1,
                        help="--verify: run each job this many times, each in a "
                             "new process (default: 1)")
    parser.add_argument("--collect", type=int, default=0,
                        help="jobs with CollectCycles(every=N) (default: 0, none)")
    parser.add_argument("--break-cycles", action="store_true",
                        help="the table and its jobs after "
                             "keras_memwatch.break_tree_cycles()")
    parser.add_argument("--fresh-process", action="store_true",
                        help="ways_to_fit(fresh_process=True): checks as jobs")
    parser.add_argument("--size", type=int, default=None, help="trial: the batch")
    parser.add_argument("--setting", default="{}", help="trial: the row's setting")
    parser.add_argument("--json", default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    if args.command == "trial":
        print(json.dumps(trial(args.model, json.loads(args.setting), args.size,
                               args.limit_mb, args.steps, args.collect,
                               args.break_cycles)))
        return 0
    if args.batch is None:
        parser.error("--batch is required")
    if args.break_cycles:
        from keras_memwatch import break_tree_cycles

        break_tree_cycles()
    record = measure(args)
    if args.verify and not args.limit_mb:
        print("--verify needs --limit-mb: without a cap, the largest batch is the "
              "host's or the whole GPU's")
    elif args.verify:
        record["jobs"] = verify(record, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
