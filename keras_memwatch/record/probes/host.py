"""Host memory of this process: resident set size and its peak.

On Linux the probe keeps its files open and, per read, costs one `pread` of
`/proc/self/statm` (current RSS), one `getrusage` (the kernel's RSS
high-water mark) and one `pwrite` of `5` to `/proc/self/clear_refs`, which
resets that high-water mark to the current RSS. In a process exec'ed from a
larger one, `getrusage` keeps the parent's peak, so the probe reads
`VmHWM` from `/proc/self/status` instead. The peak it reports is therefore the peak since the previous read.
Where `clear_refs` cannot be written (some sandboxes refuse it), the peak is
the high-water mark for the life of the process and the probe says so.
Elsewhere it reads RSS through psutil, with no peak.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from typing import Any, Callable, Optional

from keras_memwatch import columns
from keras_memwatch.columns import HOST_DEVICE
from keras_memwatch.record.probes.base import Probe, ProbeUnavailable, Reading


class HostProbe(Probe):
    """Reads this process's resident set size and its peak since last read."""

    name = "host"
    columns = (columns.HOST_RSS, columns.HOST_PEAK_RSS)

    def __init__(self) -> None:
        self._fds: list[int] = []
        self._read: Optional[Callable[[], Reading]] = None
        self._note = ""

    def start(self) -> tuple[str, ...]:
        self.close()
        if sys.platform.startswith("linux"):
            self._start_linux()
        else:
            self._start_psutil()
        return (HOST_DEVICE,)

    def _start_linux(self) -> None:
        import resource

        page = os.sysconf("SC_PAGE_SIZE")
        statm = os.open("/proc/self/statm", os.O_RDONLY)
        self._fds.append(statm)
        getrusage = resource.getrusage
        self_ = resource.RUSAGE_SELF
        pread, pwrite = os.pread, os.pwrite
        try:
            clear = os.open("/proc/self/clear_refs", os.O_WRONLY)
            pwrite(clear, b"5", 0)
        except OSError as e:
            clear = -1
            self._note = (
                f"/proc/self/clear_refs is not writable here ({e.strerror}), "
                "so host peak RSS is the high-water mark for the life of the "
                "process, not the peak since the previous sample"
            )
        else:
            self._fds.append(clear)
        self.peak_per_sample = clear >= 0

        def rusage_peak() -> int:
            return getrusage(self_).ru_maxrss * 1024  # KiB on Linux

        peak_now = rusage_peak
        status = os.open("/proc/self/status", os.O_RDONLY)
        self._fds.append(status)
        if rusage_peak() > _vm_hwm(status) + 4 * 2**20:
            # getrusage keeps the peak of the program this process was
            # exec'ed from (a large parent), which clear_refs cannot reset;
            # VmHWM is this process's own, at the cost of parsing
            # /proc/self/status at each read.
            peak_now = functools.partial(_vm_hwm, status)

        def read_linux() -> Reading:
            rss = int(pread(statm, 64, 0).split()[1]) * page
            peak = max(peak_now(), rss)
            if clear >= 0:
                pwrite(clear, b"5", 0)
            return (rss, peak)

        self._read = read_linux

    def _start_psutil(self) -> None:
        try:
            import psutil
        except ImportError:
            raise ProbeUnavailable(
                "host memory outside Linux needs psutil: pip install psutil"
            ) from None
        memory_info: Any = psutil.Process().memory_info
        self.peak_per_sample = False
        self._note = "host peak RSS is not available outside Linux"
        self._read = lambda: (memory_info().rss, None)

    def read(self) -> Sequence[Reading]:
        return (self._read(),)  # type: ignore[misc]

    def close(self) -> None:
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()

    def describe(self) -> str:
        if self.peak_per_sample:
            text = "host: RSS and peak RSS since the previous sample (Linux)"
        else:
            text = f"host: RSS; {self._note}"
        return text + _onednn_note()


def _onednn_note() -> str:
    """What TensorFlow's oneDNN CPU allocator hides from host peaks, when on."""
    keras = sys.modules.get("keras")
    try:
        tensorflow = keras is not None and keras.backend.backend() == "tensorflow"
    except Exception:
        tensorflow = False
    if not tensorflow or os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1") == "0":
        return ""
    return ("; TensorFlow's oneDNN CPU allocator keeps freed memory, so after "
            "the first oversized batch host peaks stay flat: set "
            "TF_ENABLE_ONEDNN_OPTS=0 before importing TensorFlow to see every one")


def _vm_hwm(fd: int) -> int:
    """VmHWM of /proc/self/status (kept open as `fd`), in bytes."""
    text = os.pread(fd, 4096, 0)
    start = text.index(b"VmHWM:") + 6
    return int(text[start:text.index(b"kB", start)]) * 1024
