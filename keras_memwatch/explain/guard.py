"""Out-of-memory forensics: what was happening when training died.

A Keras callback cannot catch the exception that ends `fit`: the framework
raises it out of the train step and Keras unwinds past every callback. So
the report is written by a context manager around `fit`:

```python
watch = MemWatch(log_path="mem.csv")
with oom_guard(watch):
    model.fit(x, y, callbacks=[watch])
```

When the block ends with an out-of-memory error (as `keras_memwatch.explain.oom`
recognises it), the guard writes `mem.oom.txt` (what the framework says it
tried to allocate, the memory at the failure, the last samples, the spikes,
and the summary with the breakdown) and `mem.oom.csv` (the whole record)
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
from keras_memwatch.explain.oom import (MAX_LINE, allocation_lines, error_text,
                                is_oom_error, requested_bytes)

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
    first = error_text(error).strip().splitlines()
    process, count, host = _process_of(watch)
    lines = [
        "keras_memwatch: training ran out of memory",
        f"exception: {kind.__module__}.{kind.__qualname__}: "
        f"{first[0][:MAX_LINE] if first else ''}",
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
    return ("Ways to fit: not measured in this process. What each change would "
            "save at your batch, measured on your model:\n"
            "  keras_memwatch.ways_to_fit(model, x[:n], y[:n], batch_size=B)\n"
            "  python -m keras_memwatch fit-check --model MODULE:FUNCTION --ways "
            "--batch-size B")
