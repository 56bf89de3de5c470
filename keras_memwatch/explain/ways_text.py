"""The ways-to-fit table (`keras_memwatch.ways_to_fit`) for a person: its
columns, and its block of text in `summary()`, oom_guard's report and the
command line."""

from __future__ import annotations

import math
from typing import Any

from keras_memwatch.units import format_bytes

#: The table's columns, in order.
WAYS_COLUMNS = ("lever", "change", "need_bytes", "saved_bytes", "largest_batch",
                "step_time_ratio", "fits", "how", "notes")
#: The first row's lever: the model as it is.
AS_IS = "as is"
#: A training peak this close to the limit (a fraction of it) earns the
#: summary a pointer to `ways_to_fit` where none was measured.
NEAR_LIMIT = 0.1
#: How to measure the table, where none was measured.
HINT = ("Ways to fit: not measured in this process. What each change would "
        "save at your batch, measured on your model:\n"
        "  keras_memwatch.ways_to_fit(model, x[:n], y[:n], batch_size=B)\n"
        "  python -m keras_memwatch fit-check --model MODULE:FUNCTION --ways "
        "--batch-size B")


def _missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(value != value) or (isinstance(value, float) and math.isnan(value))
    except (TypeError, ValueError):  # pandas.NA compares to NA
        return True


def _cell(value: Any, kind: str) -> str:
    if _missing(value):
        return "-"
    if kind == "bytes":
        return format_bytes(int(value))
    if kind == "ratio":
        return f"x{float(value):.2f}"
    if kind == "bool":
        return "yes" if bool(value) else "no"
    return str(value)


def format_ways(table: Any, batch_size: Any = None) -> str:
    """The table as text: one line a row, then each row's change and notes.

    Args:
        table: the DataFrame `ways_to_fit` returns.
        batch_size: the wanted batch, named in the heading. Defaults to
            `None`: `table.attrs["batch_size"]` where present.

    Returns:
        Lines of text.
    """
    if batch_size is None:
        batch_size = table.attrs.get("batch_size")
    heading = "Ways to fit" + (f" a batch of {batch_size}" if batch_size else "")
    headroom = table.attrs.get("headroom")
    if headroom is not None:
        heading += f" (under {headroom:.0%} headroom)"
    rows = [["lever", "need", "saves", "largest batch", "step time", "fits", "how"]]
    for r in table.itertuples(index=False):
        rows.append([r.lever, _cell(r.need_bytes, "bytes"), _cell(r.saved_bytes, "bytes"),
                     _cell(r.largest_batch, "int"), _cell(r.step_time_ratio, "ratio"),
                     _cell(r.fits, "bool"), str(r.how)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [heading + ":"]
    for row in rows:
        cells = [c.ljust(w) if i in (0, 6) else c.rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  " + "  ".join(cells).rstrip())
    lines.append("What to write:")
    for r in table.itertuples(index=False):
        if r.lever == AS_IS:
            continue
        lines.append(f"  {r.lever}: {r.change}" if r.change else f"  {r.lever}:")
        if r.notes:
            lines.append(f"    ({r.notes})")
    return "\n".join(lines)
