"""What every part of the suite shares: machine and version facts, summary
statistics, timers and the small callbacks that time a fit."""

from __future__ import annotations

import datetime
import importlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, Optional

MIB = 2**20


# -- facts printed with the results ---------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    """GPU names through NVML (no CUDA context is created); [] without."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        names = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else str(name))
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            driver = driver.decode() if isinstance(driver, bytes) else str(driver)
            names = [f"{n} (driver {driver})" for n in names]
        except Exception:
            pass
        return names
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def package_version(name: str) -> Optional[str]:
    """The installed version of a distribution, without importing it."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    for dist in (name, name.replace("_", "-")):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def machine_info() -> dict[str, Any]:
    versions = {}
    for name in ("keras", "numpy", "pandas", "tensorflow", "tensorflow-cpu",
                 "jax", "jaxlib", "torch", "nvidia-ml-py", "stormlog",
                 "keras-memwatch"):
        v = package_version(name)
        if v is not None:
            versions[name] = v
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_avg": [round(x, 2) for x in load] if load else None,
        "gpus": gpu_names(),
        "nvidia_smi": shutil.which("nvidia-smi") is not None,
        "python": platform.python_version(),
        "versions": versions,
        "git": git_describe(),
    }


def git_describe() -> Optional[str]:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10,
                             cwd=os.path.dirname(os.path.dirname(__file__)))
        return out.stdout.strip() or None
    except Exception:
        return None


# -- statistics ------------------------------------------------------------


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and count of a list of numbers."""
    values = [float(v) for v in values]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


# -- timers ----------------------------------------------------------------

thread_ns = time.thread_time_ns


def timer_overhead_ns(n: int = 20000) -> float:
    """Thread CPU time that one empty timed region costs (two clock reads)."""
    best = float("inf")
    for _ in range(5):
        t = thread_ns()
        for _ in range(n):
            thread_ns()
            thread_ns()
        best = min(best, (thread_ns() - t) / n)
    # One region costs two reads, but only the time between them is charged
    # to it: about one read.
    return best / 2


def import_keras():
    """Keras, with the backend chosen by KERAS_BACKEND (set before import)."""
    return importlib.import_module("keras")


def epoch_timer_class():
    """A callback with epoch hooks only (they never force a per-batch sync)
    that records the wall time of each epoch."""
    keras = import_keras()

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs: list[float] = []
            self._t = 0.0

        def on_epoch_begin(self, epoch, logs=None):
            self._t = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append(time.perf_counter() - self._t)

    return EpochTimer


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
