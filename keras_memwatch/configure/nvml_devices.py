"""Which NVIDIA GPUs this process sees, and their memory totals, through
NVML (`nvidia-ml-py`), imported and initialised only when asked."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional


def visible_handles(pynvml: Any, visible: Optional[str], count: int) -> list[Any]:
    """NVML handles for `CUDA_VISIBLE_DEVICES`, in CUDA's order (all of
    them when it is unset)."""
    if visible is None:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    uuids: Optional[list[str]] = None
    handles: list[Any] = []
    seen: set[Any] = set()
    for entry in visible.split(","):
        entry = entry.strip()
        if entry.isdigit():
            key: Any = int(entry)
            if key >= count or key in seen:
                break
            handle = pynvml.nvmlDeviceGetHandleByIndex(key)
        elif entry.startswith("GPU-"):
            if uuids is None:
                by_index = pynvml.nvmlDeviceGetHandleByIndex
                uuids = [
                    _text(pynvml.nvmlDeviceGetUUID(by_index(i)))
                    for i in range(count)
                ]
            matches = [i for i, u in enumerate(uuids) if u.startswith(entry)]
            if len(matches) != 1 or matches[0] in seen:
                break
            key = matches[0]
            handle = pynvml.nvmlDeviceGetHandleByIndex(key)
        elif entry.startswith("MIG-"):
            # A MIG instance: NVML gives its memory through a MIG device
            # handle; per-process figures there may be unavailable.
            if entry in seen:
                break
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(entry)
            except Exception:
                break
            key = entry
        else:  # "", "-1", anything CUDA would not accept
            break
        seen.add(key)
        handles.append(handle)
    return handles


@dataclasses.dataclass(frozen=True)
class NvmlTotals:
    """The total memory of the visible GPUs, or why NVML could not tell.

    Attributes:
        totals: bytes per GPU in CUDA's order (see `cuda_total`); `None`
            when NVML could not be used.
        reason: why `totals` is `None`; else `""`.
    """

    totals: Optional[list[int]]
    reason: str = ""


def visible_totals() -> NvmlTotals:
    """Total bytes of each CUDA-visible NVIDIA GPU, in CUDA ordinal order.

    Honours `CUDA_VISIBLE_DEVICES` as `visible_handles` does. Indices follow
    NVML's PCI bus order, which is CUDA's order under
    `CUDA_DEVICE_ORDER=PCI_BUS_ID` (and on machines of one GPU model). NVML
    is initialised and shut down within the call; no error is raised.
    """
    try:
        import pynvml
    except ImportError:
        return NvmlTotals(
            None, "nvidia-ml-py is not installed: pip install nvidia-ml-py"
        )
    try:
        pynvml.nvmlInit()
    except Exception as error:  # NVMLError_LibraryNotFound, DriverNotLoaded...
        return NvmlTotals(None, f"NVML is unavailable ({error})")
    try:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        chosen = visible_handles(pynvml, visible, pynvml.nvmlDeviceGetCount())
        return NvmlTotals([cuda_total(pynvml, h) for h in chosen])
    except Exception as error:
        return NvmlTotals(None, f"NVML query failed ({error})")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # pragma: no cover - shutdown failure is harmless
            pass


def cuda_total(pynvml: Any, handle: Any) -> int:
    """The total memory CUDA (and so XLA) reports for a device, in bytes.

    NVML's plain total includes memory the driver reserves for itself;
    CUDA's total, which XLA multiplies the memory
    fraction by, leaves it out. NVML's v2 query reports both.
    """
    version = getattr(pynvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            if 0 <= int(info.reserved) < int(info.total):
                return int(info.total) - int(info.reserved)
        except Exception:  # older driver: fall back to the plain total
            pass
    return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)


def nvidia_driver_present() -> bool:
    """Whether this Linux machine has an NVIDIA driver with a GPU."""
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return os.path.exists("/dev/nvidia0")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
