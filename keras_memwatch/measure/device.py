"""The device an estimate measures: its limit, what is in use, its peaks.

Read through keras_memwatch's own probes (`keras_memwatch.record`), the
same readings MemWatch records; a step's need on the host under
TensorFlow, where its CPU allocator pools what it frees, from that
allocator's own statistics (`Device.need`).
"""

from __future__ import annotations

import contextlib
from typing import Optional

from keras_memwatch import columns as C
from keras_memwatch.measure.host_heap import heap_follows_arrays, trim_host_heap
from keras_memwatch.measure.host_memory import host_available_bytes
from keras_memwatch.configure.devices import device_label
from keras_memwatch.judge.derived import device_limit
from keras_memwatch.record.probes.tensorflow import allocator_stats
from keras_memwatch.units import format_bytes

HOST = C.HOST_DEVICE
TF_HOST = "CPU:0"  # TensorFlow's name of the host's allocator


class Device:
    """One device, read through the probes of the active backend.

    Args:
        backend: the Keras backend.
        device: `"GPU:<i>"`, `"host"`, or `None` for the first GPU the
            backend computes on, else the host. On the host, until `close`,
            glibc hands each large block back when it is freed
            (`host_heap.heap_follows_arrays`).

    Raises:
        ValueError: for a device the backend does not compute on.
        RuntimeError: when no probe reports the device.
    """

    def __init__(self, backend: str, device: Optional[str]):
        from keras_memwatch.record.probes import resolve_probes
        from keras_memwatch.record.sampler import Sampler

        self.backend = backend
        self.sampler = Sampler(resolve_probes("auto", backend))
        devices = self.sampler.start()
        gpus = [d for d in devices if d != HOST
                and C.ALLOCATOR_CURRENT in self.sampler.device_columns.get(d, ())]
        try:
            name = (gpus[0] if gpus else HOST) if device is None else \
                device_label(device, "device")
            if name != HOST and name not in gpus:
                raise ValueError(
                    f"Expected `device` to be one the {backend} backend computes "
                    f"on: {gpus + [HOST]}. Received: device={device!r}")
            if name not in devices:
                raise RuntimeError(f"no probe reports {name}: {self.sampler.notes}")
        except Exception:
            self.sampler.close()
            raise
        self.name = name
        self.index = devices.index(name)
        self.on_gpu = name != HOST
        self.gpu_index = int(name.split(":")[1]) if self.on_gpu else None
        self.peak_column = C.ALLOCATOR_PEAK if self.on_gpu else C.HOST_PEAK_RSS
        self._heap = contextlib.ExitStack()
        #: Whether TensorFlow's CPU allocator keeps statistics: it pools
        #: what it frees (oneDNN builds), so the resident set does not
        #: follow the steps, and its own peak is read instead (arrays under
        #: 256 KiB, from its small-size pool, are not counted).
        self.host_pool = (not self.on_gpu and backend == "tensorflow"
                          and tensorflow_cpu_pool())
        self._pool_base = 0
        if not self.on_gpu:
            self._heap.enter_context(heap_follows_arrays())

    @property
    def peak_words(self) -> str:
        """What a step's need is read from."""
        if self.on_gpu:
            return "the allocator's peak"
        if self.host_pool:
            return "TensorFlow's CPU allocator's peak"
        return "the host's peak resident memory"

    def read(self) -> dict[str, Optional[int]]:
        """The device's row now (it resets the peaks that can be reset)."""
        row = self.sampler.sample()[self.index]
        if self.host_pool:
            import tensorflow as tf

            self._pool_base = allocator_stats(tf, TF_HOST)[0] or 0
        return row

    def need(self, in_use: int) -> Optional[int]:
        """Bytes above `in_use` at the peak since the previous `read`; on
        the host under a pooling TensorFlow allocator, its peak above what it
        held at that read."""
        if self.host_pool:
            import tensorflow as tf

            peak = allocator_stats(tf, TF_HOST, reset=False)[1] or 0
            return max(peak - self._pool_base, 0)
        peak = self.peak()
        return None if peak is None else max(peak - in_use, 0)

    def in_use(self) -> int:
        """Bytes in use now (on the host, after freed heap is handed back).

        Raises:
            RuntimeError: when no probe reports it.
        """
        if not self.on_gpu:
            trim_host_heap()
        current = self.read()["current_bytes"]
        if current is None:
            raise RuntimeError(f"no probe reports the memory in use on {self.name}: "
                               f"{self.sampler.notes}")
        return int(current)

    def peak(self) -> Optional[int]:
        """The peak since the previous read, where a probe resets one."""
        value = self.read().get(self.peak_column)
        return None if value is None else int(value)

    def limit(self, in_use: int) -> tuple[Optional[int], str, bool]:
        """The device's limit: `(bytes, where from in words, whether the
        framework's allocator enforces it)`. On the host it is the memory
        still available plus `in_use`; `(None, why, False)` where nothing
        tells."""
        if not self.on_gpu:
            available, where = host_available_bytes()
            if available is None:
                return None, where, False
            return available + in_use, (
                f"host memory: {where} {format_bytes(available)} + this "
                f"process's {format_bytes(in_use)}"), False
        limit, column = device_limit(self.read())
        if column == C.ALLOCATOR_LIMIT:
            return limit, f"the {self.backend} allocator's limit", True
        if column == C.NVML_TOTAL:
            return limit, ("the device's total memory (NVML; the CUDA context "
                           "and other processes not subtracted)"), False
        return None, f"no probe reports a limit for {self.name}", False

    def close(self) -> None:
        """Stops the probes (and, on the host, leaves glibc's heap as
        `heap_follows_arrays` does)."""
        self.sampler.close()
        self._heap.close()


def tensorflow_cpu_pool() -> bool:
    """Whether TensorFlow's CPU allocator keeps statistics (it pools what it
    frees; without oneDNN it is `malloc`, and keeps none)."""
    try:
        import tensorflow as tf

        allocator_stats(tf, TF_HOST, reset=False)
    except Exception:  # noqa: BLE001 - "Allocator stats not available"
        return False
    return True
