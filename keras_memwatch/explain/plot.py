"""The picture: memory over the steps of a fit, one panel per device.

Each panel shows, in MiB against the step (one per sampled batch): the peak
during each step, the memory in use after it, the usual range the spike
detector expected (from the memory in use before a step up to its
baseline), the spikes, the epoch starts, the test phase (validation and
`evaluate`) and the predict phase shaded apart, and the device's limit
where a source reports one. A record of several calls (`fit`, then
`evaluate` or `predict`) draws them one after another, each call's start
marked. Every artist carries one of the labels below, which the legend
shows and tests look up.

A record of several processes (`load_log("mem.rank*.csv")`) gets one panel
per process and device, titled "process N on HOST, DEVICE"; beyond
`MAX_PANELS` panels, or drawn into one given `Axes`, one panel per device
with a peak line per process instead.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Union

import numpy as np
import pandas as pd

from keras_memwatch import columns as C
from keras_memwatch import options
from keras_memwatch.explain.figure_files import pyplot as _pyplot, save_figure
from keras_memwatch.files import refuse_existing
from keras_memwatch.judge.derived import (in_use_before, limit_of, main_device, peaks_from_plan,
                                    spikes_from_frame)
from keras_memwatch.units import MIB, format_bytes

logger = logging.getLogger("keras_memwatch")

PathLike = Union[str, "os.PathLike[str]"]

LABEL_PEAK = "peak during step"
LABEL_PLANNED_PEAK = "planned peak (in use before + XLA plan)"
LABEL_RESERVED = "reserved by the allocator"
LABEL_IN_USE = "in use after step"
LABEL_BASELINE = "usual range (baseline)"
LABEL_SPIKE = "spike"
LABEL_LIMIT = "device limit"
LABEL_EPOCH = "epoch start"
LABEL_VALIDATION = "test (validation, evaluate)"
LABEL_PREDICT = "predict"
LABEL_CALL = "call start"

#: Each shaded phase's label and colour.
_SHADED = {"test": (LABEL_VALIDATION, "gray"),
           "predict": (LABEL_PREDICT, "tab:purple")}

_MAX_NOTES = 10  # spikes annotated with their epoch and batch

#: Most panels (processes x devices) drawn one by one; beyond, one panel per
#: device with a line per process.
MAX_PANELS = 16


def _mib(values: pd.Series) -> Any:
    return values.astype("float64").to_numpy() / MIB


def in_call_order(rows: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, int]]:
    """Rows by call, then step, and what each call's steps are shifted by
    on the x axis (its calls one after another; one call: its steps)."""
    rows = rows.sort_values([C.CALL, "step"], kind="stable")
    offsets, at = {}, 0
    for call, steps in rows.groupby(C.CALL, sort=True)["step"]:
        offsets[int(call)] = at - (int(steps.min()) if offsets else 0)
        at = offsets[int(call)] + int(steps.max()) + 1
    return rows, offsets


def x_positions(rows: pd.DataFrame, offsets: dict[int, int]) -> np.ndarray:
    """Where rows (or spikes) go on the x axis."""
    calls = rows[C.CALL] if C.CALL in rows.columns else pd.Series(0, rows.index)
    return (rows["step"].to_numpy(np.int64)
            + calls.map(offsets).fillna(0).to_numpy(np.int64))


def _draw(ax: Any, rows: pd.DataFrame, spikes: pd.DataFrame, device: str,
          title: str = "") -> None:
    rows, offsets = in_call_order(rows)
    step = x_positions(rows, offsets)
    ax.fill_between(step, _mib(in_use_before(rows)), _mib(rows["baseline_bytes"]),
                    facecolor="tab:green", alpha=0.25, edgecolor="tab:green",
                    linewidth=0.6, label=LABEL_BASELINE)
    ax.plot(step, _mib(rows["peak_bytes"]), color="tab:red", linewidth=1.2,
            label=LABEL_PLANNED_PEAK if peaks_from_plan(rows, device) else LABEL_PEAK)
    ax.plot(step, _mib(rows["current_bytes"]), color="tab:blue", linewidth=1.2,
            label=LABEL_IN_USE)
    if rows[C.ALLOCATOR_RESERVED].notna().any():
        ax.plot(step, _mib(rows[C.ALLOCATOR_RESERVED]), color="tab:gray",
                linewidth=1, linestyle="--", label=LABEL_RESERVED)
    mine = spikes[spikes["device"].astype(str) == device] if len(spikes) else spikes
    if len(mine):
        x, y = x_positions(mine, offsets), _mib(mine["peak_bytes"])
        ax.scatter(x, y, marker="v", s=60, color="black", zorder=5,
                   label=f"{LABEL_SPIKE} ({len(mine)})")
        for i, ((_, e), xi, yi) in enumerate(zip(mine.iterrows(), x, y)):
            if i >= _MAX_NOTES:
                break
            ax.annotate(f"e{e['epoch']} b{e['batch']}", (xi, yi),
                        textcoords="offset points", xytext=(0, 7),
                        ha="center", fontsize=7)
    at = pd.Series(step, index=rows.index)
    train = rows["phase"] == "train"
    starts = at[train].groupby(rows.loc[train, "epoch"]).min().sort_index()
    starts = starts.to_numpy()[1:]
    if len(starts):
        ax.vlines(starts, 0, 1, transform=ax.get_xaxis_transform(),
                  colors="gray", linestyles=":", linewidth=1, label=LABEL_EPOCH)
    calls = at.groupby(rows[C.CALL]).min().sort_index().to_numpy()[1:]
    if len(calls):
        ax.vlines(calls - 0.5, 0, 1, transform=ax.get_xaxis_transform(),
                  colors="black", linestyles="-.", linewidth=1, label=LABEL_CALL)
    for phase, (label, colour) in _SHADED.items():
        shaded = rows["phase"] == phase
        if not shaded.any():
            continue
        runs = (shaded != shaded.shift()).cumsum()[shaded]
        for i, (_, run) in enumerate(at[shaded].groupby(runs)):
            ax.axvspan(run.min() - 0.5, run.max() + 0.5, color=colour, alpha=0.12,
                       linewidth=0, label=label if i == 0 else "_nolegend_")
    top = limit_of(rows)
    peak = rows["peak_bytes"].dropna()
    high = max(float(peak.max()) if len(peak) else 0.0,
               float(rows["current_bytes"].max()) if rows["current_bytes"].notna().any()
               else 0.0)
    ax.set_ylim(0, high / MIB * 1.15 or 1)
    if top is not None:
        label = f"{LABEL_LIMIT} {format_bytes(top)}"
        if top <= 2.5 * high:
            ax.set_ylim(0, max(top, high) / MIB * 1.08)
        else:  # keep the steps readable; say where the limit is
            label += f"\n(above the chart; headroom {format_bytes(top - high)})"
        ax.axhline(top / MIB, color="black", linestyle="--", linewidth=1,
                   label=label)
    ax.set_title(f"{title}{device}: peak "
                 f"{format_bytes(int(peak.max())) if len(peak) else 'n/a'}",
                 fontsize=10, loc="left")
    ax.set_ylabel("MiB")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              borderaxespad=0)


def plot_memory(
    frame: pd.DataFrame,
    spikes: Optional[pd.DataFrame] = None,
    path: Optional[PathLike] = None,
    ax: Any = None,
) -> Any:
    """Draws memory over the steps of a fit, one panel per device (and per
    process, for the record of several processes).

    Works headless (Agg is chosen when there is no display and no backend
    was picked).

    Args:
        frame: the record (`MemWatch.to_dataframe()` or `load_log(...)`).
        spikes: the spike table (`MemWatch.spikes` or
            `derived.spikes_from_frame`). Defaults to `None`: derived from
            `frame`, per process. With several processes, a table without a
            `process` column is ignored and derived per process too.
        path: save the figure there; the format follows the extension
            (`.png`, `.svg`, `.pdf`). Defaults to `None`.
        ax: a matplotlib `Axes` to draw into (the first accelerator's
            panel, or the host's without one; with several processes, that
            device's peak per process), or one `Axes` per panel. Defaults
            to `None`: a new figure.

    Returns:
        The matplotlib `Figure`.

    Raises:
        ImportError: without matplotlib.
        ValueError: when `ax` is a sequence whose length is not the number
            of panels.
    """
    from keras_memwatch.explain.report import process_groups

    groups = process_groups(frame)
    if len(groups) > 1:
        return _plot_processes(groups, spikes, path, ax)
    if spikes is None:
        spikes = spikes_from_frame(frame)
    devices = _devices(frame)
    if ax is None:
        fig, axes = _figure(len(devices))
    elif not hasattr(ax, "plot"):  # a list or array of Axes
        axes, fig = _given_axes(ax, devices)
    else:
        _pyplot()
        if len(devices) > 1:
            main = main_device(devices)
            logger.info("plot: one Axes given; drawing %s only (not %s)", main,
                        ", ".join(d for d in devices if d != main))
            devices = [main]
        axes, fig = [ax], ax.figure
    if not devices:
        axes[0].text(0.5, 0.5, "no samples recorded", ha="center", va="center",
                     transform=axes[0].transAxes)
    for axis, device in zip(axes, devices):
        _draw(axis, frame[frame["device"].astype(str) == device], spikes, device)
    return _finish(fig, axes, path, frame[C.CALL].nunique() if len(frame) else 1)


def _devices(frame: pd.DataFrame) -> list[str]:
    return [str(d) for d in pd.unique(frame["device"].astype(str))] if len(frame) else []


def _figure(panels: int) -> tuple[Any, list]:
    plt = _pyplot()
    fig, axes = plt.subplots(max(panels, 1), 1, squeeze=False, sharex=True,
                             figsize=(11, 1.0 + 3.0 * max(panels, 1)))
    fig.suptitle("Memory per sampled batch (keras_memwatch)", fontsize=11)
    return fig, list(axes[:, 0])


def _given_axes(ax: Any, panels: list[str], noun: str = "device") -> tuple[list, Any]:
    _pyplot()
    axes = list(np.ravel(ax))
    if len(axes) != len(panels):
        raise ValueError(
            f"Expected one Axes per {noun} ({', '.join(panels)}). "
            f"Received: {len(axes)} Axes")
    return axes, axes[0].figure


def _finish(fig: Any, axes: list, path: Optional[PathLike],
            calls: int = 1) -> Any:
    axes[-1].set_xlabel("step (one per sampled batch)" if calls <= 1 else
                        "sampled batch (the calls one after another)")
    if path is not None:
        fig.savefig(os.fspath(path), dpi=110, bbox_inches="tight")
    return fig


def _spikes_of(rows: pd.DataFrame, spikes: Optional[pd.DataFrame]) -> pd.DataFrame:
    """One process's spikes: the given table's rows of that process where
    the table says which process each row is, else replayed from `rows`."""
    if spikes is not None and "process" in spikes.columns:
        return spikes[spikes["process"] == rows["process"].iloc[0]]
    return spikes_from_frame(rows)


def _plot_processes(groups: list, spikes: Optional[pd.DataFrame],
                    path: Optional[PathLike], ax: Any) -> Any:
    """Several processes: a panel per process and device, or per device
    with a line per process."""
    panels = [(label, rows, device) for label, rows in groups
              for device in _devices(rows)]
    names = [f"{label}, {device}" for label, _, device in panels]
    overlay = ax is not None and hasattr(ax, "plot")
    if ax is None and len(panels) > MAX_PANELS:
        overlay = True
    if not overlay:
        if ax is None:
            fig, axes = _figure(len(panels))
        else:
            axes, fig = _given_axes(ax, names, "process and device")
        for axis, (label, rows, device) in zip(axes, panels):
            _draw(axis, rows[rows["device"].astype(str) == device],
                  _spikes_of(rows, spikes), device, title=f"{label}, ")
        return _finish(fig, axes, path)
    devices = list(dict.fromkeys(device for _, _, device in panels))
    if ax is None:
        fig, axes = _figure(len(devices))
    else:
        _pyplot()
        main = main_device(devices)
        if len(devices) > 1:
            logger.info("plot: one Axes given; drawing %s only (not %s)", main,
                        ", ".join(d for d in devices if d != main))
        devices, axes, fig = [main], [ax], ax.figure
    for axis, device in zip(axes, devices):
        _draw_lines(axis, groups, spikes, device)
    return _finish(fig, axes, path)


def _draw_lines(ax: Any, groups: list, spikes: Optional[pd.DataFrame],
                device: str) -> None:
    """One device's peak per step, a line per process, spikes marked."""
    high, marked = 0.0, 0
    for label, rows in groups:
        mine = rows[rows["device"].astype(str) == device]
        if mine.empty:
            continue
        mine, offsets = in_call_order(mine)
        peak = _mib(mine["peak_bytes"])
        ax.plot(x_positions(mine, offsets), peak, linewidth=1.0, label=label)
        if np.isfinite(peak).any():
            high = max(high, float(np.nanmax(peak)))
        hit = _spikes_of(rows, spikes)
        hit = hit[hit["device"].astype(str) == device] if len(hit) else hit
        if len(hit):
            ax.scatter(x_positions(hit, offsets), _mib(hit["peak_bytes"]), marker="v",
                       s=40, color="black", zorder=5,
                       label="_nolegend_" if marked else LABEL_SPIKE)
            marked += len(hit)
    ax.set_ylim(0, high * 1.15 or 1)
    ax.set_title(f"{device}: {LABEL_PEAK}, per process", fontsize=10, loc="left")
    ax.set_ylabel("MiB")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              borderaxespad=0)


