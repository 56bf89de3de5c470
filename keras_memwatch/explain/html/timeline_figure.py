"""A timeline panel's figure: its traces (filled in the page by
`timeline.js`), the spikes, and the lines of its layout."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from keras_memwatch import columns as C
from keras_memwatch.explain.html.library import plotly_objects
from keras_memwatch.explain.html.timeline import Panel
from keras_memwatch.explain.plot import (LABEL_BASELINE, LABEL_CALL, LABEL_EPOCH,
                                         LABEL_IN_USE, LABEL_LIMIT, LABEL_PREDICT,
                                         LABEL_SPIKE, LABEL_VALIDATION)
from keras_memwatch.judge.events import SpikeEvent, against_usual
from keras_memwatch.units import MIB, format_bytes

__all__ = ["spike_text", "timeline_figure"]

#: Each shaded phase's label and colour.
_SHADED = {"test": (LABEL_VALIDATION, "rgba(128,128,128,0.12)"),
           "predict": (LABEL_PREDICT, "rgba(148,103,189,0.12)")}


def _known(value: Any) -> bool:
    return value is not None and not pd.isna(value)


def spike_event(row: pd.Series) -> SpikeEvent:
    """The `SpikeEvent` of a spike table's row (its alert text, `message`)."""
    return SpikeEvent(int(row["step"]), int(row["epoch"]),
                      None if not _known(row["batch"]) else int(row["batch"]),
                      str(row["device"]), int(row["peak_bytes"]),
                      int(row["baseline_bytes"]), int(row["working_bytes"]),
                      int(row["usual_working_bytes"]), str(row.get("phase", "train")),
                      int(row.get("call", 0)))


def spike_text(row: pd.Series) -> str:
    """A spike's hover text: where, peak against baseline, what it needed,
    and the layer and input shape where the table names them."""
    lines = [f"<b>{LABEL_SPIKE}</b> at epoch {row['epoch']} batch {row['batch']} "
             f"({row.get('phase', 'train')}, call {row.get('call', 0)}, "
             f"step {row['step']})",
             f"peak {format_bytes(row['peak_bytes'])} vs baseline "
             f"{format_bytes(row['baseline_bytes'])}"]
    working, usual = row.get("working_bytes"), row.get("usual_working_bytes")
    if _known(working) and _known(usual):
        lines.append(f"needed {format_bytes(working)}, "
                     f"{against_usual(float(working), float(usual))}")
    for column, name in (("layer", "layer"), ("input_shape", "input shape")):
        if _known(row.get(column)):
            lines.append(f"{name}: {row[column]}")
    return "<br>".join(lines)


def _vlines(xs: Any, dash: str, colour: str, label: str) -> list[dict]:
    return [dict(type="line", xref="x", yref="paper", x0=x, x1=x, y0=0, y1=1,
                 line=dict(color=colour, width=1, dash=dash), name=label)
            for x in xs]


def _shapes(panel: Panel) -> list[dict]:
    rows, x = panel.rows, pd.Series(panel.arrays["x"], index=panel.rows.index)
    train = rows["phase"] == "train"
    starts = x[train].groupby(rows.loc[train, "epoch"]).min().sort_index().to_numpy()
    shapes = _vlines(starts[1:], "dot", "gray", LABEL_EPOCH)
    calls = x.groupby(rows[C.CALL]).min().sort_index().to_numpy()[1:]
    shapes += _vlines(calls - 0.5, "dashdot", "black", LABEL_CALL)
    for phase, (label, colour) in _SHADED.items():
        shaded = rows["phase"] == phase
        if not shaded.any():
            continue
        runs = (shaded != shaded.shift()).cumsum()[shaded]
        for _, run in x[shaded].groupby(runs):
            shapes.append(dict(type="rect", xref="x", yref="paper", x0=run.min() - 0.5,
                               x1=run.max() + 0.5, y0=0, y1=1, fillcolor=colour,
                               line=dict(width=0), layer="below", name=label))
    return shapes


def timeline_figure(panel: Panel, calls: int) -> Any:
    """The figure of one panel: the traces `timeline.js` fills (the
    baseline band, the peak, the memory in use), the spikes, the epoch and call
    starts, the test and predict phases shaded, and the device's limit.

    Args:
        panel: the panel.
        calls: how many calls the record holds (names the x axis).

    Returns:
        A `plotly.graph_objects.Figure`.
    """
    go = plotly_objects()
    fig = go.Figure()
    fig.add_trace(go.Scatter(mode="lines", fill="toself", hoverinfo="skip",
                             fillcolor="rgba(44,160,44,0.25)",
                             line=dict(width=0.6, color="rgb(44,160,44)"),
                             name=LABEL_BASELINE))
    fig.add_trace(go.Scatter(mode="lines", line=dict(width=1.3, color="#d62728"),
                             name=panel.peak_label,
                             hovertemplate="%{text}<extra></extra>"))
    fig.add_trace(go.Scatter(mode="lines", line=dict(width=1.3, color="#1f77b4"),
                             name=LABEL_IN_USE, hovertemplate="%{text}<extra></extra>"))
    spikes = panel.spikes
    fig.add_trace(go.Scatter(
        x=spikes["x"].astype(int).tolist() if len(spikes) else [],
        y=(spikes["peak_bytes"].astype("float64") / MIB).tolist() if len(spikes) else [],
        mode="markers", name=f"{LABEL_SPIKE} ({len(spikes)})",
        marker=dict(symbol="triangle-down", size=11, color="black"),
        hovertext=[spike_text(row) for _, row in spikes.iterrows()],
        hovertemplate="%{hovertext}<extra></extra>"))
    peak = panel.arrays["peak"]
    current = panel.arrays["current"]
    finite = np.concatenate([peak[np.isfinite(peak)], current[np.isfinite(current)]])
    high = float(finite.max()) if len(finite) else 0.0
    top = panel.limit_bytes
    title = f"{panel.title}: peak {format_bytes(np.nanmax(peak)) if np.isfinite(peak).any() else 'n/a'}"
    shapes = _shapes(panel)
    y_top = high * 1.15 or MIB
    if top is not None:
        if top <= 2.5 * high:
            y_top = max(top, high) * 1.08
            shapes.append(dict(type="line", xref="paper", yref="y", x0=0, x1=1,
                               y0=top / MIB, y1=top / MIB, name=LABEL_LIMIT,
                               line=dict(color="black", width=1, dash="dash")))
            title += f"; {LABEL_LIMIT} {format_bytes(top)}"
        else:
            title += (f"; {LABEL_LIMIT} {format_bytes(top)} (above the chart; "
                      f"headroom {format_bytes(top - high)})")
    fig.update_layout(
        template="plotly_white", height=360, title=dict(text=title, x=0.01, font_size=14),
        margin=dict(l=60, r=20, t=50, b=45), hovermode="closest", shapes=shapes,
        legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right"),
        xaxis=dict(title="step (one per sampled batch)" if calls <= 1 else
                   "sampled batch (the calls one after another)"),
        yaxis=dict(title="MiB", range=[0, y_top / MIB], rangemode="tozero"),
        uirevision="timeline")
    return fig
