"""GPU memory settings under JAX.

JAX takes them from environment variables that its GPU plugin reads once,
when it is set up (the first array, model or `jax.devices()`):
`XLA_PYTHON_CLIENT_PREALLOCATE` for growth and `XLA_CLIENT_MEM_FRACTION`
(older jaxlib: `XLA_PYTHON_CLIENT_MEM_FRACTION`) for a cap, a fraction of
each GPU's total memory as CUDA reports it, read through NVML without
starting JAX. They apply to every GPU of the process.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import sys
from typing import Optional

from keras_memwatch.configure.arguments import Request, check_limit_fits, select, too_late
from keras_memwatch.configure.results import DeviceMemoryConfig, MemoryConfig
from keras_memwatch.configure.nvml_devices import NvmlTotals, nvidia_driver_present, visible_totals

logger = logging.getLogger("keras_memwatch")

# The environment variables JAX reads when it creates its GPU client
# (jaxlib/xla_client.py, `generate_pjrt_gpu_plugin_options`).
JAX_PREALLOCATE_VAR = "XLA_PYTHON_CLIENT_PREALLOCATE"
JAX_MEM_FRACTION_VAR = "XLA_CLIENT_MEM_FRACTION"
JAX_LEGACY_MEM_FRACTION_VAR = "XLA_PYTHON_CLIENT_MEM_FRACTION"
JAX_ALLOCATOR_VAR = "XLA_PYTHON_CLIENT_ALLOCATOR"

_GPU_PLATFORMS = frozenset({"cuda", "rocm", "gpu"})  # JAX's names of GPU platforms


def is_gpu(device: object) -> bool:
    """Whether a JAX device is a GPU."""
    return str(getattr(device, "platform", "")).lower() in _GPU_PLATFORMS


@dataclasses.dataclass(frozen=True)
class _Runtime:
    """How far JAX has started, told without starting it."""

    started: Optional[bool]  # None: cannot be told
    platforms: Optional[tuple[str, ...]]  # the initialised ones; None: unknown

    @property
    def gpu_backend(self) -> bool:
        """Whether a GPU platform is among the initialised ones."""
        return bool(self.platforms and _GPU_PLATFORMS & set(self.platforms))


def configure_jax(request: Request) -> MemoryConfig:
    """Sets JAX's environment variables for `request`; see `configure_memory`."""
    allow_growth, memory_limit_mb = request.allow_growth, request.memory_limit_mb
    platforms = _platforms_setting()
    if platforms and not _GPU_PLATFORMS & {p.strip() for p in platforms.split(",")}:
        why = f"JAX is restricted to platforms {platforms!r} (JAX_PLATFORMS)"
        return MemoryConfig("jax", allow_growth, memory_limit_mb, note=why)
    runtime = _runtime()
    view = visible_totals()
    if not runtime.gpu_backend:
        why = _no_gpu_reason(view)
        if why is not None:
            return MemoryConfig("jax", allow_growth, memory_limit_mb, note=why)
    _check_devices(request, view)
    fraction_var = _fraction_var()
    settings = _settings(request, view, fraction_var)
    _check_not_started(runtime, settings)
    _set_environment(settings, fraction_var)
    note = "; ".join(_notes(request, runtime, view, settings, fraction_var))
    return _result(request, view, settings.get(fraction_var), settings, note)


def _runtime() -> _Runtime:
    """Whether JAX created its backends (or registered its GPU plugin)."""
    if "jax" not in sys.modules:
        return _Runtime(False, ())  # not even imported
    xb = sys.modules.get("jax._src.xla_bridge")
    if xb is None:
        return _Runtime(False, ())
    backends = getattr(xb, "_backends", None)
    if isinstance(backends, dict):
        if backends:
            return _Runtime(True, tuple(backends))
        # The CUDA plugin reads the XLA_* variables when it is registered
        # (jax_plugins/xla_cuda*/__init__.py), which can precede the backends.
        return _Runtime(getattr(xb, "_plugins_registered", False) is True, ())
    probe = getattr(xb, "backends_are_initialized", None)
    if callable(probe):
        try:
            return _Runtime(bool(probe()), None)
        except Exception:
            pass
    return _Runtime(None, None)


def _platforms_setting() -> str:
    """`jax_platforms` (or `JAX_PLATFORMS`), lower case; "" when unset."""
    value = os.environ.get("JAX_PLATFORMS", "")
    if "jax" in sys.modules:
        try:
            from jax._src import config as jax_config

            value = jax_config.jax_platforms.value or ""
        except Exception:
            pass
    return value.strip().lower()


def _no_gpu_reason(view: NvmlTotals) -> Optional[str]:
    """Why there is no GPU to configure, or None when there may be one."""
    if view.totals is None and not nvidia_driver_present():
        return f"no NVIDIA GPU found: {view.reason}"
    if view.totals == []:
        return "NVML sees no visible GPU"
    return None


def _check_devices(request: Request, view: NvmlTotals) -> None:
    """`devices` must select every GPU, and the cap must fit each of them."""
    received = f"Received: devices={request.devices_arg!r}"
    totals = view.totals
    if totals is not None:
        if len(select(request, len(totals))) != len(totals):
            raise ValueError(
                "Under JAX, GPU memory settings are environment variables "
                "that apply to every GPU the process sees, so `devices` must "
                f"select all of {[f'GPU:{i}' for i in range(len(totals))]}. "
                "Pass devices=None, or set CUDA_VISIBLE_DEVICES to the GPUs "
                f"to use before starting Python. {received}"
            )
        check_limit_fits(
            request.limit_bytes, request.memory_limit_mb, dict(enumerate(totals))
        )
    elif request.selection is not None:
        raise ValueError(
            f"Cannot check `devices` under JAX without NVML ({view.reason}); "
            f"pass devices=None. {received}"
        )


