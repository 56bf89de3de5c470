"""Reading MemWatch logs back: one file or several (ranks, calls, trials),
CSV or Parquet, into the recorder's DataFrame."""

from __future__ import annotations

import errno
import glob
import io
import os
import re
from collections.abc import Sequence
from typing import Union

import pandas as pd

from keras_memwatch import columns as C
from keras_memwatch.record.csvlog import PathLike
from keras_memwatch.record.recorder import concat_frames, empty_frame, normalize_dtypes

_PARQUET_MAGIC = b"PAR1"

#: The columns a file must have to be read as a MemWatch log. Columns added
#: later (`allocator_reserved_bytes`, `plan_bytes`, `process`, `hostname`,
#: `call`, `timestamp`) may be missing from older logs: they read as missing
#: values (process 0, call 0).
REQUIRED_COLUMNS: tuple[str, ...] = (
    "step", "epoch", "batch", "phase", "device", "time_s", "peak_bytes",
    "current_bytes", "baseline_bytes", "spike")

#: With several files, the column that says which file a row came from.
LOG_COLUMN = "log"


class NotALogError(ValueError):
    """A file that is not a MemWatch log: empty, plain text, another
    program's CSV (Keras's `CSVLogger`), or values of the wrong kind."""


def load_log(path: Union[PathLike, Sequence[PathLike]]) -> pd.DataFrame:
    """Reads MemWatch logs back, with the columns and dtypes of
    `MemWatch.to_dataframe()`.

    Reads the CSV that `MemWatch(log_path=...)` streams and `MemWatch.to_csv`
    writes, and the Parquet file of `MemWatch.to_parquet` (needs pyarrow).
    A last line cut short by a crash is dropped.

    Given a sequence of paths or a glob (`"mem.rank*.csv"`: the logs of
    the processes of a distributed run), it returns one frame: every row keeps
    its `process` and `hostname`, one more column, `log`, names the file it
    came from, and rows are ordered by process, then file (in the order
    given; a glob's matches in natural order: `mem.rank2` before
    `mem.rank10`, `mem.csv` before `mem.1.csv`), then as written (by step).
    A glob leaves out the guard's `*.oom.csv` copies, which repeat a log's
    rows, unless the pattern itself names `.oom.`.

    Args:
        path: a file, a glob, or a sequence of files and globs. A string
            that names an existing file is that file, even with `*` or `[`.

    Returns:
        A `pandas.DataFrame`, one row per sample per device (per process).

    Raises:
        FileNotFoundError: a file that does not exist, or a glob that
            matches none.
        NotALogError: (a `ValueError`) a file that is not a MemWatch log;
            the message names the file and the columns it lacks.
        ImportError: a Parquet file without pyarrow installed.

    Example:

    ```pycon
    >>> frame = load_log("memwatch.csv")  # doctest: +SKIP
    >>> frame.groupby("device")["peak_bytes"].max()  # doctest: +SKIP
    >>> merged = load_log("mem.rank*.csv")  # doctest: +SKIP
    >>> merged.groupby(["process", "device"])["peak_bytes"].max()  # doctest: +SKIP
    ```
    """
    paths, several = _expand(path)
    if not several:
        return _read_one(paths[0])
    frames = []
    for name in paths:
        frame = _read_one(name)
        frame[LOG_COLUMN] = name
        frames.append(frame)
    merged = concat_frames(frames).sort_values("process", kind="stable")
    return merged.reset_index(drop=True)


def _expand(path: Union[PathLike, Sequence[PathLike]]) -> tuple[list[str], bool]:
    """The files to read, and whether the caller asked for several."""
    if isinstance(path, (str, os.PathLike)):
        items, several = [os.fspath(path)], False
    elif isinstance(path, Sequence) and not isinstance(path, bytes):
        items, several = [os.fspath(p) for p in path], True
        if not items:
            raise ValueError("Expected at least one log path. Received: path=[]")
    else:
        raise TypeError("Expected `path` to be a path, a glob or a sequence of "
                        f"them. Received: path={path!r}")
    files: list[str] = []
    for item in items:
        if os.path.exists(item) or not glob.has_magic(item):
            files.append(item)
            continue
        several = True
        keep_oom = ".oom." in os.path.basename(item)
        matches = [m for m in glob.glob(item) if os.path.isfile(m)
                   and (keep_oom or not m.endswith(".oom.csv"))]
        if not matches:
            raise FileNotFoundError(errno.ENOENT, "no file matches this pattern", item)
        files.extend(sorted(matches, key=_natural))
    seen: set[str] = set()
    unique = []
    for name in files:
        real = os.path.realpath(name)
        if real not in seen:
            seen.add(real)
            unique.append(name)
    return unique, several


def _natural(path: str) -> list:
    """Sort key: numbers as numbers, and `stem.csv` before `stem.1.csv`."""
    stem = os.path.splitext(path)[0]
    match = re.fullmatch(r"(.*?)(?:\.(\d+))?", stem, re.S)
    assert match is not None  # the pattern matches any text
    base, n = match.group(1), int(match.group(2) or 0)
    parts = [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", base)]
    return [(0, p) if isinstance(p, int) else (1, p) for p in parts] + [(0, n)]


def _read_one(path: str) -> pd.DataFrame:
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(_PARQUET_MAGIC):
        return _read_parquet(path, data)
    if not data.strip():
        raise NotALogError(
            f"{path} is empty, not a MemWatch log (a log starts with a header "
            f"line naming its columns: {', '.join(REQUIRED_COLUMNS)}, ...)")
    try:
        header = data.split(b"\n", 1)[0].decode("utf-8").strip().split(",")
    except UnicodeDecodeError:
        raise NotALogError(f"{path} is not a MemWatch log: it is neither a "
                           "CSV text file nor Parquet") from None
    _check_columns(path, [h.strip() for h in header])
    if not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
    if data.count(b"\n") <= 1:
        return empty_frame()
    try:
        frame = pd.read_csv(io.BytesIO(data), keep_default_na=False,
                            na_values={c: [""] for c in C.COLUMNS})
        return normalize_dtypes(frame)
    except (ValueError, TypeError) as e:  # pandas' ParserError is a ValueError
        raise NotALogError(f"{path} has a MemWatch header but values that are "
                           f"not a MemWatch log's: {e}") from None


def _read_parquet(path: str, data: bytes) -> pd.DataFrame:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ImportError(f"{path} is Parquet; reading it needs pyarrow: pip "
                          "install pyarrow (or pip install "
                          "'keras-memwatch[parquet]')") from None
    try:
        frame = pd.read_parquet(io.BytesIO(data))
    except Exception as e:  # pyarrow's errors are not OSError/ValueError alone
        raise NotALogError(f"{path} is not a readable Parquet file: {e}") from None
    _check_columns(path, [str(c) for c in frame.columns])
    try:
        return normalize_dtypes(frame.reset_index(drop=True))
    except (ValueError, TypeError) as e:
        raise NotALogError(f"{path} has MemWatch's columns but values that are "
                           f"not a MemWatch log's: {e}") from None


def _check_columns(path: str, columns: Sequence[str]) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if not missing:
        return
    shown = ", ".join(c for c in columns[:8] if c) or "none"
    if len(columns) > 8:
        shown += ", ..."
    raise NotALogError(
        f"{path} is not a MemWatch log: it lacks the column(s) "
        f"{', '.join(missing)} (its columns: {shown}). Give a file written by "
        "MemWatch(log_path=...), MemWatch.to_csv or MemWatch.to_parquet")
