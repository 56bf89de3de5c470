"""TensorFlow's GPU allocator: bytes in use, peak since the last read, limit.

Per logical GPU and per read, the probe calls
`tf.config.experimental.get_memory_info("GPU:i")` (the BFC allocator's
`bytes_in_use` and `peak_bytes_in_use`) and then
`tf.config.experimental.reset_memory_stats("GPU:i")`, which sets the peak
back to the current value. The peak it reports is therefore the peak since
the previous read, up to the few microseconds between the two calls.

TensorFlow exposes no allocator limit: `get_memory_info` returns only
`current` and `peak`, although the allocator knows its `bytes_limit`. The
limit column is filled only where the limit was set by the user, through
`tf.config.set_logical_device_configuration(gpu,
[tf.config.LogicalDeviceConfiguration(memory_limit=MiB)])`; otherwise it is
missing. (`tensorflow.python.client.device_lib.list_local_devices()` does
report a `memory_limit`, but it builds a fresh set of devices to do so, which
is not something to do in the middle of a fit.)

An allocator that does not track statistics answers zeros; zeros are never
passed on as data. Starting the probe initialises the TensorFlow runtime,
which by default reserves most of each GPU's memory: use it with the
TensorFlow backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from keras_memwatch import columns
from keras_memwatch.record.probes.base import Probe, ProbeUnavailable, Reading

_MIB = 1 << 20


class TensorFlowProbe(Probe):
    """Reads TensorFlow's per-GPU allocator statistics.

    Columns: `allocator_current_bytes` (bytes in use), `allocator_peak_bytes`
    (peak since the previous read) and `allocator_limit_bytes` (only where a
    logical device memory limit is configured). Devices are TensorFlow's
    logical GPUs, named `GPU:0`, `GPU:1`, ...
    """

    name = "tensorflow"
    columns = (
        columns.ALLOCATOR_CURRENT,
        columns.ALLOCATOR_PEAK,
        columns.ALLOCATOR_LIMIT,
    )
    peak_per_sample = True

    def __init__(self) -> None:
        self._devices: tuple[str, ...] = ()
        self._limits: tuple[Optional[int], ...] = ()
        self._tf: Any = None
        self._note = ""

    def start(self) -> tuple[str, ...]:
        try:
            import tensorflow as tf
        except ImportError:
            raise ProbeUnavailable(
                "TensorFlow is not installed: pip install tensorflow"
            ) from None
        if not tf.config.list_physical_devices("GPU"):
            if not tf.test.is_built_with_cuda():
                raise ProbeUnavailable(
                    "this TensorFlow build has no GPU support (tensorflow-cpu?): "
                    "pip install 'tensorflow[and-cuda]'"
                )
            raise ProbeUnavailable("TensorFlow sees no GPU")
        logical = tf.config.list_logical_devices("GPU")
        if not logical:
            raise ProbeUnavailable(
                "TensorFlow has no logical GPU (all GPUs hidden by "
                "tf.config.set_visible_devices?)"
            )
        devices = tuple(_short_name(d.name) for d in logical)

        try:
            for device in devices:
                allocator_stats(tf, device, reset=False)
        except Exception as e:  # ValueError: "Allocator stats not available"
            raise ProbeUnavailable(
                f"TensorFlow does not track allocator statistics on {device}: {e}"
            ) from None
        try:
            for device in devices:
                tf.config.experimental.reset_memory_stats(device)
        except Exception as e:
            self.peak_per_sample = False
            self._note = (
                f"the peak cannot be reset here ({e}), so it is the high-water "
                "mark since the process started"
            )
        else:
            self.peak_per_sample = True
            self._note = ""

        self._devices = devices
        self._limits = _configured_limits(tf, len(devices))
        self._tf = tf
        return devices

    def read(self) -> Sequence[Reading]:
        tf, reset = self._tf, self.peak_per_sample
        out: list[Reading] = []
        for device, limit in zip(self._devices, self._limits):
            try:
                current, peak = allocator_stats(tf, device, reset)
            except Exception:
                out.append((None, None, limit))
                continue
            if not current and not peak:
                # An allocator without statistics; after a reset the peak is
                # the current value, so a live GPU allocator is never 0/0.
                current = peak = None
            out.append((current, peak, limit))
        return tuple(out)

    def close(self) -> None:
        self._tf = None
        self._devices = self._limits = ()

    def describe(self) -> str:
        if self._note:
            return f"TensorFlow allocator: bytes in use; {self._note}."
        return (
            "TensorFlow allocator: bytes in use and the peak since the "
            "previous sample; the limit only where a logical device "
            "memory_limit is set (TensorFlow does not expose the allocator's "
            "own limit)."
        )


def allocator_stats(tf: Any, device: str, reset: bool = True
                    ) -> tuple[Optional[int], Optional[int]]:
    """`(bytes in use, peak)` of TensorFlow's allocator on `device`
    (`"GPU:0"`, `"CPU:0"`); with `reset`, the peak is then set back to the
    bytes in use, so that the next read's peak is the peak since this one.

    Raises:
        ValueError: where the allocator keeps no statistics (TensorFlow's
            "Allocator stats not available").
    """
    info = tf.config.experimental.get_memory_info(device)
    if reset:
        tf.config.experimental.reset_memory_stats(device)
    return info.get("current"), info.get("peak")


def _short_name(name: str) -> str:
    """`/job:localhost/replica:0/task:0/device:GPU:0` -> `GPU:0`."""
    return name.rsplit("device:", 1)[-1]


def _configured_limits(tf: Any, count: int) -> tuple[Optional[int], ...]:
    """The memory limit of each logical GPU, where the user configured one.

    Logical GPUs are numbered by `experimental_device_ordinal`, then by
    physical GPU, then by position in the configuration list. When that
    order cannot be matched to `count` logical GPUs, every limit is None.
    """
    try:
        entries: list[tuple[int, int, int, Optional[int]]] = []
        for p, physical in enumerate(tf.config.get_visible_devices("GPU")):
            configs = tf.config.get_logical_device_configuration(physical)
            if not configs:
                entries.append((0, p, 0, None))
                continue
            for k, config in enumerate(configs):
                ordinal = config.experimental_device_ordinal or 0
                limit = config.memory_limit
                limit = int(limit * _MIB) if limit is not None else None
                entries.append((ordinal, p, k, limit))
    except Exception:
        return (None,) * count
    if len(entries) != count:
        return (None,) * count
    entries.sort(key=lambda e: e[:3])
    return tuple(e[3] for e in entries)
