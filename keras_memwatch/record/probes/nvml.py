"""NVML (the NVIDIA driver's view): device memory used/total, this process's share.

Per GPU and per read: `nvmlDeviceGetMemoryInfo` (used and total bytes, all
processes together, including what frameworks have reserved but not used)
and, unless turned off, the compute processes on the device
(`nvmlDeviceGetComputeRunningProcesses`, which pynvml maps to the
`_v3` call, falling back to `_v2` on older drivers). `process_bytes` sums
`usedGpuMemory` over the entries whose pid is this process's. The process
query is the costlier half (two driver calls and one Python object per
process); `benchmarks/probe_costs.py` times it apart, and
`NvmlProbe(process_memory=False)` skips it.

NVML is initialised once, in `start` (never at import), and shut down in
`close`. A query that fails during training gives missing values rather
than an exception (nvitop's "not available" habit).

Devices are the GPUs this process can use, named `GPU:i` with `i` the CUDA
index a framework uses, mapped to NVML's devices through
`CUDA_VISIBLE_DEVICES` the way CUDA reads it: a comma list of indices, GPU
UUIDs (`GPU-...`, or any unique prefix of one) or MIG UUIDs (`MIG-...`);
parsing stops at the first entry that is invalid or repeated, so `""` and
`"-1"` hide every GPU. Unset, every NVML device is listed. NVML numbers GPUs
in PCI bus order and CUDA, by default, fastest first; the two agree when
`CUDA_DEVICE_ORDER=PCI_BUS_ID` or all GPUs are the same model, and
`describe` warns otherwise.

`configure.nvml_devices` maps `CUDA_VISIBLE_DEVICES` to NVML's devices and
reads their totals without a probe, for `configure_memory`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Callable, Optional

from keras_memwatch import columns
from keras_memwatch.configure.nvml_devices import visible_handles
from keras_memwatch.record.probes.base import Probe, ProbeUnavailable, Reading

#: NVML_VALUE_NOT_AVAILABLE as an unsigned long long.
_NOT_AVAILABLE = (1 << 64) - 1


class NvmlProbe(Probe):
    """Reads device and per-process GPU memory from the NVIDIA driver.

    Columns: `nvml_used_bytes` and `nvml_total_bytes` (the whole device, all
    processes), `process_bytes` (this process's `usedGpuMemory`; missing
    when the driver does not show this process, as in a container with its
    own PID namespace, where NVML lists host PIDs). There is no peak.

    Args:
        process_memory: query this process's usage on every read. Defaults
            to `True`.
    """

    name = "nvml"
    columns = (columns.NVML_USED, columns.NVML_TOTAL, columns.PROCESS)
    peak_per_sample = False
    # NVML has no peak to miss, and a read costs tens of microseconds, most
    # of them the per-process query (docs/gpu-validation.md): once a second
    # is plenty.
    min_interval_s = 1.0
    sees_all_gpus = True

    def __init__(self, process_memory: bool = True) -> None:
        self.process_memory = process_memory
        self._nvml: Any = None  # the pynvml module while NVML is initialised
        self._handles: tuple[Any, ...] = ()
        self._get_memory: Optional[Callable[[Any], Any]] = None
        self._get_processes: Optional[Callable[[Any], Any]] = None
        self._pid = 0
        self._notes: list[str] = []

    def start(self) -> tuple[str, ...]:
        self.close()
        try:
            import pynvml
        except ImportError:
            raise ProbeUnavailable(
                "nvidia-ml-py is not installed: pip install nvidia-ml-py"
            ) from None
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError (no driver, no library), OSError
            raise ProbeUnavailable(
                f"NVML could not start ({_message(e)}): no NVIDIA driver loaded?"
            ) from None
        self._nvml = pynvml
        try:
            return self._open(pynvml)
        except ProbeUnavailable:
            self.close()
            raise
        except Exception as e:
            self.close()
            raise ProbeUnavailable(f"NVML could not list GPUs: {_message(e)}") from None

    def _open(self, pynvml: Any) -> tuple[str, ...]:
        count = pynvml.nvmlDeviceGetCount()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        handles = visible_handles(pynvml, visible, count)
        if not handles:
            where = (
                "NVML reports no GPU"
                if visible is None
                else f"CUDA_VISIBLE_DEVICES={visible!r} leaves no GPU visible"
            )
            raise ProbeUnavailable(where)

        self._notes = []
        if os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and count > 1:
            models = set()
            for i in range(count):
                try:
                    models.add(pynvml.nvmlDeviceGetName(
                        pynvml.nvmlDeviceGetHandleByIndex(i)))
                except Exception:
                    models.add(i)  # unknown: assume it may differ
            if len(models) > 1:
                self._notes.append(
                    "GPUs of several models without CUDA_DEVICE_ORDER=PCI_BUS_ID:"
                    " CUDA and NVML may number them differently"
                )

        self._handles = tuple(handles)
        self._get_memory = pynvml.nvmlDeviceGetMemoryInfo
        self._get_processes = (
            _process_query(pynvml, handles[0]) if self.process_memory else None
        )
        if self.process_memory and self._get_processes is None:
            self._notes.append(
                "NVML does not list processes here, so process_bytes is missing"
            )
        self._pid = os.getpid()
        return tuple(f"GPU:{i}" for i in range(len(handles)))

    def read(self) -> Sequence[Reading]:
        get_memory, get_processes = self._get_memory, self._get_processes
        pid = self._pid
        out = []
        for handle in self._handles:
            try:
                memory = get_memory(handle)  # type: ignore[misc]
                used, total = memory.used, memory.total
            except Exception:
                used = total = None
            own = None
            if get_processes is not None:
                try:
                    own = _own_bytes(get_processes(handle), pid)
                except Exception:
                    own = None
            out.append((used, total, own))
        return tuple(out)

    def close(self) -> None:
        nvml, self._nvml = self._nvml, None
        self._handles = ()
        self._get_memory = self._get_processes = None
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass

    def describe(self) -> str:
        text = (
            "NVML: device memory used/total (all processes, including memory "
            "a framework reserved but does not use) and this process's "
            "usedGpuMemory, which a container's PID namespace can hide; no peak; "
            f"read at most every {self.min_interval_s:g} s (missing in between)"
        )
        if not self.process_memory:
            text += "; the per-process query is turned off"
        for note in self._notes:
            text += f"; {note}"
        return text + "."


def _message(e: BaseException) -> str:
    return str(e) or type(e).__name__


def _process_query(pynvml: Any, handle: Any) -> Optional[Callable[[Any], Any]]:
    """The first compute-process query that works on this driver, or None."""
    for name in (
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
    ):
        query = getattr(pynvml, name, None)
        if query is None:
            continue
        try:
            query(handle)
        except Exception:
            continue
        return query
    return None


def _own_bytes(processes: Sequence[Any], pid: int) -> Optional[int]:
    """Sum of `usedGpuMemory` over this pid's entries; None if none or unknown."""
    total = None
    for p in processes:
        if p.pid != pid:
            continue
        used = p.usedGpuMemory
        if used is None or used >= _NOT_AVAILABLE:
            return None
        total = (total or 0) + used
    return total
