"""`mem_peak_mib` and `mem_current_mib` for Keras's batch and epoch logs:
the one home of the figures MemWatch adds to `logs`.

A batch's figures are filled on the hot path from the raw reads of the main
device (no rows are built there), so the progress bar, `History` and
`CSVLogger` show them; an epoch's are its highest training peak and the
memory in use at its last sample, followed on the recorded blocks.

A batch's figures are those of the read its row in the record gets. Where
batch-end hooks run on Keras's worker threads (JAX, a GPU), they can run
out of batch order, and the record pairs the reads, in the order they were
taken, with the batches, in the order they began (`Sequencer`). A hook
that runs before an earlier batch's hook has read finds its own batch's
read not taken yet; rather than wait for it, it logs the figures of the
latest batch whose read is known under `mem_peak_mib_prior_batch` and
`mem_current_mib_prior_batch`, and leaves `mem_peak_mib` and
`mem_current_mib` out.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Optional

from keras_memwatch.judge.derived import SettledInUse
from keras_memwatch.judge.step_plan import StepPlanner
from keras_memwatch.record.block import CURRENT as CURRENT_AT
from keras_memwatch.record.block import PEAK as PEAK_AT
from keras_memwatch.record.block import PHASE_CODES, Block, optional
from keras_memwatch.record.sampler import Sampler
from keras_memwatch.units import MIB

#: The batch's own figures, and those of an earlier batch, by name.
PEAK, CURRENT = "mem_peak_mib", "mem_current_mib"
PRIOR_PEAK, PRIOR_CURRENT = PEAK + "_prior_batch", CURRENT + "_prior_batch"

Figures = tuple[Optional[int], Optional[int]]  # (peak, current) in bytes

_TRAIN = PHASE_CODES["train"]


#: The place of a read among the call's reads, and its figures (a plain
#: tuple: it is made on the hot path, once a batch).
ReadFigures = tuple[int, Figures]


class LogsFigures:
    """The main device's figures, for Keras's batch and epoch logs.

    Per batch: call `first_read(raw)` with the read at the start of a call,
    `batch_begins(key)` on the training thread as each sampled batch begins
    (where hooks may run out of order), `figures_of(key, raw)` right after
    each read, holding the lock the reads are taken under (so in read
    order), and `fill_batch(key, read, logs)` with what `figures_of`
    returned.

    Per epoch: the object is a pipeline consumer (`track(block)`) that
    follows the training rows; `new_epoch()` at each epoch's start and
    `fill_epoch(logs)` at its end.

    Where one probe gives both the current bytes and a peak per step (the
    usual case), the figures of a read are two look-ups. On JAX, without a
    per-step peak, the peak is the memory in use between steps
    (`derived.SettledInUse`) plus the working part of XLA's plan of the
    batch's step, as in the record.

    Args:
        sampler: the call's started sampler.
        primary: index of the main device.
        planner: XLA's plans (JAX), for a device without a per-step peak.
        in_order: whether the batch-end hooks run in batch order (on the
            training thread): each read is then its own batch's.
    """

    def __init__(self, sampler: Sampler, primary: int,
                 planner: Optional[StepPlanner], in_order: bool = True):
        self._planner = planner
        self._in_order = in_order
        self._positions: dict[Hashable, int] = {}  # key -> position begun
        self._keys: dict[int, Hashable] = {}  # position -> key
        self._begun = 0
        self._figures: dict[int, Figures] = {}  # read index -> figures
        self._reads = 0
        self._settled: Optional[SettledInUse] = None
        self._figures_of: Callable[[Hashable, list], Figures] = _no_figures
        self._primary = primary
        self.epoch_peak: Optional[int] = None
        self.last_current: Optional[int] = None
        if not sampler.devices:
            return
        device = sampler.slots[primary]
        current = device.current_columns
        self._current = value_reader(sampler, primary, current)
        self._figures_of = self._planned
        if device.peak_per_sample and device.peak_column is not None:
            peak = (device.peak_column,)
            self._peak = value_reader(sampler, primary, peak)
            self._figures_of = self._measured
            places = sampler.places(primary, current), sampler.places(primary, peak)
            if len(places[0]) == len(places[1]) == 1:
                self._figures_of = _direct(places[0][0], places[1][0],
                                           self._measured)
        else:
            self._settled = SettledInUse()

    def first_read(self, raw: list) -> None:
        """Takes the read at the start of the call (the memory in use
        before its first batch)."""
        if self._settled is not None:
            self._settled.push(_bytes(self._current(raw)))

    def batch_begins(self, key: Hashable) -> None:
        """Notes that the batch named `key` begins (training thread)."""
        position = self._begun
        self._positions[key] = position
        self._keys[position] = key
        self._begun = position + 1

    def figures_of(self, key: Hashable, raw: list) -> ReadFigures:
        """Works out the figures of a read, for `fill_batch`. Call in read
        order."""
        index = self._reads
        self._reads = index + 1
        figures = self._figures[index] = self._figures_of(
            self._keys.pop(index, key), raw)
        return index, figures

    def fill_batch(self, key: Hashable, read: ReadFigures, logs: dict) -> None:
        """Puts the batch's figures into its logs, or, where its read is not
        taken yet, those of the read just taken (the latest batch whose
        read is known) under the `_prior_batch` names."""
        index, figures = read
        position = index if self._in_order else self._positions.pop(key, index)
        if position <= index:
            add_metrics(logs, *self._figures.pop(position, (None, None)))
        else:
            add_metrics(logs, *figures, PRIOR_PEAK, PRIOR_CURRENT)

    def track(self, block: Block) -> None:
        """Follows the main device's training rows of a recorded block."""
        if not block.tables:
            return
        table = block.tables[self._primary][block.phase == _TRAIN]
        if not len(table):
            return
        self.last_current = optional(table[-1, CURRENT_AT])
        peak = int(table[:, PEAK_AT].max())
        if peak >= 0 and (self.epoch_peak is None or peak > self.epoch_peak):
            self.epoch_peak = peak

    def new_epoch(self) -> None:
        """Starts following a new epoch's peak."""
        self.epoch_peak = None

    def fill_epoch(self, logs: dict) -> None:
        """Puts the epoch's peak and last in-use figures into its logs."""
        add_metrics(logs, self.epoch_peak, self.last_current)

    def _measured(self, key: Hashable, raw: list) -> Figures:
        current, peak = _bytes(self._current(raw)), _bytes(self._peak(raw))
        if peak is not None and current is not None and peak < current:
            peak = current
        return peak, current

    def _planned(self, key: Hashable, raw: list) -> Figures:
        current = _bytes(self._current(raw))
        before = self._settled.push(current) if self._settled is not None else None
        plan = self._planner.peek(key) if self._planner is not None else None
        if plan is None or before is None:
            return None, current
        return before + plan.working_bytes, current


