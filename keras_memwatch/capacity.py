"""Predicts the largest batch that fits, from a few small training steps.

`estimate_max_batch_size` trains the user's model for two steps at each of
a few small batch sizes, measures each step's *working memory* (its peak
above the memory in use before the ladder began: activations kept for the
backward pass, gradients, workspaces, the batch itself), fits

    working(batch) = static + per_sample x batch

by least squares, checks that the line really fits, and solves for the
largest batch under the device's limit less a headroom. The model's
weights, optimizer state (slots and iteration counter) and metric states
are put back bit for bit afterwards.

How a step's working memory is measured, per device (`method="auto"`):

- JAX on a GPU (`"xla"`): XLA's own memory plan of the compiled train step
  (see `keras_memwatch.xla_plan`): arguments + outputs - donated +
  temporaries, less the training state, which is already in memory, plus
  the next batch, which Keras sends to the device one step ahead. JAX's
  allocator has no peak that can be reset (its peak is a high-water mark
  for the life of the process), so the plan is the exact figure here.
  The line's answer is then checked by compiling (not running) the step
  at the sizes around it, and the ceiling is searched for the same way:
  once a plan would not fit, XLA recomputes activations rather than run
  out of memory, so far more fits than the line says. On an H200 under
  an 8 GiB limit the line gave 855 for a convnet, the ceiling 1264, and
  1260 was the largest batch that trained (see `ceiling_batch_size`).
- Otherwise (`"probes"`: PyTorch and TensorFlow on a GPU, every backend on
  the CPU): keras_memwatch's probes, the same readings MemWatch records: the
  allocator's peak since the previous sample (PyTorch, TensorFlow), or the
  host's
  peak resident set size (Linux; reset through `/proc/self/clear_refs`).
  On the host, freed heap memory is handed back to the system
  (`malloc_trim`, glibc) before each measured step, and the working memory
  is the peak above the RSS measured once after the first step, since CPU
  allocators (oneDNN, Eigen) keep what they freed. Where a device only has
  a high-water mark (JAX on a GPU with `method="probes"`), a size counts
  only when the mark rose during its steps, and then includes its first
  step (compilation, autotuning).
- PyTorch on a GPU can also be measured by the caching allocator's peak
  *reserved* bytes (`method="reserved"`), which its per-process cap bounds.
  On an H200 under an 8 GiB cap (a 4-layer convnet) it predicted 785 where
  917 was the largest batch that ran (-14%), while the allocated peak of
  `"probes"` predicted 921 (+0.4%): hence not the default.

The limit is the GPU allocator's limit where the framework reports one
(JAX's pool, PyTorch's per-process cap, TensorFlow's logical-device limit
set through `configure_memory`), else the device's total memory from NVML;
on the CPU it is the memory still available to the host (`MemAvailable`,
or the cgroup's limit when lower) plus what this process already holds.

On the CPU, predictions are rougher than on a GPU: a step's RSS moves by
a few MiB from one run to the next, so the ladder must reach hundreds of
MiB of working memory (the default one does), and CPU allocators keep
freed memory between steps, so a long `fit` may hold more than one step's
peak (the headroom is there for that). Under `RLIMIT_AS` the limit is the
address space left, which allocators consume faster than resident memory.

The default ladder starts at batch 2 and grows (x2 to x8 a step) until a
step's working memory reaches 5% of the free memory, with at least four
sizes; it never tries a size whose working memory, extrapolated from the
sizes before it, would exceed 20% of the free memory, and stops at 12
sizes or batch 65536. A fit is trusted when every measurement lies within
10% (of the largest) of the line, and the line through all sizes but the
largest predicts the largest within 10% (extrapolation, tested); the
smallest sizes are dropped first (down to three) where a constant part
still dominates them.
Otherwise no batch size is predicted (`predicted_batch_size` is `None`)
and `explanation` says why: a result, not an exception, so the
measurements can still be read.

This module imports no framework and no Keras until a function runs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from collections.abc import Sequence
from typing import Any, Callable, Optional

from keras_memwatch import options, xla_plan
from keras_memwatch.breakdown import unique_variables
from keras_memwatch.units import format_bytes

logger = logging.getLogger("keras_memwatch")

__all__ = [
    "CapacityEstimate",
    "LinearFit",
    "estimate_max_batch_size",
    "fit_linear",
    "host_available_bytes",
    "predict_batch_size",
]

LIMIT_ALLOCATOR = "GPU allocator limit"
LIMIT_NVML = "NVML total"
LIMIT_HOST = "host available memory"

METHODS = ("auto", "probes", "xla", "reserved")
_METHOD_WORDS = {
    "xla": "XLA memory plan of the compiled train step",
    "reserved": "PyTorch reserved-memory peak",
    "probes": "allocator peak per step",
    "probes-host": "host peak RSS",
    "probes-hwm": "allocator high-water mark",
}

HOST = "host"
_MAX_RESIDUAL = 0.10  # of the largest measurement
_TARGET = 0.05  # the ladder's largest working memory, of the free memory
_SAFE = 0.20  # never try a size expected to need more, of the free memory
_START = 2
_MAX_TRIALS = 12
_MIN_POINTS = 4
_MAX_BATCH = 2**16
_FLOOR = 2**20  # working memory assumed at least, when growing the ladder
_MAX_CHECKS = 10  # compilations of XLA's plan after the fit


# --------------------------------------------------------------------------
# The fit


@dataclasses.dataclass(frozen=True)
class LinearFit:
    """A least-squares line through (batch size, working bytes).

    Attributes:
        static_bytes: the intercept: working memory that does not grow
            with the batch.
        per_sample_bytes: the slope.
        residual: the largest distance of a measurement from the line, as
            a fraction of the largest measurement.
        r_squared: the coefficient of determination.
        batch_sizes: the sizes the line was fitted to.
        linear: whether the line is trusted for extrapolation.
        reason: why not, when it is not.
    """

    static_bytes: float
    per_sample_bytes: float
    residual: float
    r_squared: float
    batch_sizes: tuple[int, ...]
    linear: bool
    reason: Optional[str] = None


def _line(points: Sequence[tuple[int, int]]) -> LinearFit:
    import numpy as np

    b = np.array([p[0] for p in points], dtype=np.float64)
    w = np.array([p[1] for p in points], dtype=np.float64)
    slope, intercept = np.polyfit(b, w, 1)
    predicted = intercept + slope * b
    scale = max(float(np.abs(w).max()), 1.0)
    residual = float(np.abs(w - predicted).max()) / scale
    total = float(((w - w.mean()) ** 2).sum())
    r2 = 1.0 - float(((w - predicted) ** 2).sum()) / total if total > 0 else 0.0
    return LinearFit(float(intercept), float(slope), residual, r2,
                     tuple(int(x) for x in b), True)


def _flaw(fit: LinearFit, points: Sequence[tuple[int, int]],
          tolerance: float) -> Optional[str]:
    if fit.per_sample_bytes <= 0:
        return (f"the working memory does not grow with the batch size (fitted "
                f"{format_bytes(fit.per_sample_bytes)} per sample)")
    if fit.residual > tolerance:
        return (f"the working memory is not linear in the batch size (a "
                f"measurement lies {fit.residual:.0%} of the largest one off the "
                f"line, more than {tolerance:.0%})")
    # Extrapolation is what the line is for: the line through all but the
    # largest size must predict the largest.
    held = _line(points[:-1]) if len(points) > 3 else None
    if held is None:
        (b1, w1), (b2, w2) = points[-3], points[-2]
        slope = (w2 - w1) / (b2 - b1)
        intercept = w1 - slope * b1
    else:
        slope, intercept = held.per_sample_bytes, held.static_bytes
    batch, working = points[-1]
    miss = abs(intercept + slope * batch - working) / max(working, 1)
    if miss > tolerance:
        return (f"the working memory is not linear in the batch size: the line "
                f"through the smaller sizes misses batch {batch} by {miss:.0%}, "
                f"more than {tolerance:.0%}")
    return None


def fit_linear(points: Sequence[tuple[int, int]],
               tolerance: float = _MAX_RESIDUAL) -> LinearFit:
    """Fits working memory = static + per_sample x batch, and judges the fit.

    The line is fitted to all points; when it does not fit, the smallest
    batch sizes are dropped one by one (down to three points), since a
    constant part (gradients of the weights, workspaces) may dominate them.

    Args:
        points: `(batch_size, working_bytes)` pairs, at three or more
            distinct batch sizes.
        tolerance: the largest distance of a point from the line, as a
            fraction of the largest measurement. Defaults to `0.1`.

    Returns:
        A `LinearFit`; `linear` is `False` (with a `reason`) when fewer than
        three sizes were measured, when memory does not grow with the batch,
        when a point lies off the line by more than `tolerance`, or when
        the line through all sizes but the largest misses the largest by
        more than `tolerance` of it (the test of extrapolation).

    Example:

    >>> fit = fit_linear([(2, 1200), (4, 1400), (8, 1800)])
    >>> round(fit.static_bytes), round(fit.per_sample_bytes), fit.linear
    (1000, 100, True)
    """
    by_size: dict[int, list[int]] = {}
    for batch, working in points:
        by_size.setdefault(int(batch), []).append(int(working))
    pts = sorted((b, round(sum(ws) / len(ws))) for b, ws in by_size.items())
    if len(pts) < 3:
        return LinearFit(math.nan, math.nan, math.nan, math.nan,
                         tuple(b for b, _ in pts), False,
                         f"only {len(pts)} batch size(s) measured; a line needs three")
    first = _line(pts)
    first_flaw = _flaw(first, pts, tolerance)
    if first_flaw is None:
        return first
    for start in range(1, len(pts) - 2):
        fit = _line(pts[start:])
        if _flaw(fit, pts[start:], tolerance) is None:
            return fit
    return dataclasses.replace(first, linear=False, reason=first_flaw)


def predict_batch_size(limit_bytes: int, headroom: float, static_bytes: float,
                       per_sample_bytes: float) -> int:
    """floor((limit x (1 - headroom) - static) / per_sample), at least 0."""
    if per_sample_bytes <= 0:
        raise ValueError(
            f"Expected `per_sample_bytes` > 0. Received: {per_sample_bytes!r}")
    room = limit_bytes * (1.0 - headroom) - static_bytes
    return max(int(math.floor(room / per_sample_bytes)), 0)


# --------------------------------------------------------------------------
# The result


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
        step_static_bytes: the fitted constant part of a step's working
            memory (`static_bytes - in_use_bytes`).
        r_squared: the fit's coefficient of determination.
        fit_batch_sizes: the sizes the line was fitted to.
        device: `"GPU:0"`, ... or `"host"`.
        backend: the Keras backend.
        method: `"xla"`, `"reserved"` or `"probes"` (see the module).
        measured_by: what the working memory was read from, in words.
        limit_detail: where the limit comes from, in words.
        ceiling_batch_size: method `"xla"` only: the largest batch whose
            compiled step fits the whole limit (no headroom). XLA fits a
            step it would otherwise not by recomputing activations, so this
            can be well above what the line says (slower steps).
        checked: `(batch_size, working_bytes)` of XLA's compiled plan at
            each size checked after the fit (method `"xla"`), in order.
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
    checked: tuple[tuple[int, int], ...] = ()

    def batch_size_for(self, headroom: float) -> Optional[int]:
        """The fitted line's prediction for another headroom.

        Where XLA's compiled plans were checked, the line does not know
        that XLA recomputes activations near the limit: see
        `ceiling_batch_size`.

        Args:
            headroom: fraction of the limit to keep free, in [0, 1).

        Returns:
            The largest batch size, or `None` when this estimate has none.
        """
        _check_headroom(headroom)
        if (self.predicted_batch_size is None or self.limit_bytes is None
                or self.static_bytes is None or not self.per_sample_bytes):
            return None
        return predict_batch_size(self.limit_bytes, headroom, self.static_bytes,
                                  self.per_sample_bytes)

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
        """The measurements as a `pandas.DataFrame`: `batch_size`,
        `working_bytes`, `fitted_bytes` (the line) and `in_fit`."""
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
                f"{_signed(self.step_static_bytes or 0)} constant part of a step)")
        per_sample = self.per_sample_bytes
        if per_sample is not None and per_sample == per_sample:
            lines.append(f"  per sample: {format_bytes(self.per_sample_bytes)}")
        if self.residual is not None and self.residual == self.residual:
            lines.append(
                f"  fit:        within {self.residual:.1%} of the largest "
                f"measurement (R^2 {self.r_squared:.5f}) at batch sizes "
                f"{_sizes_text(self.fit_batch_sizes)}")
        lines.append("  measured:   batch  working memory")
        fitted = set(self.fit_batch_sizes)
        for batch, working in self.measurements:
            mark = "" if batch in fitted else "  (not in the fit)"
            lines.append(f"              {batch:>5}  {format_bytes(working):>10}{mark}")
        if self.ceiling_batch_size is not None:
            lines.append(f"  ceiling:    batch {self.ceiling_batch_size} without "
                         "headroom (XLA's compiled plan)")
        if self.checked:
            lines.append("  compiled:   batch  working memory (XLA's plan, not run)")
            for batch, working in self.checked:
                lines.append(f"              {batch:>5}  {format_bytes(working):>10}")
        lines.append(f"  {self.explanation}")
        return "\n".join(lines)


def _signed(n: float) -> str:
    """`+ 1.2 MiB` or `- 1.2 MiB`."""
    return f"{'-' if n < 0 else '+'} {format_bytes(abs(n))}"


def _sizes_text(sizes: Sequence[int]) -> str:
    if not sizes:
        return "none"
    return ", ".join(str(s) for s in sizes)


# --------------------------------------------------------------------------
# The host's available memory


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def host_available_bytes() -> tuple[Optional[int], str]:
    """Memory still available to this process on the host.

    Returns:
        `(bytes, where from)`: Linux's `MemAvailable` (else psutil's
        `available`), lowered to the cgroup's free memory (`memory.max -
        memory.current`, or cgroup v1's limit less usage) when a container
        limit is lower, and to the address space left under `RLIMIT_AS`
        when that is lower still; `(None, why)` when nothing can tell.
    """
    available: Optional[int] = None
    source = ""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    source = "MemAvailable"
                    break
    except OSError:
        pass
    if available is None:
        try:
            import psutil

            available = int(psutil.virtual_memory().available)
            source = "psutil available memory"
        except Exception:
            return None, "no /proc/meminfo and no psutil (pip install psutil)"
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
         "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and usage is not None and limit < 2**60:
            free = max(limit - usage, 0)
            if free < available:
                available, source = free, "the cgroup's free memory"
            break
    room = _address_space_room()
    if room is not None and room < available:
        available, source = room, "the address space left under RLIMIT_AS"
    return available, source


def _address_space_room() -> Optional[int]:
    """RLIMIT_AS less this process's virtual size (Linux), else None."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return max(soft - int(line.split()[1]) * 1024, 0)
    except (ImportError, OSError, ValueError):
        pass
    return None


# --------------------------------------------------------------------------
# Data and model state


def _as_array(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.ndarray):
        array = value
    elif hasattr(value, "shape") and hasattr(value, "dtype"):
        import keras

        array = keras.ops.convert_to_numpy(value)
    else:
        array = np.asarray(value)
    if array.ndim < 1 or array.dtype == object:
        raise TypeError(
            "Expected `x` and `y` to be arrays (or nested lists/dicts of arrays) "
            "holding a sample batch, not a dataset or generator. Received: "
            f"{type(value).__name__}")
    return array


class _Batches:
    """A sample batch, repeated along axis 0 to any batch size."""

    def __init__(self, x: Any, y: Any):
        import keras

        self.x = keras.tree.map_structure(_as_array, x)
        self.y = None if y is None else keras.tree.map_structure(_as_array, y)
        leaves = keras.tree.flatten(self.x) + (
            [] if self.y is None else keras.tree.flatten(self.y))
        sizes = {int(a.shape[0]) for a in leaves}
        if len(sizes) != 1 or 0 in sizes:
            raise ValueError(
                "Expected every array of `x` and `y` to hold the same, non-zero "
                f"number of samples. Received: {sorted(sizes)}")
        self.n = sizes.pop()

    def take(self, size: int) -> tuple[Any, Any]:
        import keras
        import numpy as np

        n = self.n

        def take(a: Any) -> Any:
            if size <= n:
                return a[:size]
            return np.take(a, np.arange(size) % n, axis=0)

        return (keras.tree.map_structure(take, self.x),
                None if self.y is None else keras.tree.map_structure(take, self.y))


def _numpy_copy(variable: Any) -> Any:
    import keras
    import numpy as np

    return np.array(keras.ops.convert_to_numpy(variable.value), copy=True)


def _build(model: Any, batch: tuple[Any, Any]) -> None:
    """Creates every variable a training step needs, without changing any.

    Keras's own `Trainer._symbolic_build` (what `fit` and `train_on_batch`
    run first) builds the model, its compiled metrics and loss, and the
    optimizer's slots, all symbolically. Without it, the model is called
    once on the batch and the optimizer built on the trainable variables.
    """
    x, y = batch
    symbolic = getattr(model, "_symbolic_build", None)
    if callable(symbolic):
        symbolic(data_batch=(x, y, None))
    else:  # pragma: no cover - every Keras 3 trainer has it
        if not model.built:
            model(x)
    optimizer = model.optimizer
    if optimizer is not None and not getattr(optimizer, "built", True):
        optimizer.build(model.trainable_variables)


class _ModelState:
    """A copy of a model's whole training state, to put back afterwards.

    The state is every variable of the model (weights and seed-generator
    states), of its optimizer (slots, iteration counter, learning rate,
    loss scale) and of its metrics, copied to host memory; on PyTorch also
    each parameter's `.grad`, which a Keras train step leaves filled.
    """

    def __init__(self, model: Any):
        self.model = model
        self.variables = unique_variables(list(model.variables)
                                 + list(model.optimizer.variables)
                                 + list(model.metrics_variables))
        self.values = [_numpy_copy(v) for v in self.variables]
        self.grads: list[tuple[Any, Any]] = []
        for v in model.trainable_variables:
            tensor = getattr(v, "value", None)
            if hasattr(tensor, "grad") and hasattr(tensor, "requires_grad"):
                self.grads.append((tensor, tensor.grad))

    def restore(self) -> None:
        for variable, value in zip(self.variables, self.values):
            variable.assign(value)
        for tensor, grad in self.grads:
            tensor.grad = grad
        if getattr(self.model, "_jax_state", None) is not None:
            # The JAX trainer keeps the last step's state (what `fit` clears
            # at its end); it would hold a second copy of every variable.
            self.model._jax_state = None
            self.model._jax_state_synced = True

    def changed(self) -> list[str]:
        """Paths of variables whose value differs from the copy."""
        import numpy as np

        return [getattr(v, "path", str(i)) for i, (v, saved) in
                enumerate(zip(self.variables, self.values))
                if not np.array_equal(_numpy_copy(v), saved, equal_nan=True)]


# --------------------------------------------------------------------------
# Measuring a step


def _trim_host_heap() -> None:
    """Hands freed glibc heap memory back to the system (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except Exception:
        pass


def _device_name(device: str) -> str:
    text = device.strip()
    if text.lower() in ("host", "cpu", "cpu:0"):
        return HOST
    prefix, _, index = text.rpartition(":")
    kind = prefix.lower().rsplit("/", 1)[-1].replace("device:", "")
    if kind in ("gpu", "cuda") and index.isdigit():
        return f"GPU:{int(index)}"
    raise ValueError(
        "Expected `device` to be 'GPU:<i>' or 'host'. Received: "
        f"device={device!r}")


class _Meter:
    """Measures the working memory of a step on one device (see the module)."""

    def __init__(self, backend: str, device: Optional[str], method: str):
        from keras_memwatch import columns as C
        from keras_memwatch.probes import resolve_probes
        from keras_memwatch.sampler import Sampler

        self.C = C
        self.backend = backend
        wanted = None if device is None else _device_name(device)
        self.probes = resolve_probes("auto", backend)
        self.sampler = Sampler(self.probes)
        devices = self.sampler.start()
        gpus = [d for d in devices if d != HOST
                and C.ALLOCATOR_CURRENT in self.sampler.device_columns.get(d, ())]
        if wanted is None:
            device = gpus[0] if gpus else HOST
        else:
            device = wanted
            if device != HOST and device not in gpus:
                self.sampler.close()
                raise ValueError(
                    f"Expected `device` to be one the {backend} backend computes on: "
                    f"{gpus + [HOST] if HOST in devices else gpus}. Received: "
                    f"device={device!r}")
        if device not in devices:
            self.sampler.close()
            raise RuntimeError(f"no probe reports {device}: {self.sampler.notes}")
        self.device = device
        self.index = devices.index(device)
        self.on_gpu = device != HOST
        self.automatic = method == "auto"
        if method == "auto":
            method = "xla" if backend == "jax" and self.on_gpu else "probes"
        elif method == "xla" and backend != "jax":
            self.sampler.close()
            raise ValueError(
                f"Expected method='xla' only with the JAX backend. Received: "
                f"backend {backend!r}")
        elif method == "reserved" and not (backend == "torch" and self.on_gpu):
            self.sampler.close()
            raise ValueError(
                "Expected method='reserved' only with the PyTorch backend on a GPU. "
                f"Received: backend {backend!r}, device {device!r}")
        self.method = method
        if self.on_gpu:
            peak_probes = [p for p in self.probes if p.name == backend]
            self.peak_column = C.ALLOCATOR_PEAK
        else:
            peak_probes = [p for p in self.probes if p.name == HOST]
            self.peak_column = C.HOST_PEAK_RSS
        self.per_step = bool(peak_probes) and all(
            p.peak_per_sample for p in peak_probes)
        self.words = (method if method != "probes" else
                      "probes-host" if not self.on_gpu and self.per_step else
                      "probes" if self.per_step else "probes-hwm")
        self.gpu_index = int(device.split(":")[1]) if self.on_gpu else None
        self.baseline: Optional[int] = None
        self._mark: Optional[int] = None

    def _row(self) -> dict[str, Optional[int]]:
        return self.sampler.sample()[self.index]

    def _sync(self) -> None:
        if self.backend == "torch" and self.on_gpu:
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize(self.gpu_index)

    def set_baseline(self) -> int:
        """Reads the memory in use now, which every later step is measured from."""
        if self.method == "reserved":
            import torch

            self._sync()
            torch.cuda.empty_cache()
            self.baseline = int(torch.cuda.memory_reserved(self.gpu_index))
            return self.baseline
        if not self.on_gpu:
            _trim_host_heap()
        current = self._row()["current_bytes"]
        if current is None:
            raise RuntimeError(
                f"no probe reports the memory in use on {self.device}: "
                f"{self.sampler.notes}")
        self.baseline = int(current)
        return self.baseline

    def begin_size(self) -> None:
        """Before the first step at a new size: remembers the high-water mark."""
        if not self.per_step and self.method in ("probes", "xla"):
            self._mark = self._row().get(self.peak_column)

    def measure(self, step: Callable[[], Any], model: Any,
                batch: tuple[Any, Any], size: int) -> Optional[int]:
        """Runs `step` and returns its working memory, or `None` when hidden."""
        assert self.baseline is not None
        if self.method == "xla":
            step()
            try:
                return xla_plan.working_bytes(model, batch, size)
            except Exception as e:
                if not self.automatic:
                    raise
                # Keras internals moved, or a distribution is set: fall back
                # to the allocator's high-water mark from the next size on.
                logger.warning("XLA's memory plan of the train step is not "
                               "available (%r); measuring with the probes", e)
                self.method = "probes"
                self.words = "probes" if self.per_step else "probes-hwm"
                return None
        if self.method == "reserved":
            import torch

            self._sync()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.gpu_index)
            step()
            self._sync()
            peak = int(torch.cuda.max_memory_reserved(self.gpu_index))
            return max(peak - self.baseline, 0)
        if not self.on_gpu:
            _trim_host_heap()
        self._row()  # resets the peaks that can be reset
        step()
        self._sync()
        peak = self._row().get(self.peak_column)
        if peak is None:
            return None
        if not self.per_step and self._mark is not None and peak <= self._mark:
            return None  # an earlier, higher mark hides this size's peak
        return max(int(peak) - self.baseline, 0)

    def limit(self) -> tuple[Optional[int], str, str]:
        """`(bytes, source, detail)` of the device's limit."""
        C = self.C
        if not self.on_gpu:
            available, where = host_available_bytes()
            if available is None:
                return None, "", where
            in_use = self.baseline or 0
            return (available + in_use, LIMIT_HOST,
                    f"{where} {format_bytes(available)} + this process's "
                    f"{format_bytes(in_use)} resident; a CPU has no allocator limit")
        row = self._row()
        if row.get(C.ALLOCATOR_LIMIT):
            return (int(row[C.ALLOCATOR_LIMIT]), LIMIT_ALLOCATOR,
                    f"{self.backend} allocator")
        if row.get(C.NVML_TOTAL):
            return (int(row[C.NVML_TOTAL]), LIMIT_NVML,
                    "the device's total memory; the CUDA context and other "
                    "processes are not subtracted")
        return None, "", f"no probe reports a limit for {self.device}"

    def close(self) -> None:
        self.sampler.close()


# --------------------------------------------------------------------------
# The estimate


def _check_headroom(headroom: float) -> None:
    if (isinstance(headroom, bool) or not isinstance(headroom, (int, float))
            or not 0 <= headroom < 1):
        raise ValueError(
            "Expected `headroom` to be a fraction in [0, 1). Received: "
            f"headroom={headroom!r}")


def _check_sizes(trial_sizes: Optional[Sequence[int]]) -> Optional[list[int]]:
    if trial_sizes is None:
        return None
    sizes = list(trial_sizes)
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes) \
            or len(set(sizes)) < 3:
        raise ValueError(
            "Expected `trial_sizes` to hold at least three distinct positive "
            f"integers. Received: trial_sizes={trial_sizes!r}")
    return sorted(set(sizes))


def _next_size(size: int, points: list[tuple[int, int]], last: Optional[int],
               free: Optional[float], tried: int) -> Optional[int]:
    """The adaptive ladder's next batch size, or `None` to stop."""
    if tried >= _MAX_TRIALS:
        return None
    if free is None or free <= 0:
        return size * 2 if tried < _MIN_POINTS else None
    if (len(points) >= _MIN_POINTS and last is not None and last >= _TARGET * free
            and fit_linear(points).linear):
        return None
    floor = max(last or 0, _FLOOR)
    factor = 2
    while factor < 8 and floor * factor * 2 <= _TARGET * free:
        factor *= 2

    def expected(new: int) -> float:
        guess = floor * new / size
        if len(points) >= 2:
            line = _line(points[-2:])
            guess = max(guess, line.static_bytes + line.per_sample_bytes * new)
        return guess

    while factor > 2 and expected(size * factor) > _SAFE * free:
        factor //= 2
    new = size * factor
    if expected(new) > _SAFE * free or new > _MAX_BATCH:
        return None
    return new


def estimate_max_batch_size(
    model: Any,
    x: Any,
    y: Any = None,
    *,
    trial_sizes: Optional[Sequence[int]] = None,
    device: Optional[str] = None,
    headroom: float = 0.1,
    method: str = "auto",
) -> CapacityEstimate:
    """Predicts the largest training batch that fits in the device's memory.

    Trains `model` for two steps at each of a few small batch sizes,
    measures the second step's working memory, fits a line through
    (batch size, working memory), and solves for the largest batch under
    the device's limit less `headroom`: `floor((limit x (1 - headroom) -
    static) / per_sample)`, where `static` is the memory in use before the
    steps plus the line's constant part. Afterwards every variable of the
    model, its optimizer (slots, iteration counter) and its metrics holds
    exactly the value it had before. A model or optimizer not built yet is
    built first (as `fit` would), and stays built.

    Args:
        model: a compiled Keras model.
        x: a sample batch of inputs (arrays, or lists/dicts of arrays). It
            is repeated along its first axis to make larger batches.
        y: the matching targets. Defaults to `None` (a model whose loss
            needs no targets).
        trial_sizes: the batch sizes to measure, at least three. Defaults to
            `None`: an adaptive ladder from 2 that stays below a fifth of
            the free memory (see the module).
        device: `"GPU:0"`, ... or `"host"`. Defaults to `None`: the first
            GPU the backend computes on, else the host.
        headroom: fraction of the limit to keep free. Defaults to `0.1`.
        method: how a step's working memory is measured: `"auto"`,
            `"xla"` (JAX), `"reserved"` (PyTorch on a GPU) or `"probes"`.
            Defaults to `"auto"`.

    Returns:
        A `CapacityEstimate`. Its `predicted_batch_size` is `None`, and its
        `explanation` says why, when the device has no known limit, fewer
        than three sizes could be measured, or the measurements are not
        linear in the batch size.

    Raises:
        ValueError: for a model that is not compiled, bad `trial_sizes`,
            `headroom`, `device` or `method`, or arrays of unequal length.
        TypeError: for `x` or `y` that are not arrays.

    Example:

    ```python
    estimate = keras_memwatch.estimate_max_batch_size(model, x[:64], y[:64])
    print(estimate)
    model.fit(x, y, batch_size=estimate.predicted_batch_size)
    ```
    """
    _check_headroom(headroom)
    sizes = _check_sizes(trial_sizes)
    options.choice("method", method, METHODS)
    if (getattr(model, "optimizer", None) is None
            or not getattr(model, "compiled", True)):
        raise ValueError(
            "Expected a compiled model (call `model.compile(optimizer=..., loss=...)` "
            f"first). Received: {type(model).__name__} without an optimizer")
    import keras

    from keras_memwatch.oom import is_oom_error

    backend = keras.backend.backend()
    data = _Batches(x, y)
    _build(model, data.take(1))
    state = _ModelState(model)
    meter = _Meter(backend, device, method)
    points: list[tuple[int, int]] = []
    hidden: list[int] = []
    stopped = ""
    limit: tuple[Optional[int], str, str] = (None, "", "")
    try:
        queue = list(sizes) if sizes is not None else [_START]
        tried = 0
        while queue:
            size = queue.pop(0)
            tried += 1
            batch = data.take(size)

            def step(batch: tuple[Any, Any] = batch) -> None:
                model.train_on_batch(batch[0], batch[1])

            try:
                meter.begin_size()
                step()  # compiles for this shape; builds and warms up on the first
                if meter.baseline is None:
                    meter.set_baseline()
                    limit = meter.limit()
                working = meter.measure(step, model, batch, size)
            except Exception as e:
                if not is_oom_error(e):
                    raise
                stopped = f"batch {size} ran out of memory ({type(e).__name__})"
                logger.warning("estimate_max_batch_size: %s; the ladder stops there",
                               stopped)
                break
            if working is None:
                hidden.append(size)
            else:
                points.append((size, working))
            logger.debug("estimate_max_batch_size: batch %s on %s: working memory %s",
                         size, meter.device,
                         "hidden" if working is None else format_bytes(working))
            if sizes is None:
                free = None
                if limit[0] is not None and meter.baseline is not None:
                    free = limit[0] * (1 - headroom) - meter.baseline
                new = _next_size(size, points, working, free, tried)
                if new is not None:
                    queue.append(new)
    finally:
        try:
            state.restore()
        finally:
            if meter.method == "reserved":
                import torch

                torch.cuda.empty_cache()
            meter.close()
    estimate = _result(points, hidden, stopped, limit, meter, backend, headroom)
    if meter.method == "xla" and estimate.predicted_batch_size is not None:
        estimate = _check_compiled(estimate, model, data.take(1))
    logger.info("%s", estimate.explanation)
    return estimate


def _result(points: list[tuple[int, int]], hidden: list[int], stopped: str,
            limit: tuple[Optional[int], str, str], meter: _Meter, backend: str,
            headroom: float) -> CapacityEstimate:
    limit_bytes, source, detail = limit
    fit = fit_linear(points)
    where = f"{meter.device} ({backend}, {_METHOD_WORDS[meter.words]})"
    sizes = [b for b, _ in points]
    measured = (f"measured at batch sizes {_sizes_text(sizes)}" if sizes
                else "nothing measured")
    if hidden:
        measured += (f"; sizes {_sizes_text(hidden)} hidden under an earlier "
                     "high-water mark")
    if stopped:
        measured += f"; {stopped}"
    common: dict[str, Any] = dict(
        limit_bytes=limit_bytes, limit_source=source, limit_detail=detail,
        measurements=tuple(points), headroom=headroom, in_use_bytes=meter.baseline,
        device=meter.device, backend=backend, method=meter.method,
        measured_by=_METHOD_WORDS[meter.words])
    reason = None
    if meter.baseline is None:
        reason = "no step ran"
    elif not fit.linear:
        reason = fit.reason
        if points and max(w for _, w in points) < 64 * 2**20:
            reason += (f" (the largest working memory measured is only "
                       f"{format_bytes(max(w for _, w in points))}: pass larger "
                       "trial_sizes)")
    elif limit_bytes is None:
        reason = f"no memory limit is known for {meter.device} ({detail})"
    if reason is not None:
        explanation = f"No prediction on {where}: {reason}; {measured}"
        if limit_bytes is not None:
            explanation += f"; limit: {source} {format_bytes(limit_bytes)} ({detail})"
        explanation += "."
        fitted = fit if fit.static_bytes == fit.static_bytes else None
        result = CapacityEstimate(
            predicted_batch_size=None, static_bytes=None,
            per_sample_bytes=fitted.per_sample_bytes if fitted else None,
            residual=fitted.residual if fitted else None,
            r_squared=fitted.r_squared if fitted else None,
            fit_batch_sizes=fit.batch_sizes if fitted else (),
            step_static_bytes=int(fitted.static_bytes) if fitted else None,
            explanation=explanation, **common)
        return result
    assert limit_bytes is not None and meter.baseline is not None
    static = int(round(meter.baseline + fit.static_bytes))
    predicted = predict_batch_size(limit_bytes, headroom, static, fit.per_sample_bytes)
    fit_sizes = fit.batch_sizes
    explanation = (
        f"Largest batch {predicted} on {where}: {source} "
        f"{format_bytes(limit_bytes)} less {headroom:.0%} headroom, minus "
        f"{format_bytes(static)} that does not grow with the batch "
        f"({format_bytes(meter.baseline)} in use {_signed(fit.static_bytes)} "
        f"constant per step), at {format_bytes(fit.per_sample_bytes)} per sample; "
        f"linear within {fit.residual:.1%} over batch sizes "
        f"{fit_sizes[0]}-{fit_sizes[-1]}"
        + (f"; size(s) {_sizes_text(hidden)} hidden under an earlier high-water "
           "mark" if hidden else "")
        + (f"; {stopped}" if stopped else "")
        + (f" ({detail})" if source == LIMIT_HOST else "") + ".")
    if predicted == 0:
        explanation = "Not even a batch of 1 fits: " + explanation
    logger.info("%s", explanation)
    return CapacityEstimate(
        predicted_batch_size=predicted, static_bytes=static,
        per_sample_bytes=fit.per_sample_bytes, residual=fit.residual,
        r_squared=fit.r_squared, fit_batch_sizes=fit_sizes,
        step_static_bytes=int(round(fit.static_bytes)), explanation=explanation,
        **common)


def _check_compiled(estimate: CapacityEstimate, model: Any,
                    sample: tuple[Any, Any]) -> CapacityEstimate:
    """Checks the line's answer, and finds the ceiling, by compiling the step.

    XLA's plans grow with the batch as the line says until a plan would not
    fit the device, where XLA starts recomputing activations instead. So
    the line's answer under the headroom is checked (and corrected) at the
    sizes around it, and the ceiling is searched upward from the line's
    answer without headroom.
    """
    assert estimate.limit_bytes is not None and estimate.in_use_bytes is not None
    full = estimate.limit_bytes - estimate.in_use_bytes
    room = full - estimate.limit_bytes * estimate.headroom
    need: dict[int, int] = {}

    def fitting(free: float) -> Callable[[int], bool]:
        def fits(size: int) -> bool:
            if size not in need:
                need[size] = xla_plan.working_bytes(model, sample, size)
            return need[size] <= free
        return fits

    line = estimate.predicted_batch_size or 0
    line_ceiling = estimate.batch_size_for(0.0) or 0
    try:
        lo, hi = xla_plan.largest_that_fits(fitting(room), max(line, 1), _MAX_CHECKS)
        ceiling, above = xla_plan.largest_that_fits(
            fitting(full), max(line_ceiling, lo or 1), _MAX_CHECKS)
    except Exception as e:
        logger.warning("estimate_max_batch_size: XLA's plan could not be compiled "
                       "at larger sizes (%r); the prediction is the line's", e)
        return dataclasses.replace(
            estimate, checked=tuple(need.items()),
            explanation=f"{estimate.explanation} Not checked by compiling the step "
                        f"({type(e).__name__}).")
    where = f"{estimate.device} ({estimate.backend}, {estimate.measured_by})"
    sizes = estimate.fit_batch_sizes
    fitted = (f"the line fitted over batch sizes {sizes[0]}-{sizes[-1]} "
              f"({format_bytes(estimate.per_sample_bytes or 0)} per sample, within "
              f"{estimate.residual:.1%}) gives {line}")
    under = (f"the {format_bytes(room)} free under the {estimate.limit_source} "
             f"{format_bytes(estimate.limit_bytes)} less {estimate.headroom:.0%} "
             "headroom")
    if lo is None:
        predicted = 0 if hi == 1 else None
        head = (f"Not even a batch of 1 fits on {where}" if predicted == 0 else
                f"No prediction on {where}: no size checked fits")
        explanation = (f"{head}: compiled for batch {hi}, the step needs "
                       f"{format_bytes(need[hi])} of {under}; {fitted}.")
    else:
        predicted = lo
        beyond = ("every size checked fits" if hi is None else
                  f"batch {hi} would need {format_bytes(need[hi])}")
        explanation = (f"Largest batch {lo} on {where}, checked by compiling the "
                       f"step: it needs {format_bytes(need[lo])} of {under}, "
                       f"{beyond}; {fitted}.")
    if ceiling is not None:
        explanation += (f" Without headroom, up to batch {ceiling} fits "
                        f"({format_bytes(need[ceiling])} of {format_bytes(full)}"
                        + ("" if above is None else
                           f"; {above} would need {format_bytes(need[above])}") + ")")
        line_bytes = ((estimate.step_static_bytes or 0)
                      + (estimate.per_sample_bytes or 0) * ceiling)
        if ceiling > line_ceiling and need[ceiling] < 0.95 * line_bytes:
            explanation += (f": XLA plans {1 - need[ceiling] / line_bytes:.0%} "
                            "less there than the line, by recomputing activations "
                            "(slower steps)")
        explanation += "."
    explanation += f" {len(need)} compilations."
    return dataclasses.replace(estimate, predicted_batch_size=predicted,
                               ceiling_batch_size=ceiling,
                               checked=tuple(need.items()), explanation=explanation)
