"""Column storage of samples, and the DataFrame built from it on demand.

Each device keeps its own typed columns (`array.array`), holding only the
source columns its probes fill: about 60 bytes a row for the host and under
100 for a GPU. The step of a row is its position, so it is not stored. With
`max_rows` the columns become a ring that keeps the newest rows.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence
from typing import Optional

import numpy as np
import pandas as pd

from keras_memwatch import columns as C

_MISSING = -1  # bytes, epochs and batches are never negative
_BLOCK = 256  # rows a device buffers before moving them into its arrays
_PHASE_CODE = {p: i for i, p in enumerate(C.PHASES)}

# column -> array typecode
_META = {"epoch": "i", "batch": "i", "phase": "b", "time_s": "d", "spike": "b"}
_DERIVED = C.DERIVED_COLUMNS


class _DeviceColumns:
    """One device's columns. Rows wait in a short list of tuples and are
    moved into the typed arrays a block at a time, column by column, which
    costs far less per row than appending each value."""

    def __init__(self, sources: Sequence[str], max_rows: Optional[int]):
        self.names = tuple(_META) + _DERIVED + tuple(sources)
        self.bytes_names = _DERIVED + tuple(sources)
        self.data = [array(_META.get(n, "q")) for n in self.names]
        self.max_rows = max_rows
        self.pending: list[tuple] = []
        self.stored = 0  # rows ever moved into the arrays

    @property
    def total(self) -> int:
        """Rows ever appended."""
        return self.stored + len(self.pending)

    def append(self, values: tuple) -> None:
        self.pending.append(values)
        if len(self.pending) >= _BLOCK:
            self.flush()

    def flush(self) -> None:
        rows, self.pending = self.pending, []
        columns = list(zip(*rows))
        done, n, cap = 0, len(rows), self.max_rows
        while done < n:
            if cap is None or self.stored < cap:  # still growing
                take = n - done if cap is None else min(n - done, cap - self.stored)
                for column, values in zip(self.data, columns):
                    column.extend(values[done:done + take])
            else:  # a full ring: overwrite the oldest rows
                i = self.stored % cap
                take = min(n - done, cap - i)
                for column, values in zip(self.data, columns):
                    column[i:i + take] = array(column.typecode, values[done:done + take])
            self.stored += take
            done += take

    def numpy(self, name: str) -> np.ndarray:
        self.flush()
        column = self.data[self.names.index(name)]
        values = np.frombuffer(column, dtype=column.typecode) if column else (
            np.empty(0, dtype=column.typecode)
        )
        if self.max_rows is not None and self.stored > self.max_rows:
            values = np.roll(values, -(self.stored % self.max_rows))
        return values


class Recorder:
    """Keeps every sample in typed columns; thread-safe.

    Args:
        max_rows: keep only the newest `max_rows` samples (a ring), or all
            when `None`. Defaults to `None`.
    """

    def __init__(self, max_rows: Optional[int] = None):
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self.reset({})

    def reset(self, device_columns: dict[str, tuple[str, ...]],
              process: int = 0, hostname: str = "") -> None:
        """Forgets every row.

        Args:
            device_columns: device -> the source columns its probes fill.
            process, hostname: which process writes the rows, and where.
                Defaults to `0` and `""`.
        """
        with self._lock:
            self.process, self.hostname = process, hostname
            self.devices = tuple(device_columns)
            self._columns = [
                _DeviceColumns(device_columns[d], self.max_rows)
                for d in self.devices
            ]

    def append(
        self,
        epoch: int,
        batch: Optional[int],
        phase: str,
        time_s: float,
        rows: Sequence[dict[str, Optional[int]]],
    ) -> None:
        """Appends one sample: one row per device, in `devices` order.

        Each row maps column names to values (`None` when missing); it
        carries the sources, `peak_bytes`, `current_bytes`,
        `baseline_bytes` and `spike`.
        """
        meta = (epoch, _MISSING if batch is None else batch,
                _PHASE_CODE[phase], time_s)
        get = dict.get
        with self._lock:
            for store, row in zip(self._columns, rows):
                store.append(meta + (bool(get(row, "spike")),) + tuple(
                    [_MISSING if (v := get(row, name)) is None else v
                     for name in store.bytes_names]))

    def __len__(self) -> int:
        with self._lock:
            return sum(min(s.total, s.max_rows or s.total) for s in self._columns)

    @property
    def total_samples(self) -> int:
        """Samples appended since the last reset, kept or not."""
        return self._columns[0].total if self._columns else 0

    def to_dataframe(self) -> pd.DataFrame:
        """Builds the DataFrame: one row per sample per device, by step."""
        with self._lock:
            frames = [self._device_frame(d, s, self.process, self.hostname)
                      for d, s in zip(self.devices, self._columns)]
        if not frames or not len(frames[0]):
            return empty_frame()
        n = len(frames[0])
        frame = pd.concat(frames, ignore_index=True)
        # Interleave devices so rows run step by step, devices in order.
        order = np.arange(n * len(frames)).reshape(len(frames), n).T.ravel()
        frame = frame.take(order).reset_index(drop=True)
        frame["device"] = pd.Categorical(frame["device"], categories=self.devices)
        return frame

    @staticmethod
    def _device_frame(device: str, store: _DeviceColumns, process: int,
                      hostname: str) -> pd.DataFrame:
        n = min(store.total, store.max_rows or store.total)
        first = store.total - n
        data: dict[str, object] = {
            "step": np.arange(first, store.total, dtype=np.int64),
            "epoch": store.numpy("epoch").astype(np.int64),
            "batch": _nullable(store.numpy("batch")),
            "phase": pd.Categorical.from_codes(
                store.numpy("phase"), categories=list(C.PHASES)
            ),
            "device": device,
            "time_s": store.numpy("time_s"),
        }
        for name in C.COLUMNS[6:-len(C.PROCESS_COLUMNS)]:
            if name == "spike":
                data[name] = store.numpy("spike").astype(bool)
            elif name in store.names:
                data[name] = _nullable(store.numpy(name))
            else:
                data[name] = _missing(n)
        data["process"] = np.full(n, process, dtype=np.int64)
        data["hostname"] = hostname
        return pd.DataFrame(data, columns=list(C.COLUMNS))


def _nullable(values: np.ndarray) -> pd.api.extensions.ExtensionArray:
    values = values.astype(np.int64, copy=False)
    return pd.arrays.IntegerArray(values.copy(), values == _MISSING)


def _missing(n: int) -> pd.api.extensions.ExtensionArray:
    return pd.arrays.IntegerArray(np.zeros(n, np.int64), np.ones(n, bool))


def empty_frame() -> pd.DataFrame:
    """A DataFrame with every column, its dtype, and no rows."""
    return normalize_dtypes(pd.DataFrame({c: [] for c in C.COLUMNS}))


def normalize_dtypes(frame: pd.DataFrame) -> pd.DataFrame:
    """Gives a frame read from elsewhere (a CSV log) the recorder's dtypes.

    Logs written before a column existed read it as missing, and as process
    0 on an unknown host.
    """
    frame = frame.reindex(columns=list(C.COLUMNS))
    out = pd.DataFrame(index=frame.index)
    out["step"] = frame["step"].astype(np.int64)
    out["epoch"] = frame["epoch"].astype(np.int64)
    out["batch"] = frame["batch"].astype("Int64")
    out["phase"] = pd.Categorical(frame["phase"], categories=list(C.PHASES))
    devices = frame["device"].astype(str)
    out["device"] = pd.Categorical(devices, categories=pd.unique(devices))
    out["time_s"] = frame["time_s"].astype(np.float64)
    for name in C.COLUMNS[6:]:
        if name in C.BYTES_COLUMNS:
            out[name] = frame[name].astype("Int64")
    out["spike"] = frame["spike"].astype(bool)
    out["process"] = frame["process"].fillna(0).astype(np.int64)
    hosts = frame["hostname"].astype(object)
    out["hostname"] = hosts.where(hosts.notna(), "").astype(str)
    return out[list(C.COLUMNS)]
