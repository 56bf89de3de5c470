"""Checks `estimate_max_batch_size` against jobs that really train, on a GPU.

For each model, under a cap set with `configure_memory(memory_limit_mb=...)`:

1. the estimate, alone, in a new process (timed);
2. jobs in new processes, side by side (the cap is per process): the answer
   under 10% headroom, the ceiling (`batch_size_for(0)`), and sizes 1 and
   3% above the ceiling, each `--epochs` epochs of `--steps` steps
   of `fit`'s own step; on JAX also the largest batch at full speed where
   XLA recomputes above it, with the time per sample of both;
3. a table, and JSON (`--json PATH`).

    KERAS_BACKEND=jax python -m benchmarks.gpu.capacity_check verify gpt2@8192 \\
        resconv@6144 --json out/jax.json

`estimate MODEL` and `trial MODEL N` run one piece (each prints one JSON
line); `verify` runs them as children. Models: `benchmarks.models`.
`estimate MODEL --checks-side-by-side` compiles a convnet's checks side by
side, as before they compiled one at a time (2026-12-07), to compare.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import time
from typing import Any, Optional

from benchmarks.gpu.children import json_child

MIB = 2**20
ABOVE = (0.03,)  # above the ceiling, jobs try +1 and these


def _setup(limit_mb: float) -> None:
    from keras_memwatch import configure_memory

    configure_memory(memory_limit_mb=limit_mb)


def estimate(name: str, limit_mb: float, headroom: float) -> dict[str, Any]:
    """One estimate of `name`, with every answer it gives."""
    _setup(limit_mb)
    from benchmarks.models import build, data
    from keras_memwatch import estimate_max_batch_size

    model = build(name)
    x, y = data(name, 8)
    began = time.perf_counter()
    est = estimate_max_batch_size(model, x, y, headroom=headroom, progress=print)
    seconds = time.perf_counter() - began
    return {"model": name, "seconds": round(seconds, 1),
            "answers": {str(h): est.batch_size_for(h) for h in (0.0, 0.05, 0.1, 0.2)},
            "line": est.line_batch_size_for(headroom),
            "recomputes_from": est.recomputes_from,
            "full_speed": est.full_speed_batch_size_for(0.0),
            "explanation": est.explanation,
            "observations": [[o.batch_size, o.need_bytes, o.how, o.ran, o.seconds]
                             for o in est.evidence.observations]}


def trial(name: str, size: int, limit_mb: float, steps: int,
          epochs: int) -> dict[str, Any]:
    """A job of `size` in this (new) process: ran or ran out of memory."""
    _setup(limit_mb)
    import keras

    from benchmarks.models import build, data
    from keras_memwatch.measure.batches import repeated
    from keras_memwatch.oom_errors import is_oom_error

    model = build(name)
    x, y = data(name, size)
    times: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.began = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            float(logs.get("loss", 0.0))  # waits for the epoch's steps
            times.append(time.perf_counter() - self.began)

    try:
        keras.Model.fit(model, repeated(x, y, steps), epochs=epochs, verbose=0,
                        callbacks=[Clock()])
    except Exception as e:
        if not is_oom_error(e):
            raise
        return {"model": name, "size": size, "result": "oom"}
    step = min(times[1:] or times) / steps
    return {"model": name, "size": size, "result": "ran",
            "step_ms": round(1000 * step, 2),
            "us_per_sample": round(1e6 * step / size, 1)}


def _child(args: list[str]) -> Optional[dict[str, Any]]:
    """One piece in a new process; an estimate's rounds shown as they end."""
    return json_child("benchmarks.gpu.capacity_check", args, 900,
                      label=" ".join(args[:3]),
                      shown=lambda line: line.startswith("estimate_max_batch_size:"))


def verify(names: list[str], limit_mb: float, headroom: float, steps: int,
           epochs: int, parallel: int) -> list[dict[str, Any]]:
    """Each estimate alone, then every model's jobs side by side."""
    results = []
    for spec in names:
        name, _, mb = spec.partition("@")  # `gpt2@8192`: a model's own cap
        common = ["--limit-mb", mb or str(limit_mb)]
        est = _child(["estimate", name, "--headroom", str(headroom), *common])
        print(json.dumps(est), flush=True)
        results.append({"model": name, "estimate": est, "trials": {},
                        "limit": common})
    jobs = []
    for r in results:
        est = r["estimate"]
        if not est or est["answers"]["0.0"] is None:
            continue
        ceiling = est["answers"]["0.0"]
        sizes = {est["answers"][str(headroom)], ceiling, est["full_speed"]}
        sizes |= {ceiling + 1} | {ceiling + max(1, int(ceiling * a)) for a in ABOVE}
        jobs += [(r, b) for b in sorted(s for s in sizes if s)]
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        futures = {pool.submit(_child, ["trial", r["model"], str(b), *r["limit"],
                                        "--steps", str(steps), "--epochs",
                                        str(epochs)]): (r, b) for r, b in jobs}
        for future in concurrent.futures.as_completed(futures):
            r, b = futures[future]
            r["trials"][b] = future.result()
    return results


def table(results: list[dict[str, Any]], headroom: float) -> str:
    lines = ["model      secs  h=0.1 (job)    ceiling (job)  largest ran  first oom  "
             "ceiling vs largest"]
    for r in results:
        est, trials = r["estimate"], r["trials"]
        if not est:
            lines.append(f"{r['model']:<10} estimate failed")
            continue
        ran = [b for b, t in trials.items() if t and t["result"] == "ran"]
        oom = [b for b, t in trials.items() if t and t["result"] == "oom"]
        largest, first = max(ran, default=None), min(oom, default=None)

        def job(b):
            t = trials.get(b)
            return t["result"] if t else "-"
        rec, ceiling = est["answers"][str(headroom)], est["answers"]["0.0"]
        gap = (f"{(ceiling - largest) / largest:+.1%}" if ceiling and largest
               else "-")
        lines.append(f"{r['model']:<10} {est['seconds']:>5}  {rec!s:>5} ({job(rec):<3})"
                     f"    {ceiling!s:>5} ({job(ceiling):<3})  {largest!s:>11}  "
                     f"{first!s:>9}  {gap}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("estimate", "trial", "verify"))
    parser.add_argument("model", nargs="+")
    parser.add_argument("--limit-mb", type=float, default=6144)
    parser.add_argument("--headroom", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=6)
    parser.add_argument("--json", default=None, metavar="PATH")
    parser.add_argument("--checks-side-by-side", action="store_true")
    args = parser.parse_args(argv)
    if args.checks_side_by_side:
        from keras_memwatch.capacity import xla

        xla.mostly_convolutions = lambda program: False
    if args.command == "estimate":
        print(json.dumps(estimate(args.model[0], args.limit_mb, args.headroom)))
    elif args.command == "trial":
        name, size = args.model
        print(json.dumps(trial(name, int(size), args.limit_mb, args.steps,
                               args.epochs)))
    else:
        results = verify(args.model, args.limit_mb, args.headroom, args.steps,
                         args.epochs, args.parallel)
        print(table(results, args.headroom), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
