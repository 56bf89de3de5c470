"""How long a JAX estimate takes against one compilation of `fit`'s step, and
what JAX's persistent compilation cache saves (issue 45).

For one model under a cap, each part in a new process:

1. `cold`: `estimate_max_batch_size(..., compilation_cache=DIR)` on an empty
   DIR, timed;
2. `warm`: the same estimate again, DIR now full (the target: 20 s for GPT-2);
3. `fit`: a new process trains at the answer and times its first step
   (compilation or cache load, and the step), with DIR and without a cache;
   without, XLA's compilation of `fit`'s step there (JAX's own
   `backend_compile` duration) is the one compilation the cold estimate
   is set against (the target: at most 2.5 of it).

Each part prints its line as it ends, then a table and one JSON line:

    KERAS_BACKEND=jax python3 -m benchmarks.gpu.capacity_speed gpt2 --limit-mb 8192
    KERAS_BACKEND=jax python3 -m benchmarks.gpu.capacity_speed gpt2_tiny --limit-mb 0 \
        --fit-size 8 --method xla  # the CPU: XLA's plans, and the stored record

Models: `benchmarks.models` (`gpt2`: keras-hub GPT-2 base, sequence 256,
AdamW). `--skip-uncached-fit` leaves out the longest part.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from typing import Any, Optional

from benchmarks.gpu.children import json_child


def _setup(limit_mb: float, cache: Optional[str]) -> None:
    if cache is None:
        os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    from keras_memwatch import configure_memory

    if limit_mb > 0:
        configure_memory(memory_limit_mb=limit_mb)


def cold(name: str, limit_mb: float, cache: str, headroom: float,
         max_seconds: Optional[float], method: str = "auto") -> dict[str, Any]:
    """The estimate, then one compilation as `fit` compiles it at the answer."""
    _setup(limit_mb, cache)
    from benchmarks.models import build, data
    from keras_memwatch import estimate_max_batch_size

    model = build(name)
    x, y = data(name, 8)
    began = time.perf_counter()
    est = estimate_max_batch_size(model, x, y, headroom=headroom,
                                  compilation_cache=cache, max_seconds=max_seconds,
                                  verbose=2, method=method,
                                  progress=functools.partial(print, flush=True))
    return _answers(est, time.perf_counter() - began)


def warm(name: str, limit_mb: float, cache: str, headroom: float,
         method: str = "auto") -> dict[str, Any]:
    _setup(limit_mb, cache)
    from benchmarks.models import build, data
    from keras_memwatch import estimate_max_batch_size

    model = build(name)
    x, y = data(name, 8)
    began = time.perf_counter()
    est = estimate_max_batch_size(model, x, y, headroom=headroom,
                                  compilation_cache=cache, verbose=2, method=method)
    return _answers(est, time.perf_counter() - began)


def first_step(name: str, limit_mb: float, cache: Optional[str], size: int
               ) -> dict[str, Any]:
    """`fit` at `size` in this (new) process: seconds to its first batch
    end, and the longest of XLA's compilations in it."""
    _setup(limit_mb, cache)
    import jax
    import keras

    from benchmarks.models import build, data
    from keras_memwatch.measure.batches import repeated
    from keras_memwatch.configure.compilation_cache import use_compilation_cache

    if cache is not None:
        use_compilation_cache(cache)
    else:
        jax.config.update("jax_enable_compilation_cache", False)
    compiles: list[float] = []

    def compiled(event: str, seconds: float, **_: Any) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(compiled)
    model = build(name)
    x, y = data(name, size)
    times: dict[str, float] = {}

    class Clock(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            times["begin"] = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                float(logs["loss"])  # waits for the step
                times["first"] = time.perf_counter()

    keras.Model.fit(model, repeated(x, y, 3), epochs=1, verbose=0, callbacks=[Clock()])
    return {"cache": cache is not None, "size": size,
            "first_step_s": round(times["first"] - times["begin"], 1),
            "compile_s": round(max(compiles, default=0.0), 1)}


def _answers(est: Any, seconds: float) -> dict[str, Any]:
    return {"seconds": round(seconds, 1), "answer": est.predicted_batch_size,
            "ceiling": est.ceiling_batch_size,
            "full_speed": est.full_speed_batch_size_for(0.0),
            "left_open": {str(h): why for h, why in est.left_open.items()},
            "rounds": _rounds(est)}


def _rounds(est: Any) -> list[str]:
    """Each observation, in order: size, how, seconds."""
    return [f"{o.batch_size}:{o.how}{' (ladder)' if o.ladder else ''}:{o.seconds:.1f}s"
            for o in est.evidence.observations]


def _child(part: str, args: list[str], timeout: float) -> Optional[dict[str, Any]]:
    """One part in a new process, its rounds shown as they end; its JSON."""
    began = time.perf_counter()
    result = json_child("benchmarks.gpu.capacity_speed", [*args, "--part", part],
                        timeout, label=part,
                        shown=lambda line: line.startswith("estimate_max_batch_size:"))
    if result is not None:
        print(f"  [{part}, {time.perf_counter() - began:.0f} s in all] "
              f"{json.dumps(result)}", flush=True)
    return result


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--limit-mb", type=float, default=8192,
                        help="cap set with configure_memory (0: none)")
    parser.add_argument("--headroom", type=float, default=0.1)
    parser.add_argument("--max-seconds", type=float, default=None)
    parser.add_argument("--cache", default=None,
                        help="the cache directory (default: a new temporary one)")
    parser.add_argument("--skip-uncached-fit", action="store_true")
    parser.add_argument("--method", default="auto",
                        help="the estimate's method (`xla` shows XLA's plans on the CPU)")
    parser.add_argument("--fit-size", type=int, default=0,
                        help="train this batch instead of the answer (on the CPU, "
                             "where the answer is the host's)")
    parser.add_argument("--part", choices=("cold", "warm", "fit"), default=None,
                        help=argparse.SUPPRESS)  # a child's part
    parser.add_argument("--size", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--no-cache", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part == "cold":
        print(json.dumps(cold(args.model, args.limit_mb, args.cache, args.headroom,
                              args.max_seconds, args.method)), flush=True)
        return 0
    if args.part == "warm":
        print(json.dumps(warm(args.model, args.limit_mb, args.cache, args.headroom,
                              args.method)), flush=True)
        return 0
    if args.part == "fit":
        print(json.dumps(first_step(args.model, args.limit_mb,
                                    None if args.no_cache else args.cache,
                                    args.size)), flush=True)
        return 0
    cache = args.cache or tempfile.mkdtemp(prefix="keras_memwatch_jax_cache_")
    common = [args.model, "--limit-mb", str(args.limit_mb), "--cache", cache,
              "--headroom", str(args.headroom), "--method", args.method]
    if args.max_seconds:
        common += ["--max-seconds", str(args.max_seconds)]
    results: dict[str, Any] = {"model": args.model, "limit_mb": args.limit_mb,
                               "cache": cache}
    results["cold"] = _child("cold", common, 600)
    if results["cold"] is None or not results["cold"].get("answer"):
        print(json.dumps(results))
        return 1
    results["warm"] = _child("warm", common, 300)
    size = str(args.fit_size or results["cold"]["answer"])
    results["fit_cached"] = _child("fit", [*common, "--size", size], 300)
    if not args.skip_uncached_fit:
        results["fit_uncached"] = _child("fit", [*common, "--size", size,
                                                 "--no-cache"], 300)
        compile_s = (results["fit_uncached"] or {}).get("compile_s")
        if compile_s:
            results["ratio"] = round(results["cold"]["seconds"] / compile_s, 2)
    print(table(results), flush=True)
    print(json.dumps(results), flush=True)
    return 0


def table(r: dict[str, Any]) -> str:
    def get(part: str, key: str) -> Any:
        return (r.get(part) or {}).get(key, "-")

    return "\n".join([
        f"model {r['model']}, cap {r['limit_mb']:.0f} MiB",
        f"  cold estimate      {get('cold', 'seconds')} s  (answer {get('cold', 'answer')},"
        f" ceiling {get('cold', 'ceiling')})",
        f"  one fit compile    {get('fit_uncached', 'compile_s')} s at batch "
        f"{get('fit_uncached', 'size')} (a new process, no cache)",
        f"  ratio              {r.get('ratio', '-')}  (target <= 2.5)",
        f"  warm estimate      {get('warm', 'seconds')} s  (answer {get('warm', 'answer')})",
        f"  fit's first step   {get('fit_cached', 'first_step_s')} s with the cache, "
        f"{get('fit_uncached', 'first_step_s')} s without",
    ])


if __name__ == "__main__":
    sys.exit(main())
