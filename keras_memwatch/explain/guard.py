"""Out-of-memory forensics: what was happening when training died.

A Keras callback cannot catch the exception that ends `fit`: the framework
raises it out of the train step and Keras unwinds past every callback. So
the report is written by a context manager around `fit`:

```python
watch = MemWatch(log_path="mem.csv")
with oom_guard(watch):
    model.fit(x, y, callbacks=[watch])
```

When the block ends with an out-of-memory error (as `keras_memwatch.oom_errors`
recognises it), the guard writes `mem.oom.txt` (what the framework says it
tried to allocate, the memory at the failure, the last samples, the spikes,
and the summary with the breakdown) and `mem.oom.csv` (the whole record), and where plotly is installed
`mem.oom.html` (the page of the record, `explain.html`),
next to the watch's log (each process of a distributed run next to its
own log, `mem.rank1.oom.txt`, the report naming the process and host),
logs one ERROR line saying where, and lets the original exception go on,
unchanged (the same object, with its traceback). Without a log and
without `report_dir`, the report goes into a new folder under the
system's temporary directory (never the working directory), and the
ERROR line says which. Any other exception passes through untouched and
nothing is written.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from typing import Any, Optional, Union

from keras_memwatch import options
from keras_memwatch.explain.ways_text import HINT
from keras_memwatch.measure.batches import wait_for_steps
from keras_memwatch.oom_errors import (allocation_lines, first_line, is_oom_error,
                                requested_bytes)

logger = logging.getLogger("keras_memwatch")

PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["OomGuard", "oom_guard", "oom_report_text", "ways_lines", "write_oom_report"]

def _last_samples(frame: Any, last_n: int) -> str:
    """The last `last_n` samples (every device), in MiB."""
    import pandas as pd

    from keras_memwatch.judge.derived import reserved_unallocated, working_memory_of

    steps = sorted(frame["step"].unique())[-(last_n + 1):]
    tail = frame[frame["step"].isin(steps)].sort_values("step", kind="stable")
    working = pd.concat([working_memory_of(rows) for _, rows in
                         tail.groupby("device", observed=True)])
    table = tail[["step", "epoch", "batch", "phase", "device"]].copy()
    columns = [("peak MiB", tail["peak_bytes"]), ("in use MiB", tail["current_bytes"]),
               ("working MiB", working)]
    if tail["allocator_reserved_bytes"].notna().any():
        columns.append(("reserved but unallocated MiB", reserved_unallocated(tail)))
    if tail["plan_bytes"].notna().any():
        columns.append(("XLA plan MiB", tail["plan_bytes"]))
    for title, values in columns:
        table[title] = (values.astype("float64") / 2**20).round(1)
    table["spike"] = tail["spike"].map({True: "SPIKE", False: ""})
    table = table[tail["step"].isin(steps[-last_n:])]
    text = table.to_string(index=False, na_rep="")
    return "\n".join("  " + line for line in text.splitlines())


def _now(watch: Any) -> list[str]:
    """One fresh sample of the watch's live probes, at the failure, so the
    peaks since the last sample (the step that died) are not lost. Nothing
    when no fit is running (its probes are closed then)."""
    from keras_memwatch.judge.derived import device_limit
    from keras_memwatch.units import format_bytes

    lines = []
    for device, row in watch.sample_now().items():
        limit, _ = device_limit(row)
        reserved, allocated = (row.get("allocator_reserved_bytes"),
                               row.get("allocator_current_bytes"))
        lines.append(
            f"  {device}: in use {format_bytes(row.get('current_bytes'))}, peak since "
            f"the last sample {format_bytes(row.get('peak_bytes'))}"
            + (f", limit {format_bytes(limit)}" if limit else "")
            + (f", reserved but unallocated {format_bytes(max(reserved - allocated, 0))}"
               if reserved is not None and allocated is not None else ""))
    return lines


def oom_report_text(watch: Any, error: BaseException, last_n: int = 20,
                    deferred: bool = False) -> str:
    """The out-of-memory report for a person.

    Each section that cannot be computed says why instead; this function
    does not raise for a watch that recorded nothing.

    Args:
        watch: the `MemWatch` that watched the failed `fit`.
        error: the out-of-memory exception.
        last_n: samples listed before the failure. Defaults to `20`.
        deferred: the error surfaced only when the model's variables were
            awaited after `fit` (JAX runs steps asynchronously), so the step
            that failed is among the last ones sampled. Defaults to `False`.

    Returns:
        The report, several lines.
    """
    import pandas as pd

    from keras_memwatch.units import format_bytes

    kind = type(error)
    process, count, host = _process_of(watch)
    lines = [
        "keras_memwatch: training ran out of memory",
        f"exception: {kind.__module__}.{kind.__qualname__}: {first_line(error)}",
        f"process: {process} of {count}, on {host or 'an unknown host'}",
        "",
        "What the framework says it tried to allocate, and where:",
    ]
    said = allocation_lines(error)
    lines += [f"  {line}" for line in said] or ["  (the message states no allocation)"]
    size = requested_bytes(error)
    if size is not None:
        lines.append(f"  requested: {format_bytes(size)} ({size} bytes)")

    try:
        now = _now(watch)
    except Exception as e:
        now = [f"  (not available: {e!r})"]
    if now:
        lines += ["", "Memory at the failure (sampled now):"] + now

    try:
        frame = watch.to_dataframe()
    except Exception as e:
        lines += ["", f"No record: {e!r}"]
        return "\n".join(lines) + "\n"
    if frame.empty:
        lines += ["", "No samples were recorded before the failure."]
        return "\n".join(lines) + "\n"
    last = frame.sort_values("step").iloc[-1]
    batch = last["batch"]
    if deferred:
        where = (f"JAX reported the error only when the model's variables were "
                 f"awaited after the guarded block (its steps run asynchronously), "
                 f"so the step that failed is among the last ones sampled (the last: "
                 f"epoch {last['epoch']} batch {batch})")
    elif pd.isna(batch):
        where = "at train begin, before the first batch was sampled"
    else:
        where = (f"after epoch {last['epoch']} batch {batch} ({last['phase']}), the "
                 "last sample; the step that failed was not sampled")
    lines += ["", f"Where: {where}.", "", f"Last {last_n} samples:"]
    try:
        lines.append(_last_samples(frame, last_n))
    except Exception as e:
        lines.append(f"  (not available: {e!r})")
    lines += ["", "Spikes:"]
    try:
        spikes = watch.spikes
        if len(spikes):
            lines.append("  " + spikes.to_string(index=False).replace("\n", "\n  "))
        else:
            lines.append("  none")
    except Exception as e:
        lines.append(f"  (not available: {e!r})")
    try:
        lines += ["", watch.summary()]
    except Exception as e:
        lines += ["", f"(summary not available: {e!r})"]
    hint = ways_lines(watch)
    if hint:
        lines += ["", hint]
    return "\n".join(lines) + "\n"


def ways_lines(watch: Any) -> str:
    """The report's ways-to-fit hint: `""` where the watch holds a table
    (`watch.ways`, from `MemWatch.ways_to_fit`; its summary, above in the
    report, shows it), else how to measure one."""
    if getattr(watch, "ways", None) is not None:
        return ""
    return HINT


def _process_of(watch: Any) -> tuple[int, int, str]:
    """`(process, process_count, hostname)` of the watch's last fit; asked
    of the framework when the watch never started one."""
    from keras_memwatch.configure.ranks import hostname, process_index_and_count

    host = getattr(watch, "hostname", "") or ""
    if host:
        return (int(getattr(watch, "process", 0)),
                int(getattr(watch, "process_count", 1)), host)
    process, count = process_index_and_count()
    return process, count, hostname()


def _report_place(watch: Any, report_dir: Optional[PathLike]) -> tuple[str, str]:
    """`(folder, stem)` of the report: the log's folder and name (this
    process's log), else `report_dir` and `memwatch` (`memwatch.rank{N}`
    with several processes), else a new temporary folder."""
    from keras_memwatch.record.csvlog import log_path_for

    process, count, _ = _process_of(watch)
    paths = list(getattr(watch, "log_paths", None) or [])
    log_path = paths[-1] if paths else getattr(watch, "log_path", None)
    if not paths and log_path is not None:  # no fit opened it: this process's name
        log_path = log_path_for(log_path, process, count)
    if log_path is not None:
        folder, name = os.path.split(os.fspath(log_path))
        folder, stem = folder or ".", os.path.splitext(name)[0]
    else:
        folder, stem = None, "memwatch" if count == 1 else f"memwatch.rank{process}"
    if report_dir is not None:
        folder = os.fspath(report_dir)
    if folder is None:
        folder = tempfile.mkdtemp(prefix="keras_memwatch-oom-")
    return folder, stem


def _create_report_files(folder: str, stem: str) -> tuple[str, str, Any, Any]:
    """Creates `<stem>.oom.txt` and `<stem>.oom.csv` in `folder`, or the
    first free `<stem>.oom.N.*` pair: each file exclusively, so two
    processes writing into one folder never share or replace a report."""
    os.makedirs(folder, exist_ok=True)
    for n in range(100_000):
        tag = f"{stem}.oom" if n == 0 else f"{stem}.oom.{n}"
        txt = os.path.join(folder, f"{tag}.txt")
        csv = os.path.join(folder, f"{tag}.csv")
        try:
            text_file = open(txt, "x", encoding="utf-8")
        except FileExistsError:
            continue
        try:
            csv_file = open(csv, "x", encoding="utf-8", newline="")
        except BaseException as e:  # give the pair's first half back
            text_file.close()
            os.remove(txt)
            if isinstance(e, FileExistsError):
                continue
            raise
        return txt, csv, text_file, csv_file
    raise FileExistsError(f"no free report name for {stem}.oom in {folder}")


def write_oom_report(
    watch: Any,
    error: BaseException,
    report_dir: Optional[PathLike] = None,
    last_n: int = 20,
    deferred: bool = False,
) -> tuple[str, str]:
    """Writes the out-of-memory report (text) and the record (CSV).

    Args:
        watch: the `MemWatch` that watched the failed `fit`.
        error: the out-of-memory exception.
        report_dir: write there (created if needed). Defaults to `None`:
            next to this process's log, else in a new folder under the
            system's temporary directory (`tempfile.mkdtemp`).
        last_n: samples listed before the failure. Defaults to `20`.
        deferred: the error surfaced after the block (JAX's asynchronous
            steps); the report says so. Defaults to `False`.

    Returns:
        The paths written: `(<stem>.oom.txt, <stem>.oom.csv)`, where `<stem>`
        is this process's log's name without `.csv` (else `memwatch`, or
        `memwatch.rank{N}` with several processes); an existing report is
        never overwritten (`<stem>.oom.1.txt`, ...: each file is created
        exclusively).

    Raises:
        OSError: when the files cannot be written.
    """
    text = oom_report_text(watch, error, last_n, deferred)
    try:
        frame = watch.to_dataframe()
    except Exception:
        from keras_memwatch.record.recorder import empty_frame

        frame = empty_frame()
    txt, csv, text_file, csv_file = _create_report_files(
        *_report_place(watch, report_dir))
    with text_file:
        text_file.write(text)
    with csv_file:
        frame.to_csv(csv_file, index=False)
    return txt, csv


def _deferred_error(watch: Any) -> Optional[BaseException]:
    """Waits for the model's variables under JAX; returns what that raises.

    Keras runs JAX steps asynchronously when every callback is async-safe
    (MemWatch is), so an allocation that fails inside a step may surface
    only when its results are awaited, after `fit` has returned.
    """
    model = getattr(watch, "model", None)
    if "jax" not in sys.modules or model is None:
        return None
    try:
        wait_for_steps(model)
    except Exception as e:
        return e
    return None


class OomGuard(contextlib.ContextDecorator):
    """Writes an out-of-memory report when the guarded block runs out of memory.

    Use `oom_guard(watch)` (or `MemWatch.guard()`) to make one. The
    exception is never swallowed, replaced or chained: the guard only looks
    at it, writes the report and lets it go on. The report's failure (a
    read-only folder) is logged as a warning, never raised over the
    out-of-memory error.

    Attributes:
        watch: the `MemWatch` whose record goes into the report.
        report_dir: where the report goes (`None`: next to the log, else a
            new temporary folder).
        last_n: samples listed in the report.
        report_paths: `(txt, csv)` written by the last out-of-memory exit,
            else `()`.
        html_path: the page of the record written beside them
            (`<stem>.oom.html`, see `MemWatch.report_html`), else `None`
            (none written, or plotly is not installed).
        error: the out-of-memory exception seen last, else `None`.
        deferred: whether that error surfaced only when the guard waited for
            the model's variables at the end of the block (JAX).
    """

    def __init__(self, watch: Any, report_dir: Optional[PathLike] = None,
                 last_n: int = 20):
        self.watch = watch
        self.report_dir = options.path("report_dir", report_dir, optional=True)
        self.last_n = options.positive_int("last_n", last_n)
        self.report_paths: tuple[str, ...] = ()
        self.html_path: Optional[str] = None
        self.error: Optional[BaseException] = None
        self.deferred = False

    def __enter__(self) -> OomGuard:
        self.report_paths = ()
        self.html_path = None
        self.error = None
        self.deferred = False
        return self

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> bool:
        if exc is None:
            deferred = _deferred_error(self.watch)
            if deferred is None or not is_oom_error(deferred):
                return False
            self.deferred = True
            self._report(deferred)
            raise deferred  # JAX's own exception, raised where it surfaced
        if is_oom_error(exc):
            self._report(exc)
        return False  # the original exception goes on, unchanged

    def _report(self, error: BaseException) -> None:
        self.error = error
        try:
            self.report_paths = write_oom_report(self.watch, error, self.report_dir,
                                                 self.last_n, deferred=self.deferred)
        except Exception as e:
            logger.warning("out of memory, and the report could not be written: %r", e)
            return
        process, count, host = _process_of(self.watch)
        logger.error("%straining ran out of memory (%s); report written to %s and %s",
                     f"process {process} on {host}: " if count > 1 else "",
                     type(error).__name__, *self.report_paths)
        # Keras does not call `on_train_end` when `fit` raises: let the watch
        # close its probes and its streamed log, where it offers a way.
        close = getattr(self.watch, "close", None)
        if callable(close):
            try:
                close()
            except Exception as e:
                logger.debug("closing the watch failed: %r", e)
        self.html_path = _write_page(self.watch, self.report_paths[0])


def _write_page(watch: Any, txt: str) -> Optional[str]:
    """The page of the record beside the text report (`mem.oom.txt` gives
    `mem.oom.html`), where plotly is installed; never raises."""
    path = os.path.splitext(txt)[0] + ".html"
    try:
        from keras_memwatch.explain.html import write_watch_report

        written = write_watch_report(watch, path)
        logger.info("the page of the record: %s", written)
        return written
    except ImportError as e:
        logger.info("no HTML page beside the out-of-memory report: %s", e)
    except Exception as e:
        logger.warning("the HTML page of the out-of-memory report could not be "
                       "written: %r", e)
    return None


def oom_guard(watch: Any, report_dir: Optional[PathLike] = None, *,
              last_n: int = 20) -> OomGuard:
    """Guards a `fit` call: on out-of-memory, writes a report of what was happening.

    On JAX, a step that runs out of memory can end `fit` without an
    exception (its failure surfaces only when its results are awaited, and
    Keras drops the logs it cannot read); the guard awaits them and raises
    it. Without a guard, the watch logs it as an error at train end.

    Args:
        watch: the `MemWatch` passed to `fit`'s callbacks.
        report_dir: write the report there. Defaults to `None`: next to
            this process's log (`mem.csv` gives `mem.oom.txt`,
            `mem.oom.csv` and, with plotly, `mem.oom.html`; `mem.rank1.csv`, `mem.rank1.oom.*`), else, for a
            watch without `log_path`, in a new folder under the system's
            temporary directory (`keras_memwatch-oom-*/memwatch.oom.*`),
            never the working directory; the ERROR line it logs says where.
        last_n: samples listed in the report. Defaults to `20`.

    Returns:
        An `OomGuard`, a context manager (and decorator).

    Raises:
        TypeError: for a `report_dir` that is not a path, or a `last_n`
            that is not an integer.
        ValueError: for a `last_n` below 1.

    Example:

    ```python
    watch = MemWatch(log_path="mem.csv")
    with oom_guard(watch):
        model.fit(x, y, callbacks=[watch])   # OOM: mem.oom.txt, mem.oom.csv
    ```
    """
    return OomGuard(watch, report_dir, last_n)
