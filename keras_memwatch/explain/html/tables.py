"""The page's tables, as HTML: the spikes, the ways to fit, the answers of
an estimate, and key-value lists. Every value is escaped; bytes read in
binary units, as everywhere in text."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

import pandas as pd

from keras_memwatch.explain.html.timeline_figure import spike_event
from keras_memwatch.units import format_bytes

__all__ = ["key_values", "spikes_table", "table", "ways_table"]

#: Spikes listed one by one; the rest are counted.
MAX_SPIKES = 200


def _known(value: Any) -> bool:
    try:
        return value is not None and not pd.isna(value)
    except (TypeError, ValueError):  # a list or array: known
        return True


def cell(value: Any) -> str:
    """A value as escaped text ("" where missing)."""
    return html.escape(str(value)) if _known(value) else ""


def table(header: Sequence[str], rows: Iterable[Sequence[Any]],
          css: str = "") -> str:
    """An HTML table of already escaped cells."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>"
                   for row in rows)
    return (f'<table class="{css}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def key_values(items: Mapping[str, Any]) -> str:
    """A two-column table of names and values (a mapping's values as
    "key=value" lists)."""
    rows = []
    for name, value in items.items():
        if isinstance(value, Mapping):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        rows.append((cell(name), cell(value)))
    return table(("", ""), rows, "keys")


def spikes_table(spikes: pd.DataFrame, several: bool = False) -> str:
    """Each spike with its alert text, and the layer and input shape where
    the table names them; at most `MAX_SPIKES`, the rest counted.

    Args:
        spikes: the spike table (`MemWatch.spikes`), with `process` for a
            record of several processes.
        several: the record holds several processes: name each one.
    """
    if not len(spikes):
        return '<p class="none">No spikes: no step needed far more memory than usual.</p>'
    header = (["process"] if several else []) + [
        "device", "epoch", "batch", "phase", "call", "peak", "needed", "layer",
        "alert"]
    extra = "input_shape" in spikes.columns
    if extra:
        header.insert(-1, "input shape")
    rows = []
    for _, row in spikes.head(MAX_SPIKES).iterrows():
        event = spike_event(row)
        cells = ([cell(row.get("process"))] if several else []) + [
            cell(row["device"]), cell(row["epoch"]), cell(row["batch"]),
            cell(event.phase), cell(event.call), cell(format_bytes(event.peak_bytes)),
            cell(format_bytes(event.working_bytes)),
            cell(row.get("layer")) or '<span class="none">not named</span>']
        if extra:
            cells.append(cell(row.get("input_shape")))
        cells.append(cell(event.message))
        rows.append(cells)
    more = len(spikes) - MAX_SPIKES
    tail = f"<p>... and {more} more (all of them in the CSV).</p>" if more > 0 else ""
    return table(header, rows, "spikes") + tail


def _ratio(value: Any) -> str:
    return f"{float(value):.2f}x" if _known(value) else ""


def _fits(value: Any) -> str:
    if not _known(value):
        return ""
    return '<span class="yes">fits</span>' if bool(value) else '<span class="no">does not fit</span>'


def ways_table(ways: pd.DataFrame) -> str:
    """The ways-to-fit table (`ways_to_fit(...)`), one row per lever."""
    header = ["lever", "change", "need", "saved", "largest batch", "step time",
              "wanted batch", "how", "notes"]
    rows = []
    for _, w in ways.iterrows():
        rows.append([
            cell(w.get("lever")), f"<code>{cell(w.get('change'))}</code>",
            cell(format_bytes(w.get("need_bytes")) if _known(w.get("need_bytes")) else None),
            cell(format_bytes(w.get("saved_bytes")) if _known(w.get("saved_bytes")) else None),
            cell(w.get("largest_batch")), cell(_ratio(w.get("step_time_ratio"))),
            _fits(w.get("fits")), cell(w.get("how")), cell(w.get("notes"))])
    return table(header, rows, "ways")


def capacity_answers(capacity: Mapping[str, Any],
                     explanation: Optional[str] = None) -> str:
    """The answers of an estimate (`CapacityEstimate.to_dict()`) and how
    they were reached."""
    c = capacity
    items = {
        "largest batch that fits": c.get("predicted_batch_size"),
        "headroom kept free": (f"{c['headroom']:.0%}" if _known(c.get("headroom"))
                               else None),
        "ceiling (no headroom)": c.get("ceiling_batch_size"),
        "the small-batch line alone says": c.get("line_batch_size"),
        "XLA recomputes activations from batch": c.get("recomputes_from"),
        "device": c.get("device"), "backend": c.get("backend"),
        "measured by": c.get("measured_by"),
        "limit": (f"{format_bytes(c['limit_bytes'])} ({c.get('limit_detail', '')})"
                  if _known(c.get("limit_bytes")) else None),
        "in use before the steps": (format_bytes(c["in_use_bytes"])
                                    if _known(c.get("in_use_bytes")) else None),
        "no answer because": c.get("refusal") or None,
        "the ladder stopped": c.get("stopped") or None,
        "left open": c.get("unsettled") or None,
        "seconds": (f"{c['seconds']:.1f}" if _known(c.get("seconds")) else None),
    }
    out = key_values({k: v for k, v in items.items() if _known(v)})
    if explanation:
        out += f'<p class="explanation">{html.escape(explanation)}</p>'
    return out
