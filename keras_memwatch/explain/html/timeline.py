"""The timeline's data: one panel per process and device, every row of the
record, packed for the page.

Each panel carries its rows in drawing order (by call, then step; calls
one after another on the x axis, as the PNG draws them): the peak, the
memory in use, the baseline band (from the memory in use before a step up
to its baseline), and where each row was (epoch, batch, phase, call, and
the input shape where the record has an `input_shape` column). The page
draws them with `timeline.js`, which decimates for drawing only: at most
a few thousand points per trace, the lowest and highest of each bucket and
every spike, redrawn from the full record for the range in view when the
user zooms. The figures a hover shows are always a real row's.

The columns travel as one gzip-compressed, base64 block of little-endian
typed arrays (the browser inflates it with `DecompressionStream`), so
100,000 steps on two devices stay a few megabytes.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
from typing import Any, Optional

import numpy as np
import pandas as pd

from keras_memwatch import columns as C
from keras_memwatch.explain.plot import (LABEL_PEAK, LABEL_PLANNED_PEAK, in_call_order,
                                         x_positions)
from keras_memwatch.explain.report import process_groups
from keras_memwatch.judge.derived import (in_use_before, limit_of, peaks_from_plan,
                                          spikes_from_frame)

__all__ = ["Panel", "encode_panels", "timeline_panels"]

#: The column of an input's shape, where a record has one.
INPUT_SHAPE = "input_shape"

#: Every panel column and its typed array: bytes as float64 (NaN where
#: missing), places as int32 (-1 where missing).
_ARRAYS = {"x": "<i4", "peak": "<f8", "current": "<f8", "baseline": "<f8",
           "before": "<f8", "epoch": "<i4", "batch": "<i4", "call": "<i4",
           "phase": "u1", "spike": "u1", "shape": "<i4"}


@dataclasses.dataclass
class Panel:
    """One process's device: its rows, ready to pack.

    Attributes:
        title: "GPU:0", or "process 1 on node-a, GPU:0" for several.
        device: the device.
        rows: the record's rows of this panel, in drawing order.
        arrays: name -> numpy array, one value per row (see `_ARRAYS`).
        shapes: the distinct input shapes; `arrays["shape"]` indexes them.
        spikes: the spike table's rows of this panel, with `x`.
        limit_bytes: the device's limit, or None.
        peak_label: what the peak is ("peak during step", or XLA's plan).
    """

    title: str
    device: str
    rows: pd.DataFrame
    arrays: dict[str, np.ndarray]
    shapes: list[str]
    spikes: pd.DataFrame
    limit_bytes: Optional[int]
    peak_label: str


def _floats(values: pd.Series) -> np.ndarray:
    return values.astype("float64").to_numpy(np.float64, na_value=np.nan)


def _ints(values: pd.Series) -> np.ndarray:
    return values.astype("Float64").fillna(-1).to_numpy(np.int32)


def _spikes_of(rows: pd.DataFrame, spikes: Optional[pd.DataFrame],
               several: bool) -> pd.DataFrame:
    """One process's spike table: the given one's rows of that process, or
    where the table cannot say (several processes, no `process` column),
    replayed from the record."""
    if spikes is None or (several and "process" not in spikes.columns):
        return spikes_from_frame(rows)
    if several:
        return spikes[spikes["process"] == rows["process"].iloc[0]]
    return spikes


def _panel(title: str, device: str, rows: pd.DataFrame,
           spikes: pd.DataFrame) -> Panel:
    rows, offsets = in_call_order(rows)
    phases = {p: i for i, p in enumerate(C.PHASES)}
    shapes: list[str] = []
    shape_index = np.full(len(rows), -1, np.int32)
    if INPUT_SHAPE in rows.columns:
        known = rows[INPUT_SHAPE].notna()
        text = rows.loc[known, INPUT_SHAPE].astype(str)
        codes, uniques = pd.factorize(text)
        shape_index[known.to_numpy()] = codes
        shapes = [str(u) for u in uniques]
    arrays = {
        "x": x_positions(rows, offsets).astype(np.int32),
        "peak": _floats(rows["peak_bytes"]),
        "current": _floats(rows["current_bytes"]),
        "baseline": _floats(rows["baseline_bytes"]),
        "before": _floats(in_use_before(rows)),
        "epoch": _ints(rows["epoch"]),
        "batch": _ints(rows["batch"]),
        "call": _ints(rows[C.CALL]),
        "phase": rows["phase"].astype(str).map(phases).fillna(0).to_numpy(np.uint8),
        "spike": rows["spike"].fillna(False).to_numpy(bool).astype(np.uint8),
        "shape": shape_index,
    }
    mine = spikes[spikes["device"].astype(str) == device] if len(spikes) else spikes
    mine = mine.copy()
    if len(mine):
        mine["x"] = x_positions(mine, offsets)
    label = LABEL_PLANNED_PEAK if peaks_from_plan(rows, device) else LABEL_PEAK
    return Panel(title, device, rows, arrays, shapes, mine, limit_of(rows), label)


def timeline_panels(frame: pd.DataFrame,
                    spikes: Optional[pd.DataFrame] = None) -> list[Panel]:
    """The panels of a record: one per device, or per process and device
    for the record of several processes.

    Args:
        frame: the record.
        spikes: the spike table. Defaults to `None`: replayed from `frame`
            (per process).

    Returns:
        The panels, in process then device order of first appearance.
    """
    groups = process_groups(frame)
    several = len(groups) > 1
    panels = []
    for label, rows in groups:
        table = _spikes_of(rows, spikes, several)
        for device in pd.unique(rows["device"].astype(str)):
            mine = rows[rows["device"].astype(str) == device]
            title = f"{label}, {device}" if several else str(device)
            panels.append(_panel(title, str(device), mine, table))
    return panels


def encode_panels(panels: list[Panel]) -> tuple[dict[str, Any], str]:
    """Packs every panel's arrays.

    Returns:
        `(header, block)`: the header says, per panel, its row count, each
        array's type and byte offset in the block, and its input shapes;
        the block is the arrays, 8-byte aligned, gzip-compressed, in
        base64.
    """
    parts: list[bytes] = []
    offset = 0
    header: dict[str, Any] = {"panels": []}
    for panel in panels:
        columns = {}
        for name, dtype in _ARRAYS.items():
            data = np.ascontiguousarray(panel.arrays[name], dtype=dtype).tobytes()
            columns[name] = [np.dtype(dtype).str, offset]
            pad = -len(data) % 8
            parts.append(data + b"\0" * pad)
            offset += len(data) + pad
        header["panels"].append({"rows": len(panel.rows), "columns": columns,
                                 "shapes": panel.shapes})
    block = gzip.compress(b"".join(parts), compresslevel=3, mtime=0)
    return header, base64.b64encode(block).decode("ascii")


def header_json(header: dict[str, Any]) -> str:
    """The header as JSON, safe inside a `<script>` element."""
    return json.dumps(header, separators=(",", ":")).replace("</", "<\\/")