def _direct(current_at: tuple[int, int, int], peak_at: tuple[int, int, int],
            otherwise: Callable[[Hashable, list], Figures]
            ) -> Callable[[Hashable, list], Figures]:
    """Figures read straight from the raw read; anything unusual (a probe
    not read, failed or giving garbage) goes to `otherwise`."""
    (cp, cs, cc), (pp, ps, pc) = current_at, peak_at

    def figures(key: Hashable, raw: list) -> Figures:
        try:
            current, peak = raw[cp][cs][cc], raw[pp][ps][pc]
        except (TypeError, IndexError, KeyError):
            return otherwise(key, raw)
        if type(current) is not int or type(peak) is not int or current < 0:
            return otherwise(key, raw)
        return (peak if peak > current else current), current

    return figures


def _no_figures(key: Hashable, raw: list) -> Figures:
    """No device: no figures."""
    return None, None


def _bytes(value: Any) -> Optional[int]:
    """A byte count, or None for anything else (a probe's garbage)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def add_metrics(logs: dict, peak: Optional[int], current: Optional[int],
                peak_name: str = PEAK, current_name: str = CURRENT) -> None:
    """Puts the figures into Keras's `logs`, in MiB; a missing one is left out."""
    if peak is not None:
        logs[peak_name] = peak / MIB
    if current is not None:
        logs[current_name] = current / MIB


def value_reader(sampler: Sampler, device_index: int,
                 columns: tuple[str, ...]) -> Callable[[list], Optional[Any]]:
    """A reader of one device's first present value among `columns` in a
    raw `Sampler.read()`."""
    places = sampler.places(device_index, columns)

    def read(raw: list) -> Optional[Any]:
        for probe, slot, column in places:
            readings = raw[probe]
            if isinstance(readings, (tuple, list)):
                try:
                    value = readings[slot][column]
                except (TypeError, IndexError):
                    continue
                if value is not None:
                    return value
        return None

    return read
