"""The streamed CSV log: written a block of samples at a time, read back by
`load_log`.

Each block of rows goes to the kernel in one unbuffered `write` (the
pipeline writes one at least every 0.1 s while training runs), so a crash
or a `kill -9` of the training process loses at most the rows of the last
0.1 s (a power loss may lose what the kernel had not yet written to disk);
`load_log` drops a line cut short. A log never overwrites a file: it is created
exclusively (`O_EXCL`). `CsvLog.create_free` takes the next free name when
the one asked for is taken, by another process of a distributed run, by
another job started at the same moment in the same folder, or by an
earlier fit: choosing and creating the name is one atomic step, so two
writers can never end up with the same file.

With several processes, each writes its own file: `log_path_for` turns
`mem.csv` into `mem.rank{N}.csv`, or replaces `{rank}` where the path has
it. `load_log` reads one log, several, or a glob of them, into one frame.
"""

from __future__ import annotations

import errno
import functools
import glob
import io
import logging
import os
import re
from collections.abc import Iterable, Sequence
from typing import Optional, Union

import numpy as np
import pandas as pd

from keras_memwatch import columns as C
from keras_memwatch.record.block import Block
from keras_memwatch.record.recorder import concat_frames, empty_frame, normalize_dtypes

logger = logging.getLogger("keras_memwatch")

PathLike = Union[str, "os.PathLike[str]"]

#: Replaced by the process index in a `log_path`.
RANK_FIELD = "{rank}"

#: Names `create_free` tries after the first (`stem.1.csv`, ...) before
#: giving up: far more than any folder holds.
MAX_NAMES = 100_000

#: The columns a file must have to be read as a MemWatch log. Columns added
#: later (`allocator_reserved_bytes`, `plan_bytes`, `process`, `hostname`,
#: `call`, `timestamp`) may be missing from older logs: they read as missing
#: values (process 0, call 0).
REQUIRED_COLUMNS: tuple[str, ...] = (
    "step", "epoch", "batch", "phase", "device", "time_s", "peak_bytes",
    "current_bytes", "baseline_bytes", "spike")

#: With several files, the column that says which file a row came from.
LOG_COLUMN = "log"

_HEADER = (",".join(C.COLUMNS) + "\n").encode()
_BYTES_FIELDS = C.COLUMNS[C.FIRST_BYTES:-len(C.CALL_COLUMNS)]
_PARQUET_MAGIC = b"PAR1"


@functools.lru_cache(maxsize=None)
def _present(names: tuple[str, ...]) -> tuple[list[int], list[int]]:
    """The table columns of the fields a device's lines write before the
    spike flag and after it; its other fields are always empty."""
    spike = _BYTES_FIELDS.index("spike")
    return ([names.index(n) for n in _BYTES_FIELDS[:spike] if n in names],
            [names.index(n) for n in _BYTES_FIELDS[spike + 1:] if n in names])


class NotALogError(ValueError):
    """A file that is not a MemWatch log: empty, plain text, another
    program's CSV (Keras's `CSVLogger`), or values of the wrong kind."""


