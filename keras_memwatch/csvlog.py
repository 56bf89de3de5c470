"""The streamed CSV log: written sample by sample, read back by `load_log`.

Each sample's rows go to the kernel in one unbuffered `write` before the
next sample is taken, so a crash or a `kill -9` of the training process
loses at most the sample in flight (a power loss may lose what the kernel
had not yet written to disk). A log never overwrites a file: it is created
exclusively, and creating it where a file already exists is an error.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Optional, Union

import pandas as pd

from keras_memwatch import columns as C
from keras_memwatch.recorder import empty_frame, normalize_dtypes

PathLike = Union[str, "os.PathLike[str]"]

_HEADER = (",".join(C.COLUMNS) + "\n").encode()
_BEFORE_SPIKE = C.COLUMNS[C.COLUMNS.index("time_s") + 1:C.COLUMNS.index("spike")]
_AFTER_SPIKE = C.COLUMNS[C.COLUMNS.index("spike") + 1:-len(C.PROCESS_COLUMNS)]


class CsvLog:
    """Appends samples to a new CSV file as training runs.

    Args:
        path: the file to create. It must not exist yet.
        process, hostname: written on every row. Defaults to `0` and `""`.

    Raises:
        FileExistsError: if `path` exists.
    """

    def __init__(self, path: PathLike, process: int = 0, hostname: str = ""):
        self.path = os.fspath(path)
        self._tail = f",{process},{hostname}\n"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        self._fd: Optional[int] = os.open(self.path, flags, 0o644)
        self._write(_HEADER)

    def write(
        self,
        step: int,
        epoch: int,
        batch: Optional[int],
        phase: str,
        time_s: float,
        devices: Sequence[str],
        rows: Sequence[dict[str, Optional[int]]],
    ) -> None:
        """Writes one sample (one line per device) in a single system call."""
        head = f"{step},{epoch},{'' if batch is None else batch},{phase},"
        lines = []
        for device, row in zip(devices, rows):
            before = ",".join([_cell(row.get(name)) for name in _BEFORE_SPIKE])
            after = ",".join([_cell(row.get(name)) for name in _AFTER_SPIKE])
            spike = "1" if row.get("spike") else "0"
            lines.append(f"{head}{device},{time_s:.6f},{before},{spike},{after}"
                         f"{self._tail}")
        self._write("".join(lines).encode())

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            raise ValueError(f"the log {self.path} is closed")
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]

    def close(self) -> None:
        """Closes the file; safe to call more than once."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _cell(value: Optional[int]) -> str:
    return "" if value is None else str(value)


def load_log(path: PathLike) -> pd.DataFrame:
    """Reads a streamed log back, with the columns and dtypes of
    `MemWatch.to_dataframe()`.

    A last line cut short by a crash is dropped.

    Args:
        path: a CSV file written through `MemWatch(log_path=...)` or
            `MemWatch.to_csv`.

    Returns:
        A `pandas.DataFrame`, one row per sample per device.

    Example:

    >>> frame = load_log("memwatch.csv")  # doctest: +SKIP
    >>> frame.groupby("device")["peak_bytes"].max()  # doctest: +SKIP
    """
    with open(path, "rb") as f:
        data = f.read()
    if not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
    if data.count(b"\n") <= 1:
        return empty_frame()
    frame = pd.read_csv(io.BytesIO(data), keep_default_na=False,
                        na_values={c: [""] for c in C.COLUMNS})
    return normalize_dtypes(frame)
