"""The memory still available to this process on the host."""

from __future__ import annotations

from typing import Optional

__all__ = ["host_available_bytes"]


def _read_int(path: str) -> Optional[int]:
    """The integer a file holds, or `None`."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def host_available_bytes() -> tuple[Optional[int], str]:
    """Memory still available to this process on the host.

    Returns:
        `(bytes, where from)`: Linux's `MemAvailable` (else psutil's
        `available`), lowered to the cgroup's free memory (`memory.max -
        memory.current`, or cgroup v1's limit less usage) when a container
        limit is lower, and to the address space left under `RLIMIT_AS`
        when that is lower still; `(None, why)` when nothing can tell.
    """
    available: Optional[int] = None
    source = ""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    source = "MemAvailable"
                    break
    except OSError:
        pass
    if available is None:
        try:
            import psutil

            available = int(psutil.virtual_memory().available)
            source = "psutil available memory"
        except Exception:
            return None, "no /proc/meminfo and no psutil (pip install psutil)"
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
         "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and usage is not None and limit < 2**60:
            free = max(limit - usage, 0)
            if free < available:
                available, source = free, "the cgroup's free memory"
            break
    room = _address_space_room()
    if room is not None and room < available:
        available, source = room, "the address space left under RLIMIT_AS"
    return available, source


def _address_space_room() -> Optional[int]:
    """RLIMIT_AS less this process's virtual size (Linux), else None."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return max(soft - int(line.split()[1]) * 1024, 0)
    except (ImportError, OSError, ValueError):
        pass
    return None