class CsvLog:
    """Appends samples to a new CSV file as training runs.

    Args:
        path: the file to create. It must not exist yet.
        process, hostname, call: written on every row. Defaults to `0`,
            `""` and `0`.

    Raises:
        FileExistsError: if `path` exists (`create_free` takes the next
            free name instead).
    """

    def __init__(self, path: PathLike, process: int = 0, hostname: str = "",
                 call: int = 0):
        self.path = os.fspath(path)
        self._tail = f",{process},{hostname},{call}\n"
        self._lines: dict[tuple, list[str]] = {}  # devices -> per phase
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        self._fd: Optional[int] = os.open(self.path, flags, 0o644)
        self._write(_HEADER)

    @classmethod
    def create_free(cls, path: PathLike, process: int = 0,
                    hostname: str = "", call: int = 0) -> CsvLog:
        """Creates `path`, or the first of `stem.1.csv`, `stem.2.csv`, ...
        that does not exist.

        Each name is tried by creating it exclusively, so a name another
        writer takes between two tries is skipped, never shared and never
        overwritten.

        Args:
            path: the name wanted.
            process, hostname, call: written on every row. Defaults to
                `0`, `""` and `0`.

        Returns:
            The open log; its `path` is the name it got.

        Raises:
            OSError: when the file cannot be created for another reason
                than its name being taken (a missing or read-only folder).
        """
        for candidate in numbered(path):
            try:
                return cls(candidate, process, hostname, call)
            except FileExistsError:
                continue
        raise FileExistsError(
            f"no free name among {os.fspath(path)} and its first {MAX_NAMES} "
            "numbered variants")

    def format(self, block: Block, devices: Sequence[str],
               columns: Sequence[Sequence[str]]) -> str:
        """The lines of a block of samples (one a device), for `write_text`.

        Args:
            block: the samples.
            devices: the block's devices, in table order.
            columns: the columns of each device's table.
        """
        n = len(block)
        if not n:
            return ""
        # A block has its timestamps (as the pipeline makes it) or none.
        stamped = not np.isnan(block.timestamp).any()
        head = np.column_stack([block.step, block.epoch, block.batch,
                                *_seconds(block.time_s),
                                *(_seconds(block.timestamp) if stamped else [])])
        numbers = []
        for table, spikes, names in zip(block.tables, block.spikes, columns):
            before, after = _present(tuple(names))
            numbers += [head, table[:, before], spikes[:, None], table[:, after]]
        key = (tuple(devices), tuple(map(tuple, columns)), stamped)
        lines = self._lines.get(key) or self._templates(key)
        phases = block.phase
        if (phases == phases[0]).all():
            template = lines[phases[0]] * n
        else:
            template = "".join([lines[p] for p in phases.tolist()])
        # Every value is a byte count, an index or a time, never negative:
        # -1 marks a missing one, written as an empty field.
        text = template % tuple(np.concatenate(numbers, axis=1).ravel().tolist())
        return text.replace(",-1", ",")

    def _templates(self, key: tuple) -> list[str]:
        """The `%` templates of one sample's lines, per phase."""
        devices, columns, stamped = key
        timestamp = "%d.%06d" if stamped else ""
        tail = self._tail.replace("%", "%%")
        lines = []
        for phase in C.PHASES:
            line = ""
            for device, names in zip(devices, columns):
                fields = ",".join("%d" if n == "spike" or n in names else ""
                                  for n in _BYTES_FIELDS)
                line += (f"%d,%d,%d,{phase},{device.replace('%', '%%')},%d.%06d,"
                         f"{timestamp},{fields}{tail}")
            lines.append(line)
        self._lines[key] = lines
        return lines

    def write_text(self, text: str) -> None:
        """Writes lines (of `format`) in one unbuffered system call."""
        self._write(text.encode())

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


def _seconds(values: np.ndarray) -> list[np.ndarray]:
    """Seconds as whole seconds and microseconds, for `%d.%06d`."""
    return list(np.divmod(np.rint(values * 1e6).astype(np.int64), 1_000_000))


def numbered(path: PathLike) -> Iterable[str]:
    """`path`, then `stem.1.ext`, `stem.2.ext`, ... (`MAX_NAMES` of them)."""
    path = os.fspath(path)
    stem, ext = os.path.splitext(path)
    yield path
    for n in range(1, MAX_NAMES + 1):
        yield f"{stem}.{n}{ext}"


def log_path_for(path: PathLike, process: int, process_count: int,
                 trial: Optional[str] = None) -> str:
    """The log file of one process: `{rank}` in `path` replaced by
    `process`; else, when several processes train, `stem.rank{N}.ext`;
    else `path` itself. Inside a KerasTuner trial, `.trial{ID}` then goes
    before the extension (`mem.trial3.csv`, characters other than letters,
    digits, `-` and `_` in the id replaced by `_`)."""
    path = os.fspath(path)
    if RANK_FIELD in path:
        path = path.replace(RANK_FIELD, str(process))
    elif process_count > 1:
        stem, ext = os.path.splitext(path)
        path = f"{stem}.rank{process}{ext}"
    if trial is not None:
        stem, ext = os.path.splitext(path)
        path = f"{stem}.trial{re.sub(r'[^A-Za-z0-9_-]', '_', trial)}{ext}"
    return path


def open_log(path: PathLike, process: int = 0, process_count: int = 1,
             hostname: str = "", earlier: Sequence[str] = (), call: int = 0,
             trial: Optional[str] = None) -> Optional[CsvLog]:
    """Opens the log of one call (`fit`, `evaluate` or `predict`) of this
    process; never raises.

    The name is `log_path_for(path, ...)`, or the next free one
    (`create_free`). Taking another name than the one wanted is logged
    once at WARNING, unless the wanted name is one this watch wrote itself
    (`earlier`: a later call of the same instance) or a KerasTuner trial's
    (another execution of the trial; the caller names the file).

    Returns:
        The open log, or `None` (with a WARNING) when no file could be
        created; training then goes on, recorded in memory only.
    """
    wanted = log_path_for(path, process, process_count, trial)
    try:
        log = CsvLog.create_free(wanted, process, hostname, call)
    except OSError as e:
        logger.warning("cannot create the log %s (%s); the record stays in "
                       "memory only", wanted, e)
        return None
    if log.path != wanted and wanted not in earlier and trial is None:
        logger.warning("%s exists (another process or job, or an earlier run); "
                       "this process writes %s instead", wanted, log.path)
    return log


# -- reading -----------------------------------------------------------------


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
    match = re.fullmatch(r"(.*?)(?:\.(\d+))?", stem)
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
