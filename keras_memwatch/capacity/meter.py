"""A training step's working memory on one device, and the device's limit.

How each method measures is described in `keras_memwatch.capacity`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable, Optional

from keras_memwatch import columns as C
from keras_memwatch.capacity import collector, xla_compile
from keras_memwatch.capacity.allocator import STEPS_PER_SIZE, TorchCache, torch_cache
from keras_memwatch.capacity.host_memory import host_available_bytes
from keras_memwatch.capacity.result import LIMIT_ALLOCATOR, LIMIT_HOST, LIMIT_NVML
from keras_memwatch.judge.derived import device_limit
from keras_memwatch.configure.devices import device_label
from keras_memwatch.units import format_bytes

logger = logging.getLogger("keras_memwatch")

HOST = C.HOST_DEVICE
METHODS = ("auto", "probes", "xla", "reserved")
#: What the working memory is read from, in words, by `Meter.words`.
METHOD_WORDS = {
    "xla": "XLA memory plan of the compiled train step",
    "reserved": "PyTorch reserved-memory peak",
    "probes": "allocator peak per step",
    "probes-host": "host peak RSS",
    "probes-hwm": "allocator high-water mark",
}


def trim_host_heap() -> None:
    """Hands freed glibc heap memory back to the system (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except Exception:
        pass


class Meter:
    """Measures the working memory of a step on one device.

    Args:
        backend: the Keras backend.
        device: `"GPU:<i>"` or `"host"`, or `None` for the first GPU the
            backend computes on, else the host.
        method: one of `METHODS`.

    Raises:
        ValueError: for a device the backend does not compute on, or a
            method the backend or device does not offer.
        RuntimeError: when no probe reports the device.
    """

    def __init__(self, backend: str, device: Optional[str], method: str):
        from keras_memwatch.record.probes import resolve_probes
        from keras_memwatch.record.sampler import Sampler

        self.backend = backend
        wanted = None if device is None else device_label(device, "device")
        self.probes = resolve_probes("auto", backend)
        self.sampler = Sampler(self.probes)
        devices = self.sampler.start()
        try:
            self.device = self._pick_device(devices, wanted)
            self.index = devices.index(self.device)
            self.on_gpu = self.device != HOST
            self.automatic = method == "auto"
            self.method = self._pick_method(method)
        except Exception:
            self.sampler.close()
            raise
        backend_probe = backend if self.on_gpu else HOST
        peak_probes = [p for p in self.probes if p.name == backend_probe]
        self.peak_column = C.ALLOCATOR_PEAK if self.on_gpu else C.HOST_PEAK_RSS
        self.per_step = bool(peak_probes) and all(
            p.peak_per_sample for p in peak_probes)
        self.words = (self.method if self.method != "probes" else
                      "probes-host" if not self.on_gpu and self.per_step else
                      "probes" if self.per_step else "probes-hwm")
        self.gpu_index = int(self.device.split(":")[1]) if self.on_gpu else None
        self.baseline: Optional[int] = None
        self._mark: Optional[int] = None
        #: PyTorch's caching allocator of the device (its reserved peaks).
        self.cache: Optional[TorchCache] = torch_cache(backend, self.gpu_index)
        self.reserved_baseline: Optional[int] = None
        #: The reserved peak of the last step measured, above
        #: `reserved_baseline` (PyTorch on a GPU), else None.
        self.last_reserved: Optional[int] = None

    def _pick_device(self, devices: tuple[str, ...], wanted: Optional[str]) -> str:
        """The device asked for, or the first GPU, else the host."""
        gpus = [d for d in devices if d != HOST
                and C.ALLOCATOR_CURRENT in self.sampler.device_columns.get(d, ())]
        if wanted is None:
            device = gpus[0] if gpus else HOST
        else:
            device = wanted
            if device != HOST and device not in gpus:
                raise ValueError(
                    f"Expected `device` to be one the {self.backend} backend "
                    f"computes on: {gpus + [HOST] if HOST in devices else gpus}. "
                    f"Received: device={device!r}")
        if device not in devices:
            raise RuntimeError(f"no probe reports {device}: {self.sampler.notes}")
        return device

    def _pick_method(self, method: str) -> str:
        """`method`, with `"auto"` resolved, checked against the device."""
        backend = self.backend
        if method == "auto":
            return "xla" if backend == "jax" and self.on_gpu else "probes"
        if method == "xla" and backend != "jax":
            raise ValueError(
                f"Expected method='xla' only with the JAX backend. Received: "
                f"backend {backend!r}")
        if method == "reserved" and not (backend == "torch" and self.on_gpu
                                          and torch_cache(backend, 0) is not None):
            raise ValueError(
                "Expected method='reserved' only with the PyTorch backend on a GPU. "
                f"Received: backend {backend!r}, device {self.device!r}")
        return method

    def read(self) -> dict[str, Optional[int]]:
        """The device's row of a sample now (resets the resettable peaks)."""
        return self.sampler.sample()[self.index]

    _row = read

    def sync(self) -> None:
        """Waits for the device's queued work (PyTorch on a GPU)."""
        if self.cache is not None:
            self.cache.sync()

    _sync = sync

    def set_baseline(self) -> int:
        """Reads the memory in use now, which every later step is measured from."""
        if self.cache is not None:
            self.cache.free()
            self.reserved_baseline = self.cache.reserved()
        if self.method == "reserved":
            assert self.reserved_baseline is not None
            self.baseline = self.reserved_baseline
            return self.baseline
        if not self.on_gpu:
            trim_host_heap()
        current = self._row()["current_bytes"]
        if current is None:
            raise RuntimeError(
                f"no probe reports the memory in use on {self.device}: "
                f"{self.sampler.notes}")
        self.baseline = int(current)
        return self.baseline

    def begin_size(self) -> None:
        """Before the first step at a new size: remembers the high-water mark."""
        if not self.per_step and self.method in ("probes", "xla"):
            self._mark = self._row().get(self.peak_column)

    def measure(self, step: Callable[[], Any], model: Any,
                batch: tuple[Any, Any], size: int) -> Optional[int]:
        """Runs `step` and returns its working memory.

        Args:
            step: one training step on `batch`.
            model: the model `step` trains.
            batch: `(x, y)` of `size` samples.
            size: the batch size.

        Returns:
            The step's working memory in bytes, or `None` when an earlier,
            higher high-water mark hides it (or XLA's plan is unavailable).
        """
        assert self.baseline is not None
        if self.method == "xla":
            return self._plan(step, model, batch, size)
        if self.method == "reserved":
            return self._reserved_peak(step)
        if not self.on_gpu:
            trim_host_heap()
        if self.cache is not None:
            self.cache.free()
            self.cache.reset_peaks()
        self._row()  # resets the peaks that can be reset
        with collector.paused(collect=self.cache is None):  # free() collected
            for _ in range(STEPS_PER_SIZE if self.cache is not None else 1):
                step()
            self._sync()
        if self.cache is not None and self.reserved_baseline is not None:
            self.last_reserved = max(self.cache.peaks()[1] - self.reserved_baseline, 0)
        peak = self._row().get(self.peak_column)
        if peak is None:
            return None
        if not self.per_step and self._mark is not None and peak <= self._mark:
            return None  # an earlier, higher mark hides this size's peak
        return max(int(peak) - self.baseline, 0)

    def _plan(self, step: Callable[[], Any], model: Any, batch: tuple[Any, Any],
              size: int) -> Optional[int]:
        """Runs `step`, then reads XLA's memory plan of it."""
        step()
        try:
            # It aims the searches, as the ladder's other sizes do.
            return xla_compile.plan_one(model, batch, size, aim=True)
        except Exception as e:
            self.fall_back(e)
            return None

    def fall_back(self, error: Exception) -> None:
        """Measures with the probes from now on, where XLA's plan failed
        with `error` (Keras internals moved, or a distribution is set).

        Raises:
            error: where the method `"xla"` was asked for.
        """
        if not self.automatic:
            raise error
        logger.warning("XLA's memory plan of the train step is not "
                       "available (%r); measuring with the probes", error)
        self.method = "probes"
        self.words = "probes" if self.per_step else "probes-hwm"

    def _reserved_peak(self, step: Callable[[], Any]) -> int:
        """Runs `step` and returns PyTorch's reserved peak above the baseline."""
        assert self.baseline is not None and self.cache is not None
        self.cache.free()
        self.cache.reset_peaks()
        with collector.paused(collect=False):  # free() collected
            for _ in range(STEPS_PER_SIZE):
                step()
        self.last_reserved = max(self.cache.peaks()[1] - self.baseline, 0)
        return self.last_reserved

    def limit(self) -> tuple[Optional[int], str, str]:
        """`(bytes, source, detail)` of the device's limit.

        Returns:
            The limit in bytes (`None` when none is known), one of
            `LIMIT_ALLOCATOR`, `LIMIT_NVML`, `LIMIT_HOST` (or `""`), and
            where the limit comes from, in words.
        """
        if not self.on_gpu:
            available, where = host_available_bytes()
            if available is None:
                return None, "", where
            in_use = self.baseline or 0
            return (available + in_use, LIMIT_HOST,
                    f"{where} {format_bytes(available)} + this process's "
                    f"{format_bytes(in_use)} resident; a CPU has no allocator limit")
        limit, column = device_limit(self._row())
        if column == C.ALLOCATOR_LIMIT:
            return limit, LIMIT_ALLOCATOR, f"{self.backend} allocator"
        if column == C.NVML_TOTAL:
            return (limit, LIMIT_NVML,
                    "the device's total memory; the CUDA context and other "
                    "processes are not subtracted")
        return None, "", f"no probe reports a limit for {self.device}"

    def close(self) -> None:
        """Stops the probes."""
        self.sampler.close()
