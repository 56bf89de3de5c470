"""Host memory of this process: resident set size and its peak.

On Linux the probe keeps three file descriptors open and, per read, costs
one `pread` of `/proc/self/statm` (current RSS), one `getrusage` (the
kernel's RSS high-water mark) and one `pwrite` of `5` to
`/proc/self/clear_refs`, which resets that high-water mark to the current
RSS. The peak it reports is therefore the peak since the previous read.
Where `clear_refs` cannot be written (some sandboxes refuse it), the peak is
the high-water mark for the life of the process and the probe says so.
Elsewhere it reads RSS through psutil, with no peak.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, Callable, Optional

from keras_memwatch import columns
from keras_memwatch.columns import HOST_DEVICE
from keras_memwatch.probes.base import Probe, ProbeUnavailable, Reading


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

        def read_linux() -> Reading:
            rss = int(pread(statm, 64, 0).split()[1]) * page
            # ru_maxrss is in KiB on Linux.
            peak = max(getrusage(self_).ru_maxrss * 1024, rss)
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
            return "host: RSS and peak RSS since the previous sample (Linux)"
        return f"host: RSS; {self._note}"
