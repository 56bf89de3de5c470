"""The streamed CSV log: written a block of samples at a time, read back by
`log_reader.load_log`.

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
it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any, Optional, Union

import numpy as np

from keras_memwatch import columns as C
from keras_memwatch import options
from keras_memwatch.configure.ranks import process_index_and_count
from keras_memwatch.record.block import Block

logger = logging.getLogger("keras_memwatch")

PathLike = Union[str, "os.PathLike[str]"]

#: Replaced by the process index in a `log_path`.
RANK_FIELD = "{rank}"

#: Names `create_free` tries after the first (`stem.1.csv`, ...) before
#: giving up: far more than any folder holds.
MAX_NAMES = 100_000

_HEADER = (",".join(C.COLUMNS) + "\n").encode()
_BYTES_FIELDS = C.COLUMNS[C.FIRST_BYTES:-len(C.CALL_COLUMNS)]


@functools.lru_cache(maxsize=None)
def _present(names: tuple[str, ...]) -> tuple[list[int], list[int]]:
    """The table columns of the fields a device's lines write before the
    spike flag and after it; its other fields are always empty."""
    spike = _BYTES_FIELDS.index("spike")
    return ([names.index(n) for n in _BYTES_FIELDS[:spike] if n in names],
            [names.index(n) for n in _BYTES_FIELDS[spike + 1:] if n in names])


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


def checked_log_path(name: str, value: Any) -> Optional[str]:
    """A new `.csv` file in an existing, writable folder.

    `{rank}` in the path stands for the process index (each process of a
    distributed run writes its own file). An existing file is refused here
    only for one process and a path without `{rank}`: where several
    processes train, each takes its own name at train begin (`mem.csv` ->
    `mem.rank{N}.csv`, the next free number if that is taken too), so that
    no process fails alone while the others wait for it.
    """
    if options.path(name, value, optional=True) is None:
        return None
    full = os.path.abspath(os.fspath(value))
    if not full.lower().endswith(".csv"):
        raise options.expected(name, "a path ending in .csv", value)
    process, count = process_index_and_count()
    folder = os.path.dirname(full.replace(RANK_FIELD, str(process)))
    if not os.path.isdir(folder):
        raise options.expected(name, f"a path in an existing folder ({folder} does not exist)",
                       value)
    if not os.access(folder, os.W_OK):
        raise options.expected(name, f"a path in a writable folder ({folder} is not writable)",
                       value)
    if RANK_FIELD not in full and count == 1 and os.path.lexists(full):
        raise FileExistsError(
            f"Expected `{name}` to be a new file: MemWatch never overwrites a "
            f"log. Received: {name}={value!r}, which exists. Delete it or "
            "choose another path."
        )
    return full


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