def _fraction_var() -> str:
    """The memory-fraction variable the installed jaxlib reads."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("jaxlib")
        locations = list(spec.submodule_search_locations or []) if spec else []
        for folder in locations:
            path = os.path.join(folder, "xla_client.py")
            if os.path.exists(path):
                with open(path, encoding="utf-8") as source:
                    text = source.read()
                if re.search(r"['\"]%s['\"]" % JAX_MEM_FRACTION_VAR, text):
                    return JAX_MEM_FRACTION_VAR
                return JAX_LEGACY_MEM_FRACTION_VAR
    except Exception:
        pass
    return JAX_LEGACY_MEM_FRACTION_VAR  # every jaxlib still reads it


def _fraction(limit_bytes: int, totals: list[int]) -> str:
    """`limit_bytes / max(totals)` rounded down to 6 decimals, as text."""
    fraction = math.floor(limit_bytes / max(totals) * 1e6) / 1e6
    return f"{fraction:.6f}".rstrip("0").rstrip(".")


def _settings(request: Request, view: NvmlTotals, fraction_var: str) -> dict[str, str]:
    """The environment variables to set, by name."""
    settings: dict[str, str] = {}
    if request.allow_growth is not None:
        settings[JAX_PREALLOCATE_VAR] = "false" if request.allow_growth else "true"
    if request.limit_bytes is not None:
        if view.totals is None:
            raise RuntimeError(
                "memory_limit_mb under JAX is set as a fraction of each GPU's "
                f"total memory, read through NVML, but {view.reason}."
            )
        fraction = _fraction(request.limit_bytes, view.totals)
        if float(fraction) <= 0:
            raise ValueError(
                "Expected `memory_limit_mb` to be at least a millionth of the "
                f"GPU memory. Received: memory_limit_mb={request.memory_limit_mb!r}"
            )
        settings[fraction_var] = fraction
    return settings


def _check_not_started(runtime: _Runtime, settings: dict[str, str]) -> None:
    """Raises when JAX has started and `settings` are not already in effect."""
    in_effect = all(os.environ.get(k) == v for k, v in settings.items())
    if runtime.started and not in_effect:
        if runtime.platforms:
            where = f"JAX initialised its backends ({', '.join(runtime.platforms)})"
        elif runtime.platforms is None:
            where = "JAX initialised its backends"
        else:
            where = "JAX registered its GPU plugin"
        raise too_late(
            where,
            " and ".join(f"{k}={v}" for k, v in settings.items()),
            "JAX reads these variables once, when it sets up its GPU plugin",
        )
    if runtime.started is None:
        logger.warning(
            "configure_memory could not tell whether JAX has started; the "
            "settings take effect only if it has not."
        )


def _set_environment(settings: dict[str, str], fraction_var: str) -> None:
    """Sets `settings`, dropping the legacy fraction variable beside the new one."""
    fraction = settings.get(fraction_var)
    legacy = JAX_LEGACY_MEM_FRACTION_VAR
    if fraction is not None and fraction_var != legacy and legacy in os.environ:
        # jaxlib refuses to start when both names are set.
        logger.warning(
            "configure_memory removed %s=%s (deprecated; replaced by %s=%s).",
            legacy,
            os.environ.pop(legacy),
            fraction_var,
            fraction,
        )
    os.environ.update(settings)


def _notes(
    request: Request,
    runtime: _Runtime,
    view: NvmlTotals,
    settings: dict[str, str],
    fraction_var: str,
) -> list[str]:
    """What a user should know about the settings (and warnings to log)."""
    fraction = settings.get(fraction_var)
    notes: list[str] = []
    if runtime.started:
        notes.append("already set before JAX started")
        if not runtime.gpu_backend:
            names = ", ".join(runtime.platforms or ())
            notes.append(f"JAX started without a GPU backend (platforms: {names})")
    allocator = os.environ.get(JAX_ALLOCATOR_VAR, "").lower()
    if fraction is not None and allocator == "platform":
        notes.append(f"{JAX_ALLOCATOR_VAR}=platform ignores the memory fraction")
        logger.warning(
            "%s=platform: JAX ignores %s, so memory_limit_mb is not enforced.",
            JAX_ALLOCATOR_VAR,
            fraction_var,
        )
    if request.allow_growth is False and fraction is None:
        notes.append("JAX preallocates its default share (75%) of each GPU")
    if fraction is not None and view.totals and len(set(view.totals)) > 1:
        notes.append("one fraction for all GPUs, derived from the largest")
    return notes


def _result(
    request: Request,
    view: NvmlTotals,
    fraction: Optional[str],
    settings: dict[str, str],
    note: str,
) -> MemoryConfig:
    """One entry per GPU NVML lists, or one `"GPU:*"` entry when it cannot."""
    allow_growth, memory_limit_mb = request.allow_growth, request.memory_limit_mb
    mechanism = ", ".join(f"{k}={v}" for k, v in settings.items())
    if view.totals is None:  # only the growth switch is set
        entry = DeviceMemoryConfig("GPU:*", allow_growth, None, None, mechanism, note)
        why = f"set for every GPU JAX will see; {view.reason}"
        return MemoryConfig("jax", allow_growth, memory_limit_mb, (entry,), why)
    entries = tuple(
        DeviceMemoryConfig(
            f"GPU:{i}",
            allow_growth,
            None if fraction is None else int(float(fraction) * total),
            total,
            mechanism,
            note,
        )
        for i, total in enumerate(view.totals)
    )
    return MemoryConfig("jax", allow_growth, memory_limit_mb, entries)
