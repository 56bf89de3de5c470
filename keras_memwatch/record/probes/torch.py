"""PyTorch's CUDA caching allocator: allocated and reserved bytes, the peak, the cap.

Why not the public calls: `torch.cuda.memory_allocated(i)` and
`torch.cuda.max_memory_allocated(i)` each call `torch.cuda.memory_stats(i)`,
which asks C++ for the full nested statistics dict
(`torch._C._cuda_memoryStats(i)`: about 13 statistics x 3 pools x 4 counters,
some 150 Python ints in nested dicts), then flattens it in Python into
dotted keys, sorts them and builds an `OrderedDict`, only to return one
value; the public pair pays that twice per read.

What this probe does instead, per GPU and per read:

1. `torch._C._cuda_memoryStats(i)` once: the nested dict, no flattening;
   current and peak are `["allocated_bytes"]["all"]["current" | "peak"]`,
   and what the allocator holds from the device, used or not, is
   `["reserved_bytes"]["all"]["current"]` of the same dict.
   (This is the binding behind `torch.cuda.memory_stats_as_nested_dict`,
   there since torch 1.4 and still in 2.13.)
2. `torch._C._cuda_resetPeakMemoryStats(i)`: the C++ reset, without the
   Python device-index parsing of `torch.cuda.reset_peak_memory_stats`.

PyTorch has no binding that returns a single counter for CUDA (the
`torch._C._accelerator_getDeviceStats` of 2.9+ builds the same nested dict),
so one nested-dict build per device is the floor from Python. These are
private names: where they are missing or fail (another torch, a custom
build or allocator), the probe falls back to the public
`torch.cuda.memory_stats_as_nested_dict(i)` (same dict, plus an
`is_initialized` check) and `torch.cuda.reset_peak_memory_stats(i)`, and
last to `memory_allocated` / `max_memory_allocated` / `memory_reserved`.
`benchmarks/probe_costs.py` times all of these (figures in
`docs/gpu-validation.md`).

The limit column is the per-process cap that
`torch.cuda.set_per_process_memory_fraction` sets (fraction x total memory),
read once at `start`. Without a
cap (fraction 1.0, the default) the allocator may grow until `cudaMalloc`
fails, which is no fixed number, so the limit is missing. Starting the probe
initialises CUDA in PyTorch (`torch.cuda.init()`), since the allocator has no
statistics before that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional

from keras_memwatch import columns
from keras_memwatch.record.probes.base import Probe, ProbeUnavailable, Reading

_Stats = Callable[[int], Any]


class TorchProbe(Probe):
    """Reads PyTorch's CUDA allocator statistics for each visible GPU.

    Columns: `allocator_current_bytes` (bytes allocated to tensors),
    `allocator_peak_bytes` (peak allocated since the previous read; the
    probe resets PyTorch's peak statistics as it reads, so anything else in
    the process reading `torch.cuda.max_memory_allocated` sees per-sample
    peaks too), `allocator_limit_bytes` (only under a per-process memory
    fraction) and `allocator_reserved_bytes` (`reserved_bytes.all.current`:
    the segments the caching allocator holds from the device, used or not;
    reserved minus allocated is what block rounding and fragmentation cost,
    and the per-process cap bounds the reserved bytes, not the allocated
    ones). Devices are named `GPU:i` for CUDA device `i`.

    Args:
        use_private_bindings: read through `torch._C` directly (fast) when
            the bindings exist. `False` forces the public `torch.cuda` API,
            for comparison. Defaults to `True`.
    """

    name = "torch"
    columns = (
        columns.ALLOCATOR_CURRENT,
        columns.ALLOCATOR_PEAK,
        columns.ALLOCATOR_LIMIT,
        columns.ALLOCATOR_RESERVED,
    )
    peak_per_sample = True

    def __init__(self, use_private_bindings: bool = True) -> None:
        self.use_private_bindings = use_private_bindings
        self._devices: tuple[tuple[int, Optional[int]], ...] = ()
        self._stats: Optional[_Stats] = None
        self._reset: Optional[Callable[[int], Any]] = None
        self._pair: Optional[tuple[_Stats, _Stats, _Stats]] = None
        self.path = ""  # which calls `read` uses, for the benchmark and logs

    def start(self) -> tuple[str, ...]:
        try:
            import torch
        except ImportError:
            raise ProbeUnavailable(
                "PyTorch is not installed: pip install torch"
            ) from None
        cuda = torch.cuda
        if not cuda.is_available():
            version = getattr(torch, "version", None)
            gpu_build = getattr(version, "cuda", None) or getattr(version, "hip", None)
            if not gpu_build:
                raise ProbeUnavailable(
                    f"this PyTorch build ({torch.__version__}) has no CUDA "
                    "support; install a CUDA build (see https://pytorch.org)"
                )
            raise ProbeUnavailable("PyTorch sees no CUDA device")
        count = cuda.device_count()
        if count < 1:
            raise ProbeUnavailable("PyTorch sees no CUDA device")
        try:
            cuda.init()
        except Exception as e:
            raise ProbeUnavailable(f"PyTorch could not initialise CUDA: {e}") from None
        indices = range(count)
        self._choose_path(torch, indices)
        self._devices = tuple((i, _limit(cuda, i)) for i in indices)
        return tuple(f"GPU:{i}" for i in indices)

    def _choose_path(self, torch: Any, indices: range) -> None:
        """Keeps the cheapest set of calls that works on every device."""
        cuda, c = torch.cuda, torch._C
        candidates: list[tuple[str, Any, Any]] = []
        if self.use_private_bindings:
            candidates.append(
                (
                    "torch._C._cuda_memoryStats",
                    getattr(c, "_cuda_memoryStats", None),
                    getattr(c, "_cuda_resetPeakMemoryStats", None),
                )
            )
        candidates.append(
            (
                "torch.cuda.memory_stats_as_nested_dict",
                getattr(cuda, "memory_stats_as_nested_dict", None),
                cuda.reset_peak_memory_stats,
            )
        )
        errors = []
        for path, stats, reset in candidates:
            if stats is None or reset is None:
                continue
            try:
                for i in indices:
                    _allocated(stats(i))
                    reset(i)
            except Exception as e:
                errors.append(f"{path}: {e}")
                continue
            self._stats, self._reset, self._pair, self.path = stats, reset, None, path
            return
        try:
            for i in indices:
                cuda.memory_allocated(i), cuda.max_memory_allocated(i)
                cuda.reset_peak_memory_stats(i)
            reserved = getattr(cuda, "memory_reserved", None) or _missing
        except Exception as e:
            errors.append(f"torch.cuda.memory_allocated: {e}")
            raise ProbeUnavailable(
                "PyTorch's CUDA allocator reports no statistics (a custom "
                f"allocator?): {'; '.join(errors)}"
            ) from None
        self._stats = None
        self._reset = cuda.reset_peak_memory_stats
        self._pair = (cuda.memory_allocated, cuda.max_memory_allocated, reserved)
        self.path = "torch.cuda.memory_allocated"

    def read(self) -> Sequence[Reading]:
        stats, reset = self._stats, self._reset
        out = []
        if stats is not None:
            for i, limit in self._devices:
                try:
                    nested = stats(i)
                    allocated = nested["allocated_bytes"]["all"]
                    reset(i)  # type: ignore[misc]
                    out.append((allocated["current"], allocated["peak"], limit,
                                _reserved(nested)))
                except Exception:
                    out.append((None, None, limit, None))
            return tuple(out)
        if self._pair is None:  # not started, or closed
            return ()
        current, peak, reserved = self._pair
        for i, limit in self._devices:
            try:
                reading = (current(i), peak(i), limit, _call(reserved, i))
                reset(i)  # type: ignore[misc]
            except Exception:
                reading = (None, None, limit, None)
            out.append(reading)
        return tuple(out)

    def close(self) -> None:
        self._stats = self._reset = self._pair = None
        self._devices = ()

    def describe(self) -> str:
        limit = any(limit is not None for _, limit in self._devices)
        return (
            "PyTorch CUDA allocator: bytes allocated to tensors and their peak "
            "since the previous sample, and the bytes it reserves from the device "
            "(reserved minus allocated: block rounding and fragmentation); "
            + (
                "the limit is the per-process memory fraction x total memory."
                if limit
                else "no limit (no per-process memory fraction is set)."
            )
        )


def _allocated(stats: dict[str, Any]) -> tuple[int, int]:
    """Current and peak allocated bytes from the nested statistics dict."""
    allocated = stats["allocated_bytes"]["all"]
    return allocated["current"], allocated["peak"]


def _reserved(stats: dict[str, Any]) -> Optional[int]:
    """`reserved_bytes.all.current` from the nested statistics dict, or None."""
    try:
        value = stats["reserved_bytes"]["all"]["current"]
    except (KeyError, TypeError):
        return None
    return value if isinstance(value, int) and value >= 0 else None


def _missing(index: int) -> None:
    """Stands in for a reserved-bytes call this torch lacks."""
    return None


def _call(function: Callable[[int], Any], index: int) -> Optional[int]:
    """`function(index)`, or None when it fails (a value is never guessed)."""
    try:
        value = function(index)
    except Exception:
        return None
    return value if isinstance(value, int) and value >= 0 else None


def _limit(cuda: Any, index: int) -> Optional[int]:
    """fraction x total memory under a per-process fraction below 1, else None."""
    get_fraction = getattr(cuda, "get_per_process_memory_fraction", None)
    if get_fraction is None:  # torch without the getter
        return None
    try:
        fraction = float(get_fraction(index))
        if not 0.0 <= fraction < 1.0:
            return None
        # The allocator caps its reserved bytes at fraction x totalGlobalMem
        # and reports the fraction back as cap / totalGlobalMem; device
        # properties give that total without creating a CUDA context.
        return int(fraction * cuda.get_device_properties(index).total_memory)
    except Exception:
        return None
