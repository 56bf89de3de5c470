"""`CapacityEstimate`: what `estimate_max_batch_size` found, and its text."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional

from keras_memwatch.capacity.fit import predict_batch_size
from keras_memwatch.units import format_bytes

#: The sources of `CapacityEstimate.limit_source`.
LIMIT_ALLOCATOR = "GPU allocator limit"
LIMIT_NVML = "NVML total"
LIMIT_HOST = "host available memory"


@dataclasses.dataclass(frozen=True)
class Trial:
    """One real training step of the confirmation on a GPU.

    Attributes:
        batch_size: the batch trained.
        ran: whether the step ran (else it ran out of memory).
        purpose: `"boundary"` (searching the largest batch under the whole
            limit), `"recommended"` (the answer under the headroom) or
            `"expandable_segments"` (the boundary with that setting on).
        expandable_segments: whether PyTorch's `expandable_segments` was on.
        fresh_process: whether the steps ran in a new process (else in the
            measuring one).
        allocated_peak_bytes: the allocator's allocated peak of the step
            (device bytes in use, not above the baseline), where it ran.
        reserved_peak_bytes: PyTorch's reserved peak of the step from a
            freed cache, where it ran and torch reports it.
        seconds: how long the step took.
        error: the exception's class name, where it ran out of memory.
        cyclic_bytes: PyTorch: the device bytes that one garbage
            collection freed after the steps (in the measuring process,
            whose steps run with the collector paused, or at the end of a
            new process's job; `keras_memwatch.capacity.collector`): what
            reference cycles held; `None` where not measured.
    """

    batch_size: int
    ran: bool
    purpose: str = ""
    expandable_segments: bool = False
    allocated_peak_bytes: Optional[int] = None
    reserved_peak_bytes: Optional[int] = None
    seconds: float = 0.0
    error: str = ""
    fresh_process: bool = False
    cyclic_bytes: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Alternative:
    """Another method's answer, where two measure the same step differently.

    Attributes:
        method: the other method (`"xla"`).
        measured_by: what it reads, in words.
        predicted_batch_size: its answer under the same limit and headroom.
        per_sample_bytes: its working memory per sample.
        reason: why the estimate's own answer was kept.
    """

    method: str
    measured_by: str
    predicted_batch_size: Optional[int]
    per_sample_bytes: Optional[float]
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class CapacityEstimate:
    """What `estimate_max_batch_size` found.

    Attributes:
        predicted_batch_size: the largest batch expected to fit under the
            limit less the headroom, or `None` when no prediction can be
            trusted (see `explanation`).
        static_bytes: memory that does not grow with the batch: the memory
            in use before the steps (weights, optimizer state, the runtime)
            plus the fitted constant part of a step; `None` without a fit.
        per_sample_bytes: the fitted working memory of one more sample.
        limit_bytes: the device limit, or `None` when none is known.
        limit_source: `"GPU allocator limit"`, `"NVML total"`, `"host
            available memory"`, or `""`.
        measurements: `(batch_size, working_bytes)` for each size that was
            measured, in the order tried.
        residual: the largest distance of a measurement from the line, as
            a fraction of the largest measurement.
        explanation: one line saying how the prediction was made, or why
            there is none.
        headroom: the fraction of the limit kept free.
        in_use_bytes: memory in use before the steps.
        step_static_bytes: the constant part of a step's working memory
            (`static_bytes - in_use_bytes`): the line's intercept, never
            below 0 (a line that crosses zero above batch 0 is taken to
            start at 0, which only raises what larger batches need).
        r_squared: the fit's coefficient of determination.
        fit_batch_sizes: the sizes the line was fitted to.
        device: `"GPU:0"`, ... or `"host"`.
        backend: the Keras backend.
        method: `"xla"`, `"reserved"` or `"probes"` (see `keras_memwatch.capacity`).
        measured_by: what the working memory was read from, in words.
        limit_detail: where the limit comes from, in words.
        ceiling_batch_size: the largest batch that fits the whole limit (no
            headroom), where it was searched: on JAX (method `"xla"`) the
            largest whose compiled step fits (XLA fits a step it would
            otherwise not by recomputing activations, so this can be well
            above what the line says, with slower steps), on a GPU told to
            3% by plans compiled without autotuning, which near XLA's limit
            may plan a few percent more or less than `fit`'s compilation
            (an H200, a transformer: 4% less to 6% more), and are not
            checked as `fit` compiles them; on a GPU measured by the
            probes under an allocator cap, the largest batch that trained:
            as a job, 4 epochs of 15 steps, in a new process where
            `fresh_process` ran (PyTorch), else two real steps in the
            measuring one.
        checked: `(batch_size, working_bytes)` of XLA's compiled plan at
            each size checked after the fit (method `"xla"`), in order.
        reserved_measurements: PyTorch on a GPU: `(batch_size,
            reserved_bytes)`, the caching allocator's reserved peak of each
            ladder step above the reserved bytes before the ladder (from a
            freed cache): what the allocator took from the device.
        reserved_static_bytes: the constant part of the line through
            `reserved_measurements` (never below 0).
        reserved_per_sample_bytes: its slope.
        in_process_ceiling_batch_size: the largest batch that trained two
            real steps in the measuring process, where the ceiling was then
            searched in new processes (a process that has trained can fit
            more).
        fresh_process_note: why the answer is not from new processes,
            where they were tried or asked for and could not run.
        trials: the real steps that confirmed the answer on a GPU
            (`Trial`), in order.
        allocator_settings: PyTorch: the allocator settings in effect
            (`PYTORCH_CUDA_ALLOC_CONF`), in words.
        expandable_batch_size: PyTorch: the largest batch that trained under
            the whole limit with `expandable_segments:True`, where measured.
        alternatives: other methods' answers for the same step (JAX on the
            CPU: XLA's plan beside the host's RSS), with why this one was
            kept.
        batches_ahead: JAX on an accelerator: the batches a `fit` holds
            ahead of its step that the plans count (see
            `keras_memwatch.capacity.run_ahead`).
        seconds: how long the estimate took.
    """

    predicted_batch_size: Optional[int]
    static_bytes: Optional[int]
    per_sample_bytes: Optional[float]
    limit_bytes: Optional[int]
    limit_source: str
    measurements: tuple[tuple[int, int], ...]
    residual: Optional[float]
    explanation: str
    headroom: float = 0.1
    in_use_bytes: Optional[int] = None
    step_static_bytes: Optional[int] = None
    r_squared: Optional[float] = None
    fit_batch_sizes: tuple[int, ...] = ()
    device: str = ""
    backend: str = ""
    method: str = ""
    measured_by: str = ""
    limit_detail: str = ""
    ceiling_batch_size: Optional[int] = None
    in_process_ceiling_batch_size: Optional[int] = None
    fresh_process_note: str = ""
    checked: tuple[tuple[int, int], ...] = ()
    reserved_measurements: tuple[tuple[int, int], ...] = ()
    reserved_static_bytes: Optional[int] = None
    reserved_per_sample_bytes: Optional[float] = None
    trials: tuple[Trial, ...] = ()
    allocator_settings: str = ""
    expandable_batch_size: Optional[int] = None
    alternatives: tuple[Alternative, ...] = ()
    batches_ahead: Optional[int] = None
    seconds: float = 0.0

    def batch_size_for(self, headroom: float) -> Optional[int]:
        """The fitted line's prediction for another headroom.

        Where XLA's compiled plans were checked, the line does not know
        that XLA recomputes activations near the limit: see
        `ceiling_batch_size`.

        Args:
            headroom: fraction of the limit to keep free, in [0, 1).

        Returns:
            The largest batch size, or `None` when this estimate has none.

        Raises:
            ValueError: for `headroom` outside [0, 1).
        """
        check_headroom(headroom)
        if (self.predicted_batch_size is None or self.limit_bytes is None
                or self.static_bytes is None or not self.per_sample_bytes):
            return None
        return predict_batch_size(self.limit_bytes, headroom, self.static_bytes,
                                  self.per_sample_bytes)

    def reserved_batch_size_for(self, headroom: float) -> Optional[int]:
        """The answer of the line through the reserved peaks (PyTorch).

        Args:
            headroom: fraction of the limit to keep free, in [0, 1).

        Returns:
            The largest batch size, or `None` without such a line.
        """
        check_headroom(headroom)
        if (self.limit_bytes is None or self.in_use_bytes is None
                or self.reserved_static_bytes is None
                or not self.reserved_per_sample_bytes
                or self.reserved_per_sample_bytes <= 0):
            return None
        return predict_batch_size(self.limit_bytes, headroom,
                                  self.in_use_bytes + self.reserved_static_bytes,
                                  self.reserved_per_sample_bytes)

    def to_dict(self) -> dict[str, Any]:
        """Every field, as JSON-ready values (`None` for NaN)."""
        out = dataclasses.asdict(self)
        for key, value in out.items():
            if isinstance(value, tuple):
                out[key] = [list(v) if isinstance(v, tuple) else v for v in value]
            elif isinstance(value, float) and value != value:
                out[key] = None
        return out

    def to_dataframe(self) -> Any:
        """The measurements as a `pandas.DataFrame`.

        Returns:
            A frame of `batch_size`, `working_bytes`, `fitted_bytes` (the
            line) and `in_fit`.
        """
        import pandas as pd

        frame = pd.DataFrame(list(self.measurements),
                             columns=["batch_size", "working_bytes"])
        if self.per_sample_bytes is not None and self.step_static_bytes is not None:
            frame["fitted_bytes"] = (self.step_static_bytes
                                     + self.per_sample_bytes * frame["batch_size"])
        else:
            frame["fitted_bytes"] = float("nan")
        frame["in_fit"] = frame["batch_size"].isin(self.fit_batch_sizes)
        return frame

    def __str__(self) -> str:
        head = ("Largest batch that fits: "
                + ("none predicted" if self.predicted_batch_size is None
                   else str(self.predicted_batch_size))
                + f" ({self.device}, {self.backend}, {self.measured_by})")
        lines = [head]
        if self.limit_bytes is not None:
            lines.append(
                f"  limit:      {format_bytes(self.limit_bytes)} "
                f"({self.limit_source}), "
                f"less {self.headroom:.0%} headroom: "
                f"{format_bytes(self.limit_bytes * (1 - self.headroom))}")
        if self.static_bytes is not None:
            lines.append(
                f"  static:     {format_bytes(self.static_bytes)} (in use before "
                f"the steps {format_bytes(self.in_use_bytes)} "
                f"{signed_bytes(self.step_static_bytes or 0)} constant part of a "
                "step)")
        per_sample = self.per_sample_bytes
        if per_sample is not None and per_sample == per_sample:
            lines.append(f"  per sample: {format_bytes(self.per_sample_bytes)}")
        if self.residual is not None and self.residual == self.residual:
            lines.append(
                f"  fit:        within {self.residual:.1%} of the largest "
                f"measurement (R^2 {self.r_squared:.5f}) at batch sizes "
                f"{sizes_text(self.fit_batch_sizes)}")
        reserved = dict(self.reserved_measurements)
        lines.append("  measured:   batch  working memory"
                     + ("  reserved (allocator)" if reserved else ""))
        fitted = set(self.fit_batch_sizes)
        for batch, working in self.measurements:
            mark = "" if batch in fitted else "  (not in the fit)"
            extra = (f"  {format_bytes(reserved[batch]):>10}" if batch in reserved
                     else "")
            lines.append(f"              {batch:>5}  {format_bytes(working):>10}"
                         f"{extra}{mark}")
        if self.ceiling_batch_size is not None:
            how = ("by XLA's compiled plans, not trained" if self.method == "xla" else
                   "the largest batch that trained for real in a new process; "
                   f"{self.in_process_ceiling_batch_size} in the measuring one"
                   if self.in_process_ceiling_batch_size is not None else
                   "the largest batch that trained for real in this process")
            lines.append(f"  ceiling:    batch {self.ceiling_batch_size} without "
                         f"headroom ({how})")
        if self.trials:
            lines.append("  trained:    batch  result          reserved peak  (real "
                         "steps on the device)")
            for t in self.trials:
                result = "ran" if t.ran else "out of memory"
                peak = (format_bytes(t.reserved_peak_bytes)
                        if t.reserved_peak_bytes else "")
                where = ", new process" if t.fresh_process else ""
                lines.append(f"              {t.batch_size:>5}  {result:<14}  "
                             f"{peak:>13}  {t.purpose}{where}")
        if self.allocator_settings:
            lines.append(f"  allocator:  {self.allocator_settings}")
        if self.expandable_batch_size is not None:
            lines.append(f"  expandable_segments:True: batch "
                         f"{self.expandable_batch_size} trained under the whole limit")
        for alt in self.alternatives:
            answer = ("none" if alt.predicted_batch_size is None
                      else str(alt.predicted_batch_size))
            lines.append(f"  also:       {answer} by {alt.measured_by}"
                         + (f" ({format_bytes(alt.per_sample_bytes)} per sample)"
                            if alt.per_sample_bytes else "") + "; not used: "
                         + alt.reason)
        if self.checked:
            lines.append("  compiled:   batch  working memory (XLA's plan, not run)")
            for batch, working in self.checked:
                lines.append(f"              {batch:>5}  {format_bytes(working):>10}")
        lines.append(f"  {self.explanation}")
        return "\n".join(lines)


def check_headroom(headroom: float) -> None:
    """Raises `ValueError` unless `headroom` is a fraction in [0, 1)."""
    if (isinstance(headroom, bool) or not isinstance(headroom, (int, float))
            or not 0 <= headroom < 1):
        raise ValueError(
            "Expected `headroom` to be a fraction in [0, 1). Received: "
            f"headroom={headroom!r}")


def signed_bytes(n: float) -> str:
    """`+ 1.2 MiB` or `- 1.2 MiB`."""
    return f"{'-' if n < 0 else '+'} {format_bytes(abs(n))}"


def sizes_text(sizes: Sequence[int]) -> str:
    """Batch sizes as `"2, 4, 8"`, or `"none"`.

    Args:
        sizes: the batch sizes.

    Returns:
        The sizes, comma-separated, or `"none"` when there are none.
    """
    if not sizes:
        return "none"
    return ", ".join(str(s) for s in sizes)
