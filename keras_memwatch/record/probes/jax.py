"""JAX's per-device allocator statistics, from `device.memory_stats()`.

One call per GPU and per read gives `bytes_in_use`,
`peak_bytes_in_use` and `bytes_limit` (the size of the pool the allocator may
use: 75% of the GPU by default, see `XLA_PYTHON_CLIENT_MEM_FRACTION`). JAX
offers no way to reset the peak, so `peak_bytes_in_use` is the high-water
mark for the life of the process and is recorded as such; this probe has no
per-sample peak. What the allocator holds from the device, used or not, is
`pool_bytes` (the BFC allocator's regions: with preallocation, the whole
pool from the start) or else `bytes_reserved` (the CUDA async allocator's
reserve), where the statistics hold one no smaller than `bytes_in_use`;
missing otherwise (BFC reports a `bytes_reserved` of 0 that means something
else). Starting the probe initialises JAX's backends if nothing has
yet (which preallocates GPU memory by default): use it with the JAX backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional

from keras_memwatch import columns
from keras_memwatch.configure.jax import is_gpu
from keras_memwatch.record.probes.base import Probe, ProbeUnavailable, Reading


class JaxProbe(Probe):
    """Reads JAX's allocator statistics for each local GPU.

    Columns: `allocator_current_bytes` (`bytes_in_use`),
    `allocator_peak_bytes` (`peak_bytes_in_use`, a process-lifetime
    high-water mark), `allocator_limit_bytes` (`bytes_limit`) and
    `allocator_reserved_bytes` (`pool_bytes`, else `bytes_reserved`, where
    present; see the module's note). Devices
    are named `GPU:i`, `i` being the device's index among the GPUs this
    process sees (its `local_hardware_id`, the CUDA ordinal).
    """

    name = "jax"
    columns = (
        columns.ALLOCATOR_CURRENT,
        columns.ALLOCATOR_PEAK,
        columns.ALLOCATOR_LIMIT,
        columns.ALLOCATOR_RESERVED,
    )
    peak_per_sample = False

    def __init__(self) -> None:
        self._stats: tuple[Callable[[], Optional[dict[str, Any]]], ...] = ()

    def start(self) -> tuple[str, ...]:
        try:
            import jax
        except ImportError:
            raise ProbeUnavailable("JAX is not installed: pip install jax") from None
        try:
            devices = jax.local_devices()
        except Exception as e:  # backend initialisation errors
            raise ProbeUnavailable(f"JAX could not list its devices: {e}") from None
        gpus = [d for d in devices if is_gpu(d)]
        if not gpus:
            platforms = sorted({str(d.platform) for d in devices}) or ["none"]
            raise ProbeUnavailable(
                f"JAX sees no GPU (platforms: {', '.join(platforms)}); for "
                "NVIDIA GPUs install a CUDA build: pip install 'jax[cuda12]' "
                "or 'jax[cuda13]'"
            )
        names = _names(gpus)
        order = sorted(range(len(gpus)), key=lambda i: int(names[i][4:]))
        gpus = [gpus[i] for i in order]
        names = [names[i] for i in order]

        stats = tuple(d.memory_stats for d in gpus)
        try:
            first = [s() for s in stats]
        except Exception as e:
            raise ProbeUnavailable(
                f"JAX could not report memory statistics: {e}"
            ) from None
        if all(s is None for s in first):
            raise ProbeUnavailable(
                "JAX reports no memory statistics for its GPUs "
                "(device.memory_stats() returned None)"
            )
        self._stats = stats
        return tuple(names)

    def read(self) -> Sequence[Reading]:
        out: list[Reading] = []
        for memory_stats in self._stats:
            try:
                s = memory_stats()
            except Exception:
                s = None
            if s is None:
                out.append((None, None, None, None))
            else:
                out.append(
                    (
                        s.get("bytes_in_use"),
                        s.get("peak_bytes_in_use"),
                        s.get("bytes_limit"),
                        reserved_bytes(s),
                    )
                )
        return tuple(out)

    def close(self) -> None:
        self._stats = ()

    def describe(self) -> str:
        return (
            "JAX allocator: bytes_in_use, bytes_limit and the pool it holds "
            "(pool_bytes, where reported) per device; "
            "peak_bytes_in_use is a process-lifetime high-water mark (JAX "
            "cannot reset it), so there is no per-step peak."
        )


def reserved_bytes(stats: dict[str, Any]) -> Optional[int]:
    """What JAX's allocator holds from the device, from `memory_stats()`.

    `pool_bytes` where present, else `bytes_reserved`; a value below
    `bytes_in_use` (BFC's `bytes_reserved` is 0: it counts something else)
    or not an integer is missing, never a guess.
    """
    in_use = stats.get("bytes_in_use")
    for key in ("pool_bytes", "bytes_reserved"):
        value = stats.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            continue
        if isinstance(in_use, int) and value < in_use:
            continue
        return value
    return None


def local_gpu_names() -> tuple[str, ...]:
    """The record's names of the GPUs JAX computes on in this process
    (none when it computes on the CPU)."""
    import jax

    gpus = [d for d in jax.local_devices() if is_gpu(d)]
    return tuple(sorted(_names(gpus), key=lambda n: int(n[4:])))


def _names(gpus: list[Any]) -> list[str]:
    """`GPU:<local_hardware_id>`, or `GPU:<position>` when ids are missing."""
    ids = [getattr(d, "local_hardware_id", None) for d in gpus]
    if all(isinstance(i, int) for i in ids) and len(set(ids)) == len(ids):
        return [f"GPU:{i}" for i in ids]
    return [f"GPU:{i}" for i in range(len(gpus))]