def plot_by_layer(table: pd.DataFrame, path: Optional[PathLike] = None,
                  ax: Any = None, top: int = 12, overwrite: bool = False) -> Any:
    """Draws a by-layer table (`memory_by_layer`) as horizontal bars.

    Each of the `top` layers with the most working memory gets a bar of its
    activations and one of its gradients, stacked; the other layers share
    one bar, and the rest of the step (the table's last row) has its own.

    Args:
        table: a table from `memory_by_layer` or `MemWatch.by_layer`.
        path: where to save the figure. Defaults to `None` (not saved).
        ax: a matplotlib Axes to draw on. Defaults to `None` (a new figure).
        top: how many layers get a bar of their own. Defaults to `12`.
        overwrite: replace an existing file at `path`. Defaults to `False`.

    Returns:
        The matplotlib Figure.

    Raises:
        FileExistsError: `path` exists and `overwrite` is `False` (before
            anything is drawn).
    """
    from keras_memwatch.explain.layers import REST

    options.positive_int("top", top)
    refuse_existing(path, overwrite)
    if not isinstance(table, pd.DataFrame) or "working_bytes" not in table:
        raise TypeError("Expected `table` to be a table from memory_by_layer. "
                        f"Received: table={type(table).__name__}")
    plt = _pyplot()
    layers = table[table["layer"] != REST]
    shown = layers.sort_values("working_bytes", ascending=False).head(top)
    others = layers.drop(shown.index)
    names = list(shown["layer"])
    activations = list(_mib(shown["activation_bytes"].fillna(0)))
    gradients = list(_mib(shown["grad_bytes"].fillna(0)))
    if len(others):
        names.append(f"{len(others)} other layers")
        activations.append(float(others["activation_bytes"].fillna(0).sum()) / MIB)
        gradients.append(float(others["grad_bytes"].fillna(0).sum()) / MIB)
    rest = table.loc[table["layer"] == REST, "working_bytes"].dropna()
    rest_mib = [float(rest.iloc[0]) / MIB] if len(rest) else []
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 1.0 + 0.35 * (len(names) + 1)))
    else:
        fig = ax.figure
    y = np.arange(len(names))
    ax.barh(y, activations, label="activations kept for the backward pass")
    ax.barh(y, gradients, left=activations, label="gradients")
    if rest_mib:
        ax.barh([len(names)], rest_mib, color="0.6", label="rest of the step")
        names.append("(rest)")
    ax.set_yticks(np.arange(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("MiB")
    source = ", ".join(sorted(set(layers["source"].astype(str))))
    ax.set_title(f"Where a step's working memory goes ({source})", fontsize=11)
    ax.legend(loc="lower right", fontsize=8)
    if path is not None:
        save_figure(fig, path, overwrite)
    return fig
