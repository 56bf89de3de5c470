"""The events MemWatch reports: a step that jumped, and memory that drifts."""

from __future__ import annotations

import dataclasses
from typing import Optional

from keras_memwatch.units import MIB, format_bytes

__all__ = ["DriftEvent", "RiseEvent", "SpikeEvent", "against_usual", "ratio"]

#: Below this usual working memory a multiple of it means nothing.
NEAR_ZERO_BYTES = MIB
#: At or above this multiple, the bytes say more than the multiple.
MAX_SHOWN_RATIO = 100


def ratio(working: float, usual: float) -> float:
    """A step's working memory as a multiple of the usual one; NaN where the
    usual is near zero (under 1 MiB), where a multiple means nothing."""
    return working / usual if usual >= NEAR_ZERO_BYTES else float("nan")


def against_usual(working: float, usual: float) -> str:
    """"3.2x the usual 40 MiB", or "against a usual 10 KiB" where a multiple
    would be near-infinite or over 100x."""
    times = ratio(working, usual)
    if times < MAX_SHOWN_RATIO:  # False for NaN
        return f"{times:.1f}x the usual {format_bytes(usual)}"
    return f"against a usual {format_bytes(usual)}"


@dataclasses.dataclass(frozen=True)
class SpikeEvent:
    """A sample whose step needed far more memory than usual.

    Attributes:
        step, epoch, batch: where it happened.
        device: `"GPU:0"`, ..., or `"host"`.
        peak_bytes: the peak of the step.
        baseline_bytes: the usual peak at that point (memory in use before
            the step plus the usual working memory).
        working_bytes: the step's working memory (peak minus memory in use
            before it).
        usual_working_bytes: the rolling baseline of working memory (of
            the same phase).
        phase: `"train"`, `"test"` or `"predict"`.
        call: which call of the watch's record (`fit`, `evaluate`,
            `predict`) it happened in.
        layer: where the step's input had another shape than most
            batches', the layer whose activations grew most (from shapes),
            as `on_spike` receives it; else None.
    """

    step: int
    epoch: int
    batch: Optional[int]
    device: str
    peak_bytes: int
    baseline_bytes: int
    working_bytes: int
    usual_working_bytes: int
    phase: str = "train"
    call: int = 0
    layer: Optional[str] = None

    @property
    def ratio(self) -> float:
        """How many times the usual working memory this step needed (NaN
        where the usual is near zero)."""
        return ratio(self.working_bytes, self.usual_working_bytes)

    @property
    def where(self) -> str:
        """"epoch 0 batch 6", or "epoch 0 test batch 3" outside training."""
        phase = "" if self.phase == "train" else f"{self.phase} "
        return f"epoch {self.epoch} {phase}batch {self.batch}"

    @property
    def message(self) -> str:
        """The alert line, in human units."""
        return (
            f"memory spike at {self.where} on "
            f"{self.device}: peak {format_bytes(self.peak_bytes)} vs "
            f"baseline {format_bytes(self.baseline_bytes)} (this step needed "
            f"{format_bytes(self.working_bytes)}, "
            f"{against_usual(self.working_bytes, self.usual_working_bytes)})"
        )


@dataclasses.dataclass(frozen=True)
class DriftEvent:
    """Steady growth of the baseline: what a memory leak looks like.

    Args:
        start_bytes: Baseline at the start of the growth, in bytes.
        end_bytes: Baseline at the end of the growth, in bytes.
        n_batches: Number of samples with a baseline that the growth spans
            (batches, when every batch is sampled).
        n_epochs: Number of epochs the growth spans. Defaults to `1`.
    """

    start_bytes: float
    end_bytes: float
    n_batches: int
    n_epochs: int = 1

    @property
    def message(self) -> str:
        """The event in words, e.g. "baseline grew from 190 MiB to 420 MiB
        over 300 batches"."""
        span = f"{self.n_batches} batches"
        if self.n_epochs > 1:
            span = f"{self.n_epochs} epochs ({span})"
        return (
            f"baseline grew from {format_bytes(self.start_bytes)} "
            f"to {format_bytes(self.end_bytes)} over {span}"
        )


@dataclasses.dataclass(frozen=True)
class RiseEvent:
    """One rise of the memory in use that then stayed: a new input shape
    compiled, a cache filled once. Not a leak.

    Args:
        start_bytes: In use at the start of the epoch, in bytes.
        end_bytes: In use at its end, in bytes.
        n_batches: Number of samples of the epoch.
    """

    start_bytes: float
    end_bytes: float
    n_batches: int

    @property
    def message(self) -> str:
        """The event in words."""
        return (f"in use rose from {format_bytes(self.start_bytes)} to "
                f"{format_bytes(self.end_bytes)} at once, then stayed")
