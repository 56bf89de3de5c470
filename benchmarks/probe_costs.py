"""Times each probe's `read()`, and the raw framework calls it stands for.

Usage:
    python benchmarks/probe_costs.py [--iters 2000] [--repeat 5]
        [--probes torch,jax,tensorflow,nvml] [--json results.json]

Each probe is measured in its own Python process, so TensorFlow, JAX and
PyTorch never share a GPU (the children set TF_FORCE_GPU_ALLOW_GROWTH=true
and XLA_PYTHON_CLIENT_PREALLOCATE=false). A probe whose `start()` raises
`ProbeUnavailable` is listed as skipped, with the reason. Times are
microseconds per call: the median and the best of `--repeat` runs of
`--iters` calls each, after one warm-up call. `read()` covers every device
the probe found; the raw calls are for device 0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROBES = ("torch", "jax", "tensorflow", "nvml")
MiB = 1 << 20


# ---------------------------------------------------------------- child side


def _time(fn: Callable[[], Any], iters: int, repeat: int) -> tuple[float, float]:
    """Median and best microseconds per call."""
    fn()
    runs = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        for _ in range(iters):
            fn()
        runs.append((time.perf_counter_ns() - start) / iters / 1000.0)
    return statistics.median(runs), min(runs)


class _Rows:
    def __init__(self, iters: int, repeat: int) -> None:
        self.iters, self.repeat = iters, repeat
        self.rows: list[dict[str, Any]] = []

    def add(self, call: str, fn: Optional[Callable[[], Any]], note: str = "") -> None:
        if fn is None:
            self.rows.append({"call": call, "error": "not available here"})
            return
        try:
            median, best = _time(fn, self.iters, self.repeat)
        except Exception as e:  # keep measuring the rest
            self.rows.append({"call": call, "error": f"{type(e).__name__}: {e}"})
            return
        self.rows.append({"call": call, "us": median, "best_us": best, "note": note})


def _torch_calls(rows: _Rows, probe: Any) -> dict[str, Any]:
    import torch

    from keras_memwatch.record.probes.torch import TorchProbe

    # Give the allocator something to count, in both pools.
    keep = []
    for i in range(torch.cuda.device_count()):
        keep.append(torch.empty(256 * MiB, dtype=torch.uint8, device=f"cuda:{i}"))
        keep.extend(torch.ones(1000, device=f"cuda:{i}") for _ in range(16))
    torch.cuda.synchronize()
    cuda, c = torch.cuda, torch._C

    rows.add(f"TorchProbe.read()  [{probe.path}]", probe.read)
    public = TorchProbe(use_private_bindings=False)
    public.start()
    rows.add(f"TorchProbe.read()  [{public.path}]", public.read)

    def public_trio() -> None:
        cuda.memory_allocated(0)
        cuda.max_memory_allocated(0)
        cuda.reset_peak_memory_stats(0)

    rows.add("public trio: memory_allocated + max_memory_allocated + "
             "reset_peak_memory_stats (dev 0)", public_trio,
             "what read() replaces, per device")
    rows.add("torch.cuda.memory_allocated(0)", lambda: cuda.memory_allocated(0))
    rows.add("torch.cuda.max_memory_allocated(0)",
             lambda: cuda.max_memory_allocated(0))
    rows.add("torch.cuda.memory_reserved(0)", lambda: cuda.memory_reserved(0))
    rows.add("torch.cuda.reset_peak_memory_stats(0)",
             lambda: cuda.reset_peak_memory_stats(0))
    rows.add("torch.cuda.memory_stats(0)", lambda: cuda.memory_stats(0))
    rows.add("torch.cuda.memory_stats_as_nested_dict(0)",
             lambda: cuda.memory_stats_as_nested_dict(0))
    stats = getattr(c, "_cuda_memoryStats", None)
    reset = getattr(c, "_cuda_resetPeakMemoryStats", None)
    rows.add("torch._C._cuda_memoryStats(0)", stats and (lambda: stats(0)))
    rows.add("torch._C._cuda_resetPeakMemoryStats(0)", reset and (lambda: reset(0)))
    acc = getattr(c, "_accelerator_getDeviceStats", None)
    rows.add("torch._C._accelerator_getDeviceStats(0)", acc and (lambda: acc(0)))
    probe._keep = keep
    return {"torch": torch.__version__, "cuda": torch.version.cuda}


def _jax_calls(rows: _Rows, probe: Any) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    gpus = [d for d in jax.local_devices() if d.platform != "cpu"]
    keep = [jax.device_put(jnp.ones((64 * MiB,), jnp.uint8), d) for d in gpus]
    for x in keep:
        x.block_until_ready()
    rows.add("JaxProbe.read()", probe.read)
    rows.add("device.memory_stats() (dev 0)", gpus[0].memory_stats)
    probe._keep = keep
    return {"jax": jax.__version__}


def _tensorflow_calls(rows: _Rows, probe: Any) -> dict[str, Any]:
    import tensorflow as tf

    with tf.device("GPU:0"):
        keep = tf.ones((64 * MiB,), tf.uint8)
    rows.add("TensorFlowProbe.read()", probe.read)
    get = tf.config.experimental.get_memory_info
    reset = tf.config.experimental.reset_memory_stats
    rows.add("tf.config.experimental.get_memory_info('GPU:0')", lambda: get("GPU:0"))
    rows.add("tf.config.experimental.reset_memory_stats('GPU:0')",
             lambda: reset("GPU:0"))
    try:
        from tensorflow.python import pywrap_tfe
        from tensorflow.python.eager import context

        handle = context.context()._context_handle
        raw = pywrap_tfe.TFE_GetMemoryInfo
        rows.add("pywrap_tfe.TFE_GetMemoryInfo(handle, 'GPU:0') (private)",
                 lambda: raw(handle, "GPU:0"))
    except Exception as e:
        rows.rows.append({"call": "pywrap_tfe.TFE_GetMemoryInfo", "error": repr(e)})
    probe._keep = keep
    return {"tensorflow": tf.__version__}


def _nvml_calls(rows: _Rows, probe: Any) -> dict[str, Any]:
    import pynvml

    from keras_memwatch.record.probes.nvml import NvmlProbe

    info: dict[str, Any] = {"nvidia-ml-py": getattr(pynvml, "__version__", "?")}
    try:  # a CUDA context of our own, so this process shows up in NVML's list
        import torch

        if torch.cuda.is_available():
            probe._keep = [torch.empty(64 * MiB, dtype=torch.uint8, device=f"cuda:{i}")
                           for i in range(torch.cuda.device_count())]
            info["own_context"] = "torch"
    except Exception:
        info["own_context"] = "none"
    try:
        info["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
        handle = probe._handles[0]
        info["gpu"] = str(pynvml.nvmlDeviceGetName(handle))
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        info["processes_on_gpu0"] = len(processes)
    except Exception as e:
        info["nvml_info_error"] = repr(e)
    handle = probe._handles[0]
    rows.add("NvmlProbe.read()  [memory + processes]", probe.read)
    light = NvmlProbe(process_memory=False)
    light.start()
    rows.add("NvmlProbe(process_memory=False).read()", light.read)
    memory_info = pynvml.nvmlDeviceGetMemoryInfo
    rows.add("nvmlDeviceGetMemoryInfo(h0)", lambda: memory_info(handle))
    for name in ("nvmlDeviceGetComputeRunningProcesses",
                 "nvmlDeviceGetComputeRunningProcesses_v3",
                 "nvmlDeviceGetComputeRunningProcesses_v2"):
        fn = getattr(pynvml, name, None)
        rows.add(f"{name}(h0)", fn and (lambda fn=fn: fn(handle)))
    probe._light = light
    return info


def child(name: str, iters: int, repeat: int) -> dict[str, Any]:
    from keras_memwatch.record.probes import ProbeUnavailable, make_probe

    result: dict[str, Any] = {"probe": name, "rows": []}
    probe = make_probe(name)
    try:
        devices = probe.start()
    except ProbeUnavailable as e:
        result.update(status="skipped", reason=str(e))
        return result
    result["devices"] = list(devices)
    rows = _Rows(iters, repeat)
    try:
        calls = {"torch": _torch_calls, "jax": _jax_calls,
                 "tensorflow": _tensorflow_calls, "nvml": _nvml_calls}[name]
        result["versions"] = calls(rows, probe)
        result["sample"] = [list(r) for r in probe.read()]
        result["columns"] = list(probe.columns)
        result["describe"] = probe.describe()
        result["status"] = "ok"
    except Exception as e:
        result.update(status="error", reason=f"{type(e).__name__}: {e}",
                      traceback=traceback.format_exc())
    finally:
        result["rows"] = rows.rows
        probe.close()
    return result


# --------------------------------------------------------------- parent side


def run_child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name,
           "--iters", str(args.iters), "--repeat", str(args.repeat)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=args.timeout, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return {"probe": name, "status": "error", "rows": [],
                "reason": f"timed out after {args.timeout} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {"probe": name, "status": "error", "rows": [],
            "reason": f"exit {proc.returncode}: " + " | ".join(tail)}


def _mib(value: Any) -> str:
    return "-" if value is None else f"{value / MiB:,.1f}"


def print_report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"probe read() costs  (python {platform.python_version()}, "
          f"{args.iters} calls x {args.repeat} runs, us per call)")
    print()
    width = max([len(r["call"]) for res in results for r in res["rows"]] + [40])
    header = f"{'probe':<11} {'call':<{width}} {'median':>9} {'best':>9}"
    print(header)
    print("-" * len(header))
    for res in results:
        name = res["probe"]
        if res["status"] == "skipped":
            print(f"{name:<11} skipped: {res['reason']}")
            continue
        if res["status"] == "error" and not res["rows"]:
            print(f"{name:<11} error: {res['reason']}")
            continue
        for row in res["rows"]:
            if "error" in row:
                print(f"{name:<11} {row['call']:<{width}} {'n/a':>9} {'':>9}  "
                      f"{row['error']}")
            else:
                print(f"{name:<11} {row['call']:<{width}} {row['us']:>9.2f} "
                      f"{row['best_us']:>9.2f}")
        if res["status"] == "error":
            print(f"{name:<11} error: {res['reason']}")
        print()
    print("devices, sample readings (MiB) and notes:")
    for res in results:
        if res["status"] != "ok":
            continue
        print(f"  {res['probe']}: {', '.join(res['devices'])}; "
              f"versions {res.get('versions')}")
        for device, reading in zip(res["devices"], res["sample"]):
            values = ", ".join(
                f"{c}={_mib(v)}" for c, v in zip(res["columns"], reading)
            )
            print(f"    {device}: {values}")
        print(f"    {res['describe']}")
    torch_res = next((r for r in results if r["probe"] == "torch"
                      and r["status"] == "ok"), None)
    if torch_res:
        rows = {r["call"]: r.get("us") for r in torch_res["rows"]}
        fast = next(
            (v for k, v in rows.items() if k.startswith("TorchProbe.read()")), None
        )
        trio = next(
            (v for k, v in rows.items() if k.startswith("public trio")), None
        )
        if fast and trio:
            per_device = fast / max(1, len(torch_res["devices"]))
            print(f"\ntorch: read() costs {per_device:.2f} us per device against "
                  f"{trio:.2f} us for the public calls it replaces "
                  f"({trio / per_device:.1f}x).")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--probes", default=",".join(PROBES))
    parser.add_argument("--timeout", type=int, default=300,
                        help="seconds allowed per probe process")
    parser.add_argument("--json", help="also write all results to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        print(json.dumps(child(args.child, args.iters, args.repeat)))
        return 0

    names = [n.strip() for n in args.probes.split(",") if n.strip()]
    unknown = sorted(set(names) - set(PROBES))
    if unknown:
        parser.error(f"unknown probes {unknown}; choose among {list(PROBES)}")
    results = [run_child(name, args) for name in names]
    print_report(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
