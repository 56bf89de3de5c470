"""Storage of samples in blocks, and the DataFrame built from it on demand.

The recorder keeps the pipeline's blocks as they come (see `block`): each
device's int64 table holds only the source columns its probes fill (8 bytes
a value, 64 a row for a GPU with four sources), and the sample's meta
columns (25 bytes) are kept once for every device. The step of a row is its
position, so it is not stored. Small blocks are joined into larger ones as
they accumulate. With `max_rows` the newest `max_rows` rows are kept, in at
most about twice that memory (old rows go a joined block at a time).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Optional

import numpy as np
import pandas as pd

from keras_memwatch import columns as C
from keras_memwatch.record.block import MISSING, Block, table_columns

_JOIN = 256  # rows that small blocks wait for before being joined into one


class _Blocks:
    """Arrays appended a block at a time: joined as they grow, the oldest
    dropped beyond `max_rows`."""

    def __init__(self, max_rows: Optional[int]):
        self.max_rows = max_rows
        self.joined: list[list[np.ndarray]] = []  # blocks of `_JOIN` rows or more
        self.waiting: list[list[np.ndarray]] = []
        self.waiting_rows = 0
        self.kept = 0  # rows in `joined` and `waiting`
        self.total = 0  # rows ever appended

    def append(self, arrays: list[np.ndarray]) -> None:
        n = len(arrays[0])
        self.waiting.append(arrays)
        self.waiting_rows += n
        self.kept += n
        self.total += n
        if self.waiting_rows >= _JOIN:
            self._join()
        while (self.max_rows is not None and self.joined
               and self.kept - len(self.joined[0][0]) >= self.max_rows):
            self.kept -= len(self.joined.pop(0)[0])

    def _join(self) -> None:
        if self.waiting:
            self.joined.append([np.concatenate(parts)
                                for parts in zip(*self.waiting)])
            self.waiting, self.waiting_rows = [], 0

    def arrays(self) -> list[np.ndarray]:
        """Every array, the kept rows joined (the newest `max_rows`)."""
        self._join()
        arrays = [np.concatenate(parts) for parts in zip(*self.joined)]
        if self.max_rows is not None and self.kept > self.max_rows:
            arrays = [a[-self.max_rows:].copy() for a in arrays]
            self.kept = self.max_rows
        self.joined = [arrays]
        return arrays


class Recorder:
    """Keeps every sample, a block at a time; thread-safe.

    Args:
        max_rows: keep only the newest `max_rows` samples, or all when
            `None`. Defaults to `None`.
    """

    def __init__(self, max_rows: Optional[int] = None):
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self.reset({})

    def reset(self, device_columns: dict[str, tuple[str, ...]],
              process: int = 0, hostname: str = "", call: int = 0) -> None:
        """Forgets every row.

        Args:
            device_columns: device -> the source columns its probes fill.
            process, hostname: which process writes the rows, and where.
                Defaults to `0` and `""`.
            call: which call of the watch's record the rows are. Defaults
                to `0`.
        """
        with self._lock:
            self.process, self.hostname, self.call = process, hostname, call
            self.devices = tuple(device_columns)
            self._columns = [table_columns(device_columns[d]) for d in self.devices]
            self._blocks = _Blocks(self.max_rows)

    def extend(self, block: Block) -> None:
        """Keeps a block of samples (its arrays, as they are)."""
        if len(block):
            with self._lock:
                self._blocks.append([block.epoch, block.batch, block.phase,
                                     block.time_s, block.timestamp, *block.tables,
                                     *block.spikes])

    def __len__(self) -> int:
        with self._lock:
            return len(self.devices) * min(self._blocks.kept, self.max_rows
                                           or self._blocks.kept)

    @property
    def total_samples(self) -> int:
        """Samples appended since the last reset, kept or not."""
        return self._blocks.total

    def to_dataframe(self) -> pd.DataFrame:
        """Builds the DataFrame: one row per sample per device, by step."""
        with self._lock:
            if not self.devices or not self._blocks.kept:
                return empty_frame()
            epoch, batch, phase, time_s, timestamp, *rest = self._blocks.arrays()
            total = self._blocks.total
        d = len(self.devices)
        n = len(epoch)
        meta = {
            "step": np.arange(total - n, total, dtype=np.int64),
            "epoch": epoch,
            "batch": _nullable(batch),
            "phase": pd.Categorical.from_codes(phase, categories=list(C.PHASES)),
            C.TIME_S: time_s,
            C.TIMESTAMP: timestamp,
        }
        frames = [self._device_frame(k, meta, table, spikes, names)
                  for k, (table, spikes, names) in enumerate(zip(
                      rest[:d], rest[d:], self._columns))]
        frame = pd.concat(frames, ignore_index=True)
        # Interleave devices so rows run step by step, devices in order.
        order = np.arange(n * d).reshape(d, n).T.ravel()
        frame = frame.take(order).reset_index(drop=True)
        frame["device"] = pd.Categorical.from_codes(
            frame["device"].to_numpy(np.int16), categories=list(self.devices))
        return frame

    def _device_frame(self, k: int, meta: dict, table: np.ndarray,
                      spikes: np.ndarray,
                      names: Sequence[str]) -> pd.DataFrame:
        """Device `k`'s rows; its `device` column is `k` (made categorical
        once the devices are interleaved)."""
        n = len(table)
        by_column = np.ascontiguousarray(table.T)  # a copy the frame owns
        data: dict[str, object] = dict(meta, device=k)
        for name in C.COLUMNS[C.FIRST_BYTES:-len(C.CALL_COLUMNS)]:
            if name == "spike":
                data[name] = spikes
            elif name in names:
                values = by_column[names.index(name)]
                data[name] = pd.arrays.IntegerArray(values, values == MISSING)
            else:
                data[name] = _missing(n)
        data["process"] = np.full(n, self.process, dtype=np.int64)
        data["hostname"] = self.hostname
        data[C.CALL] = np.full(n, self.call, dtype=np.int64)
        return pd.DataFrame(data, columns=list(C.COLUMNS))


def _nullable(values: np.ndarray) -> pd.api.extensions.ExtensionArray:
    values = values.astype(np.int64)  # a copy the frame owns
    return pd.arrays.IntegerArray(values, values == MISSING)


def _missing(n: int) -> pd.api.extensions.ExtensionArray:
    return pd.arrays.IntegerArray(np.zeros(n, np.int64), np.ones(n, bool))


def empty_frame() -> pd.DataFrame:
    """A DataFrame with every column, its dtype, and no rows."""
    return normalize_dtypes(pd.DataFrame({c: [] for c in C.COLUMNS}))


def concat_frames(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Frames of several calls or logs as one, in the order given; the
    devices stay categorical, in order of first appearance."""
    frames = [f for f in frames if len(f)] or list(frames[:1]) or [empty_frame()]
    if len(frames) == 1:
        return frames[0]
    merged = pd.concat(frames, ignore_index=True)
    devices = merged["device"].astype(str)
    merged["device"] = pd.Categorical(devices, categories=pd.unique(devices))
    return merged


