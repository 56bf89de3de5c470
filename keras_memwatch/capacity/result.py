"""`CapacityEstimate`: the record an estimate gathered, its answers, its text."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from keras_memwatch import options
from keras_memwatch.capacity.evidence import AIMED, PLAN, Evidence, Observation
from keras_memwatch.deprecation import deprecated
from keras_memwatch.units import format_bytes


@dataclasses.dataclass(frozen=True)
class CapacityEstimate:
    """What `estimate_max_batch_size` observed, and every answer read from it.

    All answers come from `evidence` by one rule
    (`keras_memwatch.capacity.evidence`): the largest batch whose need fits
    `limit x (1 - headroom) - in use`, never at or above a size that
    failed, never rising as the headroom grows, holding every size that
    ran under the whole limit.

    Attributes:
        evidence: the record: each observation, the limit, the memory in use.
        headroom: the fraction of the limit the estimate was asked to keep free.
        device: `"GPU:0"`, ... or `"host"`.
        backend: the Keras backend.
        measured_by: what a step's need was read from, in words.
        limit_detail: where the limit comes from, in words.
        refusal: why no batch size is answered, or `""`.
        stopped: why the ladder stopped where it did, or `""`.
        unsettled: what the checks left open, or `""`.
        samples_given: how many samples the batches were grown from.
        seconds: how long the estimate took.
        max_seconds: the time it was given, or `None`.
        left_open: each answer the record does not bracket to 2% (a size
            that fits the room of that headroom, and one at most 2% above
            it that does not), by headroom, with why, in words.
        stored: how many observations came from an earlier estimate of the
            same step under the same limit, kept beside JAX's compilation
            cache (`compilation_cache=`); `0` where none.
    """

    evidence: Evidence
    headroom: float
    device: str
    backend: str
    measured_by: str
    limit_detail: str = ""
    refusal: str = ""
    stopped: str = ""
    unsettled: str = ""
    samples_given: int = 0
    seconds: float = 0.0
    max_seconds: Optional[float] = None
    left_open: dict[float, str] = dataclasses.field(default_factory=dict)
    stored: int = 0

    # -- answers -------------------------------------------------------------

    def batch_size_for(self, headroom: float) -> Optional[int]:
        """The largest batch that fits under the limit less `headroom`.

        Args:
            headroom: fraction of the limit to keep free, in [0, 1).

        Returns:
            The batch size (0 where not even one sample fits), or `None`
            where the estimate answers nothing (see `refusal`).

        Raises:
            TypeError, ValueError: for a `headroom` outside [0, 1).
        """
        headroom = options.fraction("headroom", headroom)
        return None if self.refusal else self.evidence.batch_size_for(headroom)

    @property
    def predicted_batch_size(self) -> Optional[int]:
        """`batch_size_for(headroom)`: the batch to train."""
        return self.batch_size_for(self.headroom)

    @property
    def ceiling_batch_size(self) -> Optional[int]:
        """`batch_size_for(0)`: the largest batch under the whole limit."""
        return self.batch_size_for(0.0)

    def line_batch_size_for(self, headroom: float) -> Optional[int]:
        """What the small-batch line alone says, before any check (the line
        through the ladder's sizes, extrapolated)."""
        headroom = options.fraction("headroom", headroom)
        return None if self.refusal else self.evidence.line_batch_size_for(headroom)

    @property
    def recomputes_from(self) -> Optional[int]:
        """JAX: the smallest checked batch at which XLA recomputes
        activations to fit (slower steps), or `None` where no plan shows it."""
        return self.evidence.recomputes_from

    def full_speed_batch_size_for(self, headroom: float) -> Optional[int]:
        """The largest batch that fits without XLA recomputing activations:
        `batch_size_for(headroom)`, below `recomputes_from`."""
        answer = self.batch_size_for(headroom)
        start = self.recomputes_from
        return answer if answer is None or start is None else min(answer, start - 1)

    # -- the record, in figures ----------------------------------------------

    @property
    def limit_bytes(self) -> Optional[int]:
        return self.evidence.limit_bytes

    @property
    def in_use_bytes(self) -> int:
        return self.evidence.in_use_bytes

    @property
    def per_sample_bytes(self) -> Optional[float]:
        """The small-batch line's bytes per sample."""
        line = self.evidence.line
        return None if line is None else line.per_sample_bytes

    @property
    def step_static_bytes(self) -> Optional[float]:
        """The small-batch line's constant part of a step."""
        line = self.evidence.line
        return None if line is None else line.static_bytes

    @property
    def largest_measured(self) -> Optional[int]:
        """The largest batch observed to run."""
        return max((o.batch_size for o in self.evidence.observations
                    if o.ran and not self.evidence.failed(o)), default=None)

    # -- names that go in the next release -----------------------------------

    @property
    def measurements(self) -> tuple[tuple[int, int], ...]:
        """Deprecated since 0.2.0, removed in 0.3.0: read `evidence`.

        `(batch_size, need_bytes)` of each size observed to run, by size.
        """
        deprecated("CapacityEstimate.measurements",
                    "estimate.evidence.observations (or estimate.to_dataframe())")
        needs = {o.batch_size: o.need_bytes for o in self.evidence.observations
                 if o.ran and o.need_bytes is not None}
        return tuple(sorted(needs.items()))

    @property
    def method(self) -> str:
        """Deprecated since 0.2.0, removed in 0.3.0: read `measured_by`, or
        each observation's `how`.

        `"xla"` where XLA's plans measured the need, `"reserved"` where
        PyTorch's allocator on a GPU did, else `"probes"`.
        """
        deprecated("CapacityEstimate.method",
                    "estimate.measured_by, or the `how` of each observation in "
                    "estimate.evidence")
        if any(o.how in (PLAN, AIMED) for o in self.evidence.observations):
            return "xla"
        return "reserved" if self.device != "host" and self.backend == "torch" else "probes"

    def to_dataframe(self) -> Any:
        """The observations as a `pandas.DataFrame`: `batch_size`,
        `need_bytes`, `how`, `ran`, `ladder`, `seconds`, and `line_bytes`
        (the small-batch line there)."""
        import pandas as pd

        frame = pd.DataFrame([dataclasses.asdict(o) for o in self.evidence.observations],
                             columns=[f.name for f in dataclasses.fields(Observation)])
        frame["need_bytes"] = frame["need_bytes"].astype("Int64")
        line = self.evidence.line
        frame["line_bytes"] = (frame["batch_size"].map(line) if line is not None
                               else float("nan"))
        return frame

    def to_dict(self) -> dict[str, Any]:
        """Every field and answer, JSON-ready; each observation with its
        `result`: `"ran"`, `"fits"`, `"over the limit"` or `"out of memory"`."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "evidence"}
        out.update(
            observations=[dict(dataclasses.asdict(o), result=_result(self.evidence, o))
                          for o in self.evidence.observations],
            limit_bytes=self.limit_bytes, in_use_bytes=self.in_use_bytes,
            predicted_batch_size=self.predicted_batch_size,
            ceiling_batch_size=self.ceiling_batch_size,
            line_batch_size=self.line_batch_size_for(self.headroom),
            recomputes_from=self.recomputes_from,
            per_sample_bytes=self.per_sample_bytes,
            step_static_bytes=self.step_static_bytes)
        return out

    # -- words ---------------------------------------------------------------

    @property
    def explanation(self) -> str:
        """How the answer was reached, or why there is none, in a few sentences."""
        where = f"{self.device} ({self.backend}, {self.measured_by})"
        if self.refusal:
            return f"No answer on {where}: {self.refusal}."
        ev = self.evidence
        answer, ceiling = self.predicted_batch_size, self.ceiling_batch_size
        line = ev.line
        assert line is not None and ev.limit_bytes is not None
        parts = [f"Largest batch {answer} under {self.headroom:.0%} headroom on "
                 f"{where}: {format_bytes(ev.room(self.headroom))} of room "
                 f"({format_bytes(ev.limit_bytes)}, {self.limit_detail}, less the "
                 f"headroom and {format_bytes(ev.in_use_bytes)} in use)."]
        parts.append(f"The small-batch line through batch "
                     f"{line.batch_sizes[0]}-{line.batch_sizes[-1]} "
                     f"({format_bytes(line.per_sample_bytes)} per sample) says "
                     f"{self.line_batch_size_for(self.headroom)}.")
        checks = [o for o in ev.observations if not o.ladder and o.how != AIMED]
        if checks:
            parts.append("Checked: " + ", ".join(
                f"{o.batch_size} {_result(ev, o)}" for o in checks) + f" ({checks[0].how}s).")
        parts.append(f"Without headroom: {ceiling}.")
        above = _plans_fitting_above(ev, ceiling)
        if above:
            parts.append(above)
        start = self.recomputes_from
        if start is not None:
            parts.append(f"From batch {start} XLA recomputes activations to fit "
                         f"(slower steps): up to {self.full_speed_batch_size_for(0.0)} "
                         "at full speed.")
        top = self.largest_measured or 0
        if not checks and answer and top and answer > 2 * top:
            parts.append(f"Not checked: {answer / top:.0f}x the largest batch "
                         f"measured ({top}), read off the line.")
        if self.samples_given and top > self.samples_given:
            parts.append(f"Batches repeat the {self.samples_given} samples given.")
        if self.stored:
            asked = len(ev.observations) - self.stored
            parts.append(f"{self.stored} sizes from an earlier estimate of this "
                         f"step under this limit (the compilation cache), "
                         f"{asked} more asked.")
        for note in (self.stopped and f"The ladder stopped: {self.stopped}",
                     self.unsettled):
            if note:
                parts.append(note[0].upper() + note[1:] + ".")
        if self.left_open and "out of time" not in self.unsettled:
            parts.append("Not bracketed to 2%: " + "; ".join(
                f"under {h:.0%} headroom, {why}" for h, why in self.left_open.items())
                + ".")
        if self.max_seconds is not None:
            parts.append(f"{self.seconds:.1f} s of max_seconds={self.max_seconds:g}.")
        return " ".join(parts)

    def __str__(self) -> str:
        ev = self.evidence
        lines = ["Largest batch that fits: "
                 + ("none" if self.predicted_batch_size is None
                    else str(self.predicted_batch_size))
                 + f" under {self.headroom:.0%} headroom ({self.device}, "
                 f"{self.backend}, {self.measured_by})"]
        if ev.limit_bytes is not None:
            lines.append(f"  limit:    {format_bytes(ev.limit_bytes)} "
                         f"({self.limit_detail}); in use before the steps "
                         f"{format_bytes(ev.in_use_bytes)}")
        if self.ceiling_batch_size is not None:
            lines.append(f"  ceiling:  {self.ceiling_batch_size} without headroom")
        line = ev.line
        lines.append("  observed: batch  need        how         result")
        for o in ev.observations:
            need = "" if o.need_bytes is None else format_bytes(o.need_bytes)
            how = o.how + (" (ladder)" if o.ladder else "")
            lines.append(f"            {o.batch_size:>5}  {need:>10}  {how:<18}  "
                         f"{_result(ev, o)}")
        if line is not None:
            lines.append(f"  line:     {format_bytes(line.static_bytes)} + "
                         f"{format_bytes(line.per_sample_bytes)} per sample "
                         f"(small batches {line.batch_sizes[0]}-{line.batch_sizes[-1]})")
        lines.append(f"  {self.explanation}")
        return "\n".join(lines)


def _plans_fitting_above(ev: Evidence, ceiling: Optional[int]) -> str:
    """Where XLA's plans fit the limit above a size whose plan does not
    (it recomputes activations differently from size to size), which, and
    why the ceiling stays below them; else `""`."""
    if not ceiling:
        return ""
    plans = [o for o in ev.observations if o.how == PLAN and o.batch_size > ceiling]
    failed = sorted(o.batch_size for o in plans if ev.failed(o))
    fit = sorted(o.batch_size for o in plans
                 if not ev.failed(o) and failed and o.batch_size > failed[0])
    if not fit:
        return ""
    below = [f for f in failed if f < fit[-1]]
    return (f"XLA's plans also fit at {_listed(fit)}, above "
            f"{_listed(below)}, which {'does' if len(below) == 1 else 'do'} not "
            "(it recomputes activations differently from size to size): a run "
            "there trains only if none of its batches, an epoch's smaller last "
            "one included, is a size that does not fit.")


def _listed(sizes: list[int]) -> str:
    """`"29"`, `"29 and 30"`, `"29, 30 and 32"`."""
    words = [str(b) for b in sizes]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _result(ev: Evidence, o: Observation) -> str:
    if not o.ran:
        return "out of memory"
    if ev.failed(o):
        return "over the limit"
    return "ran" if o.how in ("step", "job") else "fits"
