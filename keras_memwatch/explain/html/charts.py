"""The page's other figures: where the memory went, by layer, and what fits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import pandas as pd

from keras_memwatch.explain.html.library import plotly_objects
from keras_memwatch.explain.layers.table import REST
from keras_memwatch.units import MIB, format_bytes

__all__ = ["breakdown_figure", "by_layer_figure", "capacity_figure"]

#: Layers drawn one by one; the others share one bar.
TOP_LAYERS = 15

_LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=50, b=45))


def _known(value: Any) -> bool:
    return value is not None and not pd.isna(value)


def breakdown_figure(breakdown: Mapping[str, Any]) -> Optional[Any]:
    """The breakdown of the main device as stacked bars: a typical step and
    the largest one, each made of weights, optimizer state, the rest of
    the memory in use between steps, and the step's working memory.

    Args:
        breakdown: `memory_breakdown(...)`.

    Returns:
        A figure, or `None` where nothing of it is known.
    """
    b = breakdown
    in_use = b.get("in_use_bytes")
    parts: list[tuple[str, Any, str]] = []
    if _known(b.get("weights_bytes")):
        parts.append(("weights", b["weights_bytes"], "#4c72b0"))
        if _known(b.get("optimizer_bytes")):
            parts.append((f"optimizer state ({b.get('optimizer') or '?'})",
                          b["optimizer_bytes"], "#8172b2"))
        static = b.get("static_bytes")
        if _known(in_use) and _known(static) and in_use >= static:
            parts.append(("rest in use between steps", in_use - static, "#9e9e9e"))
    elif _known(in_use):
        parts.append(("in use between steps", in_use, "#9e9e9e"))
    working = [("typical step", b.get("transient_bytes"))]
    at = b.get("transient_max_at")
    if _known(b.get("transient_max_bytes")):
        where = f" (epoch {at[0]} batch {at[1]})" if at else ""
        working.append((f"largest step{where}", b["transient_max_bytes"]))
    working = [(name, value) for name, value in working if _known(value)]
    if not parts and not working:
        return None
    go = plotly_objects()
    fig = go.Figure()
    bars = [name for name, _ in working] or ["in use between steps"]
    for name, value, colour in parts:
        fig.add_trace(go.Bar(
            y=bars, x=[value / MIB] * len(bars), name=name, orientation="h",
            marker_color=colour, hovertext=[f"{name}: {format_bytes(value)}"] * len(bars),
            hovertemplate="%{hovertext}<extra></extra>"))
    if working:
        fig.add_trace(go.Bar(
            y=bars, x=[value / MIB for _, value in working],
            name="step working memory", orientation="h", marker_color="#dd8452",
            hovertext=[f"working memory of the {name}: {format_bytes(value)}"
                       for name, value in working],
            hovertemplate="%{hovertext}<extra></extra>"))
    limit = (b.get("devices") or {}).get(b.get("device"), {}).get("limit_bytes")
    shapes = []
    widest = max((sum(v for _, v, _ in parts) + value for _, value in working),
                 default=sum(v for _, v, _ in parts))
    if _known(limit) and limit <= 2.5 * widest:
        shapes.append(dict(type="line", xref="x", yref="paper", x0=limit / MIB,
                           x1=limit / MIB, y0=0, y1=1,
                           line=dict(color="black", dash="dash", width=1)))
    fig.update_layout(
        barmode="stack", height=120 + 60 * len(bars), shapes=shapes, **_LAYOUT,
        title=dict(text=f"Where the memory went on {b.get('device') or 'the device'}"
                   + (f" (limit {format_bytes(limit)}{', dashed' if shapes else ''})"
                      if _known(limit) else ""),
                   x=0.01, font_size=14),
        xaxis=dict(title="MiB"), legend=dict(orientation="h", y=-0.35))
    return fig


def by_layer_figure(table: pd.DataFrame) -> Any:
    """The by-layer table as bars: each of the `TOP_LAYERS` largest layers'
    activations and gradients, the other layers together, and the rest
    (the step's working memory that no layer holds), labelled.

    Args:
        table: `memory_by_layer(...)` or `MemWatch.by_layer()`.

    Returns:
        A figure.
    """
    go = plotly_objects()
    layers = table[table["layer"] != REST]
    top = layers.sort_values("working_bytes", ascending=False, kind="stable").head(TOP_LAYERS)
    names = [f"{r['layer']} ({r['class']})" for _, r in top.iterrows()]
    activations = [float(v) if _known(v) else 0.0 for v in top["activation_bytes"]]
    grads = [float(v) if _known(v) else 0.0 for v in top["grad_bytes"]]
    shapes = [str(v) for v in top["output_shape"]]
    others = layers.drop(top.index)
    if len(others):
        names.append(f"{len(others)} other layers")
        activations.append(float(others["activation_bytes"].fillna(0).sum()))
        grads.append(float(others["grad_bytes"].fillna(0).sum()))
        shapes.append("")
    rest = table.loc[table["layer"] == REST, "working_bytes"]
    rest_bytes = rest.iloc[0] if len(rest) else None
    fig = go.Figure()
    fig.add_trace(go.Bar(
        y=names, x=[a / MIB for a in activations], orientation="h",
        name="activations kept for the backward pass", marker_color="#dd8452",
        hovertext=[f"{n}: activations {format_bytes(a)}, output {s}"
                   for n, a, s in zip(names, activations, shapes)],
        hovertemplate="%{hovertext}<extra></extra>"))
    fig.add_trace(go.Bar(
        y=names, x=[g / MIB for g in grads], orientation="h", name="gradients",
        marker_color="#55a868",
        hovertext=[f"{n}: gradients {format_bytes(g)}" for n, g in zip(names, grads)],
        hovertemplate="%{hovertext}<extra></extra>"))
    if _known(rest_bytes):
        fig.add_trace(go.Bar(
            y=[REST], x=[float(rest_bytes) / MIB], orientation="h", name="rest",
            marker_color="#9e9e9e", hovertext=[f"{REST}: {format_bytes(rest_bytes)}"],
            hovertemplate="%{hovertext}<extra></extra>"))
    total = table.attrs.get("working_bytes")
    title = "Where a step's working memory goes, by layer"
    if _known(total):
        title += (f": {format_bytes(total)} "
                  f"({table.attrs.get('working_source') or 'measured'})")
    fig.update_layout(
        barmode="relative", height=160 + 26 * (len(names) + 1), **_LAYOUT,
        title=dict(text=title, x=0.01, font_size=14), xaxis=dict(title="MiB"),
        yaxis=dict(autorange="reversed", automargin=True),
        legend=dict(orientation="h", y=-0.2))
    return fig


def capacity_figure(capacity: Mapping[str, Any]) -> Any:
    """The estimate's evidence: each observation's need against its batch
    (marked by whether it ran or fit, and how it was obtained), the
    small-batch line, the room under the whole limit and under the
    headroom, and the answers.

    Args:
        capacity: `CapacityEstimate.to_dict()`.

    Returns:
        A figure.
    """
    go = plotly_objects()
    c = capacity
    observations = pd.DataFrame(c.get("observations") or [],
                                columns=["batch_size", "need_bytes", "how", "ran",
                                         "ladder", "result"])
    fig = go.Figure()
    symbols = {"step": "circle", "job": "square", "plan": "diamond",
               "aimed plan": "diamond-open"}
    failed = {"out of memory", "over the limit"}
    for result, rows in observations.groupby(
            observations["result"].fillna(
                observations["ran"].map({True: "ran", False: "out of memory"})),
            sort=False):
        bad = result in failed
        fig.add_trace(go.Scatter(
            x=rows["batch_size"], mode="markers", name=str(result),
            y=[float(v) / MIB if _known(v) else None for v in rows["need_bytes"]],
            marker=dict(size=11, color="#c44e52" if bad else "#55a868",
                        symbol=[symbols.get(h, "circle") for h in rows["how"]]),
            hovertext=[f"batch {b}: {format_bytes(n) if _known(n) else 'not read'}, "
                       f"{h}{' (ladder)' if lad else ''}: {result}"
                       for b, n, h, lad in zip(rows["batch_size"], rows["need_bytes"],
                                              rows["how"], rows["ladder"])],
            hovertemplate="%{hovertext}<extra></extra>"))
    sizes = [int(v) for v in observations["batch_size"]] + [
        int(v) for v in (c.get("predicted_batch_size"), c.get("ceiling_batch_size"))
        if _known(v)]
    right = max(sizes, default=1) * 1.1 + 1
    per_sample, static = c.get("per_sample_bytes"), c.get("step_static_bytes")
    if _known(per_sample) and _known(static):
        fig.add_trace(go.Scatter(
            x=[0, right], y=[static / MIB, (static + per_sample * right) / MIB],
            mode="lines", name="small-batch line", line=dict(color="gray", dash="dot"),
            hovertext=[f"{format_bytes(static)} + {format_bytes(per_sample)} per sample"] * 2,
            hovertemplate="%{hovertext}<extra></extra>"))
    shapes, notes = [], []
    limit, in_use = c.get("limit_bytes"), c.get("in_use_bytes") or 0
    headroom = c.get("headroom") or 0.0
    if _known(limit):
        for room, dash, name in ((limit - in_use, "dash", "room under the whole limit"),
                                 (limit * (1 - headroom) - in_use, "dot",
                                  f"room under {headroom:.0%} headroom")):
            shapes.append(dict(type="line", xref="paper", yref="y", x0=0, x1=1,
                               y0=room / MIB, y1=room / MIB,
                               line=dict(color="black", dash=dash, width=1)))
            notes.append(dict(xref="paper", x=0.0, xanchor="left", y=room / MIB,
                              yanchor="bottom", showarrow=False, font_size=11,
                              text=f"{name} ({format_bytes(room)})"))
    for key, name in (("predicted_batch_size", "answer"),
                      ("ceiling_batch_size", "ceiling")):
        value = c.get(key)
        if _known(value):
            shapes.append(dict(type="line", xref="x", yref="paper", x0=value, x1=value,
                               y0=0, y1=1, line=dict(color="#4c72b0", width=1)))
            notes.append(dict(xref="x", x=value, yref="paper", y=1.0, showarrow=False,
                              yanchor="bottom", text=f"{name} {value}", font_size=11))
    fig.update_layout(
        height=380, shapes=shapes, annotations=notes, **_LAYOUT,
        title=dict(text=f"What fits on {c.get('device', 'the device')}: the need "
                        "of a step against its batch", x=0.01, font_size=14),
        xaxis=dict(title="batch size", rangemode="tozero"),
        yaxis=dict(title="MiB beyond the memory in use", rangemode="tozero"),
        legend=dict(orientation="h", y=-0.25))
    return fig
