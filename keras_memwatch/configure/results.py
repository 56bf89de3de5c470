"""What `configure_memory` applied: one `MemoryConfig`, one entry per GPU."""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

from keras_memwatch.configure.devices import gpu_index
from keras_memwatch.units import format_bytes

DeviceSpec = Union[int, str]


@dataclasses.dataclass(frozen=True)
class DeviceMemoryConfig:
    """What `configure_memory` applied to one GPU.

    Attributes:
        device: `"GPU:0"`, `"GPU:1"`, ... in the framework's own numbering
            (the order of the GPUs the process sees); `"GPU:*"` for a
            JAX setting applied to every GPU when NVML could not list them.
        allow_growth: `True` when memory is allocated on demand, `False` when
            the framework preallocates, `None` when left at the framework's
            default because growth was not asked for.
        limit_bytes: the cap on this device, in bytes, or `None` for no cap.
            Under JAX it is `fraction * total_bytes`; XLA rounds its pool to
            its own granularity (a few MiB), and the
            device's `memory_stats()["bytes_limit"]` gives the exact figure.
        total_bytes: the device's total memory in bytes as CUDA reports it
            (NVML's total less what the driver reserves), when it was read
            to turn a limit into a fraction; else `None`.
        mechanism: the framework settings made, e.g.
            `"XLA_CLIENT_MEM_FRACTION=0.0283"`.
        note: anything a user should know about this device's setting.
    """

    device: str  # "GPU:*": every GPU, when they could not be listed
    allow_growth: Optional[bool]
    limit_bytes: Optional[int]
    total_bytes: Optional[int]
    mechanism: str
    note: str = ""

    def __str__(self) -> str:
        growth = {None: "default", True: "on", False: "off"}[self.allow_growth]
        if self.limit_bytes is None:
            limit = "none"
        else:
            limit = f"{format_bytes(self.limit_bytes)} ({self.limit_bytes} bytes)"
            if self.total_bytes:
                limit += f" of {format_bytes(self.total_bytes)}"
        text = f"{self.device}: growth {growth}, limit {limit}; via {self.mechanism}"
        return text + (f" [{self.note}]" if self.note else "")


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    """What `configure_memory` applied, per device.

    Attributes:
        backend: the Keras backend it was applied for.
        allow_growth: the `allow_growth` asked for.
        memory_limit_mb: the `memory_limit_mb` asked for.
        devices: one `DeviceMemoryConfig` per configured GPU; empty when
            nothing was applied.
        note: why nothing was applied, or what holds for every device.
    """

    backend: str
    allow_growth: Optional[bool]
    memory_limit_mb: Optional[float]
    devices: tuple[DeviceMemoryConfig, ...] = ()
    note: str = ""

    @property
    def applied(self) -> bool:
        """Whether any device was configured."""
        return bool(self.devices)

    def device(self, name: DeviceSpec) -> Optional[DeviceMemoryConfig]:
        """The entry of one device (`"GPU:0"`, `"gpu:0"` or `0`), or `None`."""
        index = gpu_index(name, "name")
        for entry in self.devices:
            if entry.device == f"GPU:{index}":
                return entry
        return None

    def limit_bytes(self, name: DeviceSpec) -> Optional[int]:
        """The cap applied to one device in bytes, or `None` for no cap."""
        entry = self.device(name)
        return None if entry is None else entry.limit_bytes

    def __str__(self) -> str:
        head = f"keras_memwatch memory configuration (backend: {self.backend})"
        if not self.devices:
            return f"{head}: nothing applied: {self.note}"
        lines = [head + (f": {self.note}" if self.note else "")]
        lines += [f"  {entry}" for entry in self.devices]
        return "\n".join(lines)