def normalize_dtypes(frame: pd.DataFrame) -> pd.DataFrame:
    """Gives a frame read from elsewhere (a CSV log) the recorder's dtypes.

    Logs written before a column existed read it as missing, and as process
    0 on an unknown host, call 0.
    """
    frame = frame.reindex(columns=list(C.COLUMNS))
    out = pd.DataFrame(index=frame.index)
    out["step"] = frame["step"].astype(np.int64)
    out["epoch"] = frame["epoch"].astype(np.int64)
    out["batch"] = frame["batch"].astype("Int64")
    out["phase"] = pd.Categorical(frame["phase"], categories=list(C.PHASES))
    devices = frame["device"].astype(str)
    out["device"] = pd.Categorical(devices, categories=pd.unique(devices))
    out[C.TIME_S] = frame[C.TIME_S].astype(np.float64)
    out[C.TIMESTAMP] = frame[C.TIMESTAMP].astype(np.float64)
    for name in C.COLUMNS[C.FIRST_BYTES:]:
        if name in C.BYTES_COLUMNS:
            out[name] = frame[name].astype("Int64")
    out["spike"] = frame["spike"].astype(bool)
    out["process"] = frame["process"].fillna(0).astype(np.int64)
    hosts = frame["hostname"].astype(object)
    out["hostname"] = hosts.where(hosts.notna(), "").astype(str)
    out[C.CALL] = frame[C.CALL].fillna(0).astype(np.int64)
    return out[list(C.COLUMNS)]
