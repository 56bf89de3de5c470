"""The picture: memory over the steps of a fit, one panel per device.

Each panel shows, in MiB against the step (one per sampled batch): the peak
during each step, the memory in use after it, the usual range the spike
detector expected (from the memory in use before a step up to its
baseline), the spikes, the epoch starts, validation, and the device's limit
where a source reports one. Every artist carries one of the labels below,
which the legend shows and tests look up.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Union

import numpy as np
import pandas as pd

from keras_memwatch.derived import in_use_before, limit_of, main_device
from keras_memwatch.units import MIB, format_bytes

logger = logging.getLogger("keras_memwatch")

PathLike = Union[str, "os.PathLike[str]"]

LABEL_PEAK = "peak during step"
LABEL_IN_USE = "in use after step"
LABEL_BASELINE = "usual range (baseline)"
LABEL_SPIKE = "spike"
LABEL_LIMIT = "device limit"
LABEL_EPOCH = "epoch start"
LABEL_VALIDATION = "validation"

_MAX_NOTES = 10  # spikes annotated with their epoch and batch


def _pyplot() -> Any:
    """Imports pyplot (which picks Agg by itself on a headless machine)."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            "Plotting needs matplotlib: pip install matplotlib "
            "(or pip install 'keras-memwatch[plot]')") from None
    return plt


def _mib(values: pd.Series) -> Any:
    return values.astype("float64").to_numpy() / MIB


def _draw(ax: Any, rows: pd.DataFrame, spikes: pd.DataFrame, device: str) -> None:
    rows = rows.sort_values("step")
    step = rows["step"].to_numpy()
    ax.fill_between(step, _mib(in_use_before(rows)), _mib(rows["baseline_bytes"]),
                    facecolor="tab:green", alpha=0.25, edgecolor="tab:green",
                    linewidth=0.6, label=LABEL_BASELINE)
    ax.plot(step, _mib(rows["peak_bytes"]), color="tab:red", linewidth=1.2,
            label=LABEL_PEAK)
    ax.plot(step, _mib(rows["current_bytes"]), color="tab:blue", linewidth=1.2,
            label=LABEL_IN_USE)
    mine = spikes[spikes["device"].astype(str) == device] if len(spikes) else spikes
    if len(mine):
        x, y = mine["step"].to_numpy(), _mib(mine["peak_bytes"])
        ax.scatter(x, y, marker="v", s=60, color="black", zorder=5,
                   label=f"{LABEL_SPIKE} ({len(mine)})")
        for i, ((_, e), xi, yi) in enumerate(zip(mine.iterrows(), x, y)):
            if i >= _MAX_NOTES:
                break
            ax.annotate(f"e{e['epoch']} b{e['batch']}", (xi, yi),
                        textcoords="offset points", xytext=(0, 7),
                        ha="center", fontsize=7)
    train = rows[rows["phase"] == "train"]
    starts = train.groupby("epoch")["step"].min().sort_index().to_numpy()[1:]
    if len(starts):
        ax.vlines(starts, 0, 1, transform=ax.get_xaxis_transform(),
                  colors="gray", linestyles=":", linewidth=1, label=LABEL_EPOCH)
    test = rows["phase"] == "test"
    if test.any():
        runs = (test != test.shift()).cumsum()[test]
        for i, (_, run) in enumerate(rows[test].groupby(runs)):
            ax.axvspan(run["step"].min() - 0.5, run["step"].max() + 0.5,
                       color="gray", alpha=0.12, linewidth=0,
                       label=LABEL_VALIDATION if i == 0 else "_nolegend_")
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
    ax.set_title(f"{device}: peak {format_bytes(int(peak.max())) if len(peak) else 'n/a'}",
                 fontsize=10, loc="left")
    ax.set_ylabel("MiB")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              borderaxespad=0)


def plot_memory(
    frame: pd.DataFrame,
    spikes: pd.DataFrame,
    path: Optional[PathLike] = None,
    ax: Any = None,
) -> Any:
    """Draws memory over the steps of a fit, one panel per device.

    Works headless (Agg is chosen when there is no display and no backend
    was picked).

    Args:
        frame: the record (`MemWatch.to_dataframe()` or `load_log(...)`).
        spikes: the spike table (`MemWatch.spikes` or
            `report.spikes_from_frame`).
        path: save the figure there; the format follows the extension
            (`.png`, `.svg`, `.pdf`). Defaults to `None`.
        ax: a matplotlib `Axes` to draw into (the first accelerator's
            panel, or the host's without one), or one `Axes` per device.
            Defaults to `None`: a new figure.

    Returns:
        The matplotlib `Figure`.

    Raises:
        ImportError: without matplotlib.
        ValueError: when `ax` is a sequence whose length is not the number
            of devices.
    """
    devices = [str(d) for d in pd.unique(frame["device"].astype(str))] if len(frame) else []
    if ax is None:
        plt = _pyplot()
        fig, axes = plt.subplots(max(len(devices), 1), 1, squeeze=False, sharex=True,
                                 figsize=(11, 1.0 + 3.0 * max(len(devices), 1)))
        axes = list(axes[:, 0])
        fig.suptitle("Memory per training step (keras_memwatch)", fontsize=11)
    elif not hasattr(ax, "plot"):  # a list or array of Axes
        _pyplot()
        axes = list(np.ravel(ax))
        if len(axes) != len(devices):
            raise ValueError(
                f"Expected one Axes per device ({', '.join(devices)}). "
                f"Received: {len(axes)} Axes")
        fig = axes[0].figure
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
    axes[-1].set_xlabel("step (one per sampled batch)")
    if path is not None:
        fig.savefig(os.fspath(path), dpi=110, bbox_inches="tight")
    return fig
