"""One backend's share of the suite, in a process of its own (the Keras
backend is fixed per process): `KERAS_BACKEND=jax python -m benchmarks.child
--parts overhead,peers,hook --out result.json`. `benchmarks.run` starts these.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from typing import Any

from benchmarks.common import log

# Sizes: (quick, cpu, gpu)
SIZES = {
    "overhead": {
        "quick": dict(reps=2, steps=4, epochs=2),
        "cpu": dict(reps=7, steps=60, epochs=6),
        "gpu": dict(reps=9, steps=200, epochs=6),
    },
    "hook": {
        "quick": dict(reps=2, steps=4, epochs=2),
        "cpu": dict(reps=4, steps=100, epochs=3),
        "gpu": dict(reps=4, steps=300, epochs=3),
    },
    "spikes": {"quick": dict(batches=16), "cpu": dict(), "gpu": dict()},
    "scale": {
        "quick": dict(samples=20_000, csv_samples=5_000, ring=5_000,
                      detector_n=5_000, repeats=1),
        "cpu": dict(samples=1_000_000, csv_samples=200_000, ring=100_000,
                    detector_n=200_000, repeats=3),
    },
}


def device_of_backend() -> tuple[bool, str]:
    """(on a GPU?, what Keras computes on) for the active backend."""
    import keras

    backend = keras.backend.backend()
    try:
        if backend == "jax":
            import jax

            devices = jax.devices()
            gpu = any(str(d.platform).lower() in ("gpu", "cuda", "rocm")
                      for d in devices)
            return gpu, str(devices[0].device_kind if gpu else devices[0].platform)
        if backend == "torch":
            import torch

            if torch.cuda.is_available():
                return True, torch.cuda.get_device_name(0)
            return False, "cpu"
        if backend == "tensorflow":
            import tensorflow as tf

            gpus = tf.config.list_physical_devices("GPU")
            return bool(gpus), "GPU" if gpus else "cpu"
    except Exception:
        pass
    return False, "cpu"


def _sizes(part: str, quick: bool, gpu: bool) -> dict[str, Any]:
    table = SIZES[part]
    if quick:
        return dict(table["quick"])
    return dict(table["gpu" if gpu and "gpu" in table else "cpu"])


def run_parts(parts: list[str], quick: bool, models: list[str],
              overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Runs the parts in this process, under the active backend."""
    overrides = overrides or {}
    out: dict[str, Any] = {}
    if parts == ["scale"]:
        from benchmarks.scale import run_scale

        out["scale"] = run_scale(**{**_sizes("scale", quick, False),
                                    **overrides.get("scale", {})})
        return out

    import keras

    from benchmarks import arms as A

    logging.getLogger("keras_memwatch").setLevel(logging.ERROR)
    threads = os.environ.get("BENCH_THREADS")
    if threads and keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(int(threads))
    gpu, device = device_of_backend()
    out.update(backend=keras.backend.backend(), gpu=gpu, device=device)
    if "overhead" in parts or "peers" in parts or "ablation" in parts:
        from benchmarks.overhead import run_overhead

        available = A.available_arms(gpu)
        wanted = ["none", "none_b", "noop", "reads", "memwatch", "memwatch_n10"]
        if "ablation" in parts:
            wanted += list(A.ABLATIONS)
        if "peers" in parts:
            wanted += ["sync", "nvidia_smi", "memory_stats", "stormlog"]
        only = overrides.get("overhead", {}).get("arms")
        if only:  # a subset, for many rounds of a few arms
            wanted = [a for a in wanted if a in only or a == "none"]
        arm_names = [a for a in wanted if available[a] is None]
        out["skipped_arms"] = {a: available[a] for a in wanted
                               if available[a] is not None}
        size = {**_sizes("overhead", quick, gpu), **overrides.get("overhead", {})}
        size.pop("arms", None)
        out["overhead"] = {}
        for model in models:
            log(f"[{out['backend']}] overhead, {model}: {size}")
            out["overhead"][model] = run_overhead(model, arm_names, gpu, **size)
    if "hook" in parts:
        from benchmarks.hook import run_hook_cost

        size = {**_sizes("hook", quick, gpu), **overrides.get("hook", {})}
        log(f"[{out['backend']}] hook cost: {size}")
        out["hook"] = run_hook_cost(gpu, **size)
    if "spikes" in parts:
        from benchmarks.spikes import run_spike_scenario

        size = {**_sizes("spikes", quick, gpu), **overrides.get("spikes", {})}
        log(f"[{out['backend']}] spike scenario: {size}")
        out["spikes"] = run_spike_scenario(gpu, **size)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", required=True)
    parser.add_argument("--models", default="mlp,convnet")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--overrides", default="{}",
                        help="JSON: {part: {size: value}}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    try:
        result = run_parts(parts, args.quick, args.models.split(","),
                           json.loads(args.overrides))
        result["status"] = "ok"
    except Exception as e:
        result = {"status": "error", "error": f"{type(e).__name__}: {e}",
                  "traceback": traceback.format_exc()}
        log(result["traceback"])
    result["env"] = {k: os.environ.get(k) for k in (
        "KERAS_BACKEND", "TF_ENABLE_ONEDNN_OPTS", "CUDA_VISIBLE_DEVICES",
        "BENCH_THREADS", "OMP_NUM_THREADS",
        "XLA_PYTHON_CLIENT_PREALLOCATE") if os.environ.get(k) is not None}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
