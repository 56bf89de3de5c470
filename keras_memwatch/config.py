"""Configure how the active Keras backend allocates GPU memory.

`configure_memory` turns two portable wishes, "grow on demand" and "never
use more than N MiB", into the settings each framework understands, applies
them to the GPUs asked for, and returns (and logs) what it applied:

- TensorFlow: `tf.config.experimental.set_memory_growth`;
  `tf.config.set_logical_device_configuration(memory_limit=...)`.
- JAX: `XLA_PYTHON_CLIENT_PREALLOCATE`; `XLA_CLIENT_MEM_FRACTION` (older
  jaxlib: `XLA_PYTHON_CLIENT_MEM_FRACTION`).
- PyTorch: nothing to set for growth (its caching allocator already grows);
  `torch.cuda.set_per_process_memory_fraction`.

TensorFlow and JAX read these settings once, when their runtime starts;
calling `configure_memory` later raises `RuntimeError` instead of doing
nothing quietly. Nothing is imported until the function is called.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import os
import re
import sys
import threading
from collections.abc import Sequence
from typing import Any, Optional, Union

from keras_memwatch.units import MIB, format_bytes

logger = logging.getLogger("keras_memwatch")

DeviceSpec = Union[int, str]

# The environment variables JAX reads when it creates its GPU client
# (jaxlib/xla_client.py, `generate_pjrt_gpu_plugin_options`).
JAX_PREALLOCATE_VAR = "XLA_PYTHON_CLIENT_PREALLOCATE"
JAX_MEM_FRACTION_VAR = "XLA_CLIENT_MEM_FRACTION"
JAX_LEGACY_MEM_FRACTION_VAR = "XLA_PYTHON_CLIENT_MEM_FRACTION"
JAX_ALLOCATOR_VAR = "XLA_PYTHON_CLIENT_ALLOCATOR"
# Read by TensorFlow's GPU BFC allocator; overrides the growth in tf.config.
TF_FORCE_GROWTH_VAR = "TF_FORCE_GPU_ALLOW_GROWTH"

_JAX_GPU_PLATFORMS = frozenset({"cuda", "rocm", "gpu"})
_DEVICE_NAME = re.compile(
    r"^\s*(?:/(?:physical_)?device:)?(?:gpu|cuda):(\d+)\s*$", re.IGNORECASE
)
_CALL_FIRST = (
    "Call `keras_memwatch.configure_memory(...)` (or construct "
    "`MemWatch(allow_growth=..., memory_limit_mb=...)`) first thing in your "
    "program, before building any model or creating any tensor"
)


@dataclasses.dataclass(frozen=True)
class DeviceMemoryConfig:
    """What `configure_memory` applied to one GPU.

    Attributes:
        device: `"GPU:0"`, `"GPU:1"`, ... in the framework's own numbering
            (the order of the GPUs the process sees); `"GPU:*"` for a
            JAX setting applied to every GPU when NVML could not list them.
        allow_growth: `True` when memory is allocated on demand, `False` when
            the framework preallocates, `None` when left at the framework's
            default because growth was not asked for.
        limit_bytes: the cap on this device, in bytes, or `None` for no cap.
            Under JAX it is `fraction * total_bytes`; XLA rounds its pool to
            its own granularity (up to 2 MiB seen on an H200), and the
            device's `memory_stats()["bytes_limit"]` gives the exact figure.
        total_bytes: the device's total memory in bytes as CUDA reports it
            (NVML's total less what the driver reserves), when it was read
            to turn a limit into a fraction; else `None`.
        mechanism: the framework settings made, e.g.
            `"XLA_CLIENT_MEM_FRACTION=0.0283"`.
        note: anything a user should know about this device's setting.
    """

    device: str  # "GPU:*": every GPU, when they could not be listed
    allow_growth: Optional[bool]
    limit_bytes: Optional[int]
    total_bytes: Optional[int]
    mechanism: str
    note: str = ""

    def __str__(self) -> str:
        growth = {None: "default", True: "on", False: "off"}[self.allow_growth]
        if self.limit_bytes is None:
            limit = "none"
        else:
            limit = f"{format_bytes(self.limit_bytes)} ({self.limit_bytes} bytes)"
            if self.total_bytes:
                limit += f" of {format_bytes(self.total_bytes)}"
        text = f"{self.device}: growth {growth}, limit {limit}; via {self.mechanism}"
        return text + (f" [{self.note}]" if self.note else "")


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    """What `configure_memory` applied, per device.

    Attributes:
        backend: the Keras backend it was applied for.
        allow_growth: the `allow_growth` asked for.
        memory_limit_mb: the `memory_limit_mb` asked for.
        devices: one `DeviceMemoryConfig` per configured GPU; empty when
            nothing was applied.
        note: why nothing was applied, or what holds for every device.
    """

    backend: str
    allow_growth: Optional[bool]
    memory_limit_mb: Optional[float]
    devices: tuple[DeviceMemoryConfig, ...] = ()
    note: str = ""

    @property
    def applied(self) -> bool:
        """Whether any device was configured."""
        return bool(self.devices)

    def device(self, name: DeviceSpec) -> Optional[DeviceMemoryConfig]:
        """The entry of one device (`"GPU:0"`, `"gpu:0"` or `0`), or `None`."""
        index = _device_index(name, "name")
        for entry in self.devices:
            if entry.device == f"GPU:{index}":
                return entry
        return None

    def limit_bytes(self, name: DeviceSpec) -> Optional[int]:
        """The cap applied to one device in bytes, or `None` for no cap."""
        entry = self.device(name)
        return None if entry is None else entry.limit_bytes

    def __str__(self) -> str:
        head = f"keras_memwatch memory configuration (backend: {self.backend})"
        if not self.devices:
            return f"{head}: nothing applied: {self.note}"
        lines = [head + (f": {self.note}" if self.note else "")]
        lines += [f"  {entry}" for entry in self.devices]
        return "\n".join(lines)


_lock = threading.Lock()
_last: Optional[MemoryConfig] = None


def last_memory_config() -> Optional[MemoryConfig]:
    """The `MemoryConfig` of the latest successful `configure_memory` call."""
    with _lock:
        return _last


def applied_limit_bytes(device: DeviceSpec) -> Optional[int]:
    """The memory cap `configure_memory` applied to `device`, in bytes.

    Meant for probes whose framework does not report its allocator limit
    (TensorFlow, PyTorch): they can fill `allocator_limit_bytes` with it.

    Args:
        device: `"GPU:0"`, `"gpu:0"` or `0`.

    Returns:
        The cap in bytes, or `None` when no cap was applied to that device
        (or `configure_memory` was never called).
    """
    config = last_memory_config()
    return None if config is None else config.limit_bytes(device)


def configure_memory(
    allow_growth: Optional[bool] = None,
    memory_limit_mb: Optional[float] = None,
    devices: Optional[Union[DeviceSpec, Sequence[DeviceSpec]]] = None,
) -> MemoryConfig:
    """Sets GPU memory growth and/or a memory cap for the Keras backend.

    Call it first thing, before any model is built or any tensor created:
    TensorFlow and JAX fix their allocator when their runtime starts. It
    acts on the active backend (`keras.backend.backend()`):

    - TensorFlow: growth through `tf.config.experimental.set_memory_growth`
      on every GPU; a cap through one logical device per GPU,
      `tf.config.set_logical_device_configuration(gpu,
      [tf.config.LogicalDeviceConfiguration(memory_limit=...)])`.
      TensorFlow refuses memory growth on a GPU that has a logical device
      configuration, and ignores the growth setting of every GPU once any
      GPU has one. Asking for both is still honoured, through the switch
      TensorFlow's GPU allocator reads whatever the configuration: the
      environment variable `TF_FORCE_GPU_ALLOW_GROWTH` (TensorFlow's GPU
      guide; it overrides `allow_growth` in the GPU BFC allocator, whose size
      is the logical device's `memory_limit`). The allocator then grows on
      demand up to the cap. Like memory growth itself (TensorFlow requires
      one growth setting for all visible GPUs), it holds for all GPUs.
    - JAX: `XLA_PYTHON_CLIENT_PREALLOCATE=false` (or `true`) for growth; a
      cap through `XLA_CLIENT_MEM_FRACTION` (the name current jaxlib reads;
      `XLA_PYTHON_CLIENT_MEM_FRACTION` for older jaxlib), a fraction of each
      GPU's total memory as CUDA reports it, read through NVML without
      starting JAX, rounded down to 6 decimals. JAX reads the variables when
      it sets up its GPU plugin (the first array, model or `jax.devices()`).
      They apply to every GPU of the process, so `devices` must select all
      of them (hide GPUs with `CUDA_VISIBLE_DEVICES` instead). With GPUs of
      different sizes the fraction is derived from the largest, so no GPU
      exceeds the cap. Without NVML, growth is still set, a cap is an error.
    - PyTorch: its caching allocator already grows on demand and cannot
      preallocate, so `allow_growth` sets nothing (asking for `False` is
      logged as a warning). A cap goes through
      `torch.cuda.set_per_process_memory_fraction`; it can be set at any
      time, but memory already reserved above the cap stays reserved (a
      warning says so).
    - No GPU (or the `numpy` backend): nothing is applied and one INFO line
      says so; never an error.

    What was applied is logged at INFO on the `keras_memwatch` logger,
    returned, and kept for `applied_limit_bytes`.

    Args:
        allow_growth: `True` to allocate GPU memory on demand, `False` to
            let the framework preallocate, `None` to leave its default.
            Defaults to `None`.
        memory_limit_mb: cap on each selected GPU, in MiB (2**20 bytes), or
            `None` for no cap. Defaults to `None`.
        devices: the GPUs to configure: a list of indices or names such as
            `"GPU:0"` (`"gpu:0"` and `"cuda:0"` work too), one of those, or
            `None` for all GPUs the framework sees. Defaults to `None`.

    Returns:
        A `MemoryConfig` listing, per device, what was applied.

    Raises:
        TypeError: for an argument of the wrong type.
        ValueError: for `memory_limit_mb <= 0` or larger than a selected
            GPU, an unknown device, or `devices` that the backend cannot
            configure apart (JAX; TensorFlow memory growth).
        RuntimeError: when the backend's runtime has already started, so the
            settings can no longer take effect; or when a JAX cap is asked
            for on a GPU whose total memory NVML cannot read.

    Example:

    ```python
    import keras_memwatch

    config = keras_memwatch.configure_memory(
        allow_growth=True, memory_limit_mb=8192
    )
    print(config)
    config.limit_bytes("GPU:0")  # the cap in bytes: 8 GiB
    # ...then build and fit the model.
    ```
    """
    global _last
    limit_bytes, selection = _check_arguments(
        allow_growth, memory_limit_mb, devices
    )
    request = _Request(allow_growth, memory_limit_mb, limit_bytes, selection, devices)
    backend = _active_backend()
    if allow_growth is None and limit_bytes is None:
        config = MemoryConfig(
            backend, None, None, note="neither allow_growth nor memory_limit_mb given"
        )
    elif backend == "tensorflow":
        config = _configure_tensorflow(request)
    elif backend == "jax":
        config = _configure_jax(request)
    elif backend == "torch":
        config = _configure_torch(request)
    else:
        config = MemoryConfig(
            backend,
            allow_growth,
            memory_limit_mb,
            note=f"the {backend!r} Keras backend has no GPU memory settings",
        )
    logger.info("%s", config)
    with _lock:
        _last = config
    return config


# --------------------------------------------------------------------------
# Arguments


def _check_arguments(
    allow_growth: Any, memory_limit_mb: Any, devices: Any
) -> tuple[Optional[int], Optional[tuple[int, ...]]]:
    """Validates the arguments; returns the cap in bytes and GPU indices."""
    if allow_growth is not None and not isinstance(allow_growth, bool):
        raise TypeError(
            "Expected `allow_growth` to be True, False or None. "
            f"Received: allow_growth={allow_growth!r}"
        )
    limit_bytes = None
    if memory_limit_mb is not None:
        if isinstance(memory_limit_mb, bool) or not isinstance(
            memory_limit_mb, numbers.Real
        ):
            raise TypeError(
                "Expected `memory_limit_mb` to be a positive number or None. "
                f"Received: memory_limit_mb={memory_limit_mb!r}"
            )
        if not math.isfinite(memory_limit_mb) or memory_limit_mb <= 0:
            raise ValueError(
                "Expected `memory_limit_mb` to be a positive number. "
                f"Received: memory_limit_mb={memory_limit_mb!r}"
            )
        limit_bytes = int(memory_limit_mb * MIB)
        if limit_bytes < 1:
            raise ValueError(
                "Expected `memory_limit_mb` to be at least one byte. "
                f"Received: memory_limit_mb={memory_limit_mb!r}"
            )
    if devices is None:
        return limit_bytes, None
    if isinstance(devices, (str, numbers.Integral)) and not isinstance(devices, bool):
        devices = [devices]
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        raise TypeError(
            "Expected `devices` to be None or a list of GPU indices or names "
            f"such as 'GPU:0'. Received: devices={devices!r}"
        )
    if not devices:
        raise ValueError(
            "Expected `devices` to select at least one GPU, or None for all. "
            f"Received: devices={devices!r}"
        )
    indices: list[int] = []
    for item in devices:
        index = _device_index(item, "devices")
        if index not in indices:
            indices.append(index)
    return limit_bytes, tuple(indices)


def _device_index(item: Any, argument: str) -> int:
    """`"GPU:1"`, `"gpu:1"`, `"cuda:1"`, `"/physical_device:GPU:1"` or 1 -> 1."""
    if isinstance(item, bool) or not isinstance(item, (numbers.Integral, str)):
        raise TypeError(
            f"Expected `{argument}` to hold GPU indices or names such as "
            f"'GPU:0'. Received: {argument}={item!r}"
        )
    if isinstance(item, numbers.Integral):
        if item < 0:
            raise ValueError(
                f"Expected `{argument}` to hold non-negative GPU indices. "
                f"Received: {argument}={item!r}"
            )
        return int(item)
    match = _DEVICE_NAME.match(item)
    if match is None:
        raise ValueError(
            f"Expected `{argument}` to hold GPU names such as 'GPU:0'. "
            f"Received: {argument}={item!r}"
        )
    return int(match.group(1))


@dataclasses.dataclass(frozen=True)
class _Request:
    allow_growth: Optional[bool]
    memory_limit_mb: Optional[float]
    limit_bytes: Optional[int]
    selection: Optional[tuple[int, ...]]  # GPU indices; None for all
    devices_arg: Any  # `devices` as received, for messages


def _select(request: _Request, count: int) -> list[int]:
    """The GPU indices to configure, checked against the `count` available."""
    selection, devices_arg = request.selection, request.devices_arg
    if selection is None:
        return list(range(count))
    unknown = [i for i in selection if i >= count]
    if unknown:
        raise ValueError(
            "Unknown GPU(s) in `devices`: "
            f"{[f'GPU:{i}' for i in unknown]}. Available: "
            f"{[f'GPU:{i}' for i in range(count)]}. Received: "
            f"devices={devices_arg!r}"
        )
    return list(selection)


def _check_limit_fits(
    limit_bytes: Optional[int],
    memory_limit_mb: Optional[float],
    totals: dict[int, Optional[int]],
) -> None:
    if limit_bytes is None:
        return
    for index, total in totals.items():
        if total is not None and limit_bytes > total:
            raise ValueError(
                "Expected `memory_limit_mb` to be at most the memory of each "
                f"selected GPU; GPU:{index} has {total / MIB:.0f} MiB. "
                f"Received: memory_limit_mb={memory_limit_mb!r}"
            )


def _active_backend() -> str:
    import keras

    return keras.backend.backend()


def _too_late(what: str, detail: str, why: str) -> RuntimeError:
    return RuntimeError(
        f"configure_memory was called after {what}, so {detail} can no longer "
        f"take effect: {why}. {_CALL_FIRST}."
    )


def _nothing(
    backend: str, allow_growth: Optional[bool], limit_mb: Optional[float], why: str
) -> MemoryConfig:
    return MemoryConfig(backend, allow_growth, limit_mb, note=why)


# --------------------------------------------------------------------------
# NVML: total memory of the GPUs the process sees, without starting a
# framework.


@dataclasses.dataclass(frozen=True)
class _NvmlView:
    totals: Optional[list[int]]  # None: NVML could not be used
    reason: str = ""


def _nvml_visible_totals() -> _NvmlView:
    """Total bytes of each CUDA-visible NVIDIA GPU, in CUDA ordinal order.

    Honours `CUDA_VISIBLE_DEVICES` (indices, `GPU-` UUID prefixes, `MIG-`
    UUIDs; the list ends at the first invalid entry, as in CUDA). Indices
    follow NVML's PCI bus order, which is CUDA's order under
    `CUDA_DEVICE_ORDER=PCI_BUS_ID` (and on machines of one GPU model).
    """
    try:
        import pynvml
    except ImportError:
        return _NvmlView(
            None, "nvidia-ml-py is not installed: pip install nvidia-ml-py"
        )
    try:
        pynvml.nvmlInit()
    except Exception as error:  # NVMLError_LibraryNotFound, DriverNotLoaded...
        return _NvmlView(None, f"NVML is unavailable ({error})")
    try:
        from keras_memwatch.probes.nvml import visible_handles

        chosen = visible_handles(pynvml, os.environ.get("CUDA_VISIBLE_DEVICES"),
                                 pynvml.nvmlDeviceGetCount())
        return _NvmlView([_cuda_total(pynvml, h) for h in chosen])
    except Exception as error:
        return _NvmlView(None, f"NVML query failed ({error})")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # pragma: no cover - shutdown failure is harmless
            pass


def _cuda_total(pynvml: Any, handle: Any) -> int:
    """The total memory CUDA (and so XLA) reports for a device.

    NVML's plain total includes memory the driver reserves for itself
    (615 MiB on an H200); CUDA's total, which XLA multiplies the memory
    fraction by, leaves it out. NVML's v2 query reports both.
    """
    version = getattr(pynvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            if 0 <= int(info.reserved) < int(info.total):
                return int(info.total) - int(info.reserved)
        except Exception:  # older driver: fall back to the plain total
            pass
    return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)


def _nvidia_driver_present() -> bool:
    """Whether this Linux machine has an NVIDIA driver with a GPU."""
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return os.path.exists("/dev/nvidia0")


# --------------------------------------------------------------------------
# TensorFlow


def _tf_runtime_started() -> Optional[bool]:
    """Whether TensorFlow's eager context is initialised (None: can't tell)."""
    try:
        from tensorflow.python.eager import context

        return context.context()._context_handle is not None
    except Exception:  # private API moved: rely on TensorFlow's own errors
        return None


def _configure_tensorflow(request: _Request) -> MemoryConfig:
    allow_growth, memory_limit_mb = request.allow_growth, request.memory_limit_mb
    limit_bytes = request.limit_bytes
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return _nothing(
            "tensorflow", allow_growth, memory_limit_mb, "TensorFlow sees no GPU"
        )
    chosen = _select(request, len(gpus))
    if allow_growth is not None:
        visible = tf.config.get_visible_devices("GPU")
        left_out = [
            f"GPU:{i}" for i, g in enumerate(gpus) if g in visible and i not in chosen
        ]
        if left_out:
            raise ValueError(
                "TensorFlow requires the same memory growth on every visible "
                f"GPU, so `allow_growth` cannot leave out {left_out}. Pass "
                "devices=None, or hide those GPUs first (CUDA_VISIBLE_DEVICES "
                "or tf.config.set_visible_devices). "
                f"Received: devices={request.devices_arg!r}"
            )
    totals: dict[int, Optional[int]] = {i: None for i in chosen}
    if limit_bytes is not None:
        view = _nvml_visible_totals()
        if view.totals is not None and len(view.totals) == len(gpus):
            totals = {i: view.totals[i] for i in chosen}
        _check_limit_fits(limit_bytes, memory_limit_mb, totals)

    # TF_FORCE_GPU_ALLOW_GROWTH ("true"/"false") overrides tf.config's growth.
    # With a cap it is the only growth switch TensorFlow honours; without one
    # it is rewritten only when it contradicts the request.
    env_growth = os.environ.get(TF_FORCE_GROWTH_VAR)
    want_env: Optional[str] = None
    if allow_growth is not None:
        wanted = "true" if allow_growth else "false"
        if limit_bytes is not None or (
            env_growth in ("true", "false") and env_growth != wanted
        ):
            want_env = wanted
    if want_env is not None and env_growth != want_env and _tf_runtime_started():
        raise _too_late(
            "TensorFlow started its runtime",
            f"{TF_FORCE_GROWTH_VAR}={want_env}",
            "TensorFlow reads it when it creates its GPU devices",
        )

    mechanisms: list[str] = []
    try:
        if limit_bytes is None:
            for i in chosen:
                tf.config.experimental.set_memory_growth(gpus[i], allow_growth)
            mechanisms.append(
                f"tf.config.experimental.set_memory_growth({allow_growth})"
            )
        else:
            limit_arg: float = (
                limit_bytes // MIB if limit_bytes % MIB == 0 else limit_bytes / MIB
            )
            for i in chosen:
                tf.config.set_logical_device_configuration(
                    gpus[i],
                    [tf.config.LogicalDeviceConfiguration(memory_limit=limit_arg)],
                )
            mechanisms.append(
                "tf.config.set_logical_device_configuration("
                f"memory_limit={limit_arg})"
            )
    except RuntimeError as error:  # "... cannot be modified after being init..."
        raise _too_late(
            "TensorFlow started its runtime",
            "memory growth or a memory limit",
            f"TensorFlow says {str(error)!r}",
        ) from error

    notes: list[str] = []
    growth = allow_growth
    if want_env is not None:
        if env_growth not in (None, want_env):
            logger.warning(
                "configure_memory replaced %s=%s with %s (it overrides tf.config).",
                TF_FORCE_GROWTH_VAR,
                env_growth,
                want_env,
            )
        os.environ[TF_FORCE_GROWTH_VAR] = want_env
        mechanisms.append(f"{TF_FORCE_GROWTH_VAR}={want_env}")
        notes.append(f"{TF_FORCE_GROWTH_VAR} holds for all GPUs")
    elif allow_growth is None and env_growth in ("true", "false"):
        growth = env_growth == "true"
        notes.append(f"growth from {TF_FORCE_GROWTH_VAR}={env_growth}, already set")
    if limit_bytes is not None and not growth:
        notes.append("TensorFlow preallocates the whole cap when it starts")
    if limit_bytes is not None and None in totals.values():
        notes.append("GPU memory unknown (no NVML): cap not checked against it")
    mechanism = "; ".join(mechanisms)
    entries = tuple(
        DeviceMemoryConfig(
            f"GPU:{i}", growth, limit_bytes, totals.get(i), mechanism, "; ".join(notes)
        )
        for i in chosen
    )
    return MemoryConfig("tensorflow", allow_growth, memory_limit_mb, entries)


# --------------------------------------------------------------------------
# JAX


def _jax_backends_state() -> tuple[Optional[bool], Optional[tuple[str, ...]]]:
    """Whether JAX created its backends, without creating them.

    Returns:
        (started, platforms): `started` is None when it cannot be told;
        `platforms` the initialised platforms when known.
    """
    if "jax" not in sys.modules:
        return False, ()  # not even imported
    xb = sys.modules.get("jax._src.xla_bridge")
    if xb is None:
        return False, ()
    backends = getattr(xb, "_backends", None)
    if isinstance(backends, dict):
        if backends:
            return True, tuple(backends)
        # The CUDA plugin reads the XLA_* variables when it is registered
        # (jax_plugins/xla_cuda*/__init__.py), which can precede the backends.
        return getattr(xb, "_plugins_registered", False) is True, ()
    probe = getattr(xb, "backends_are_initialized", None)
    if callable(probe):
        try:
            return bool(probe()), None
        except Exception:
            pass
    return None, None


def _jax_platforms_setting() -> str:
    value = os.environ.get("JAX_PLATFORMS", "")
    if "jax" in sys.modules:
        try:
            from jax._src import config as jax_config

            value = jax_config.jax_platforms.value or ""
        except Exception:
            pass
    return value.strip().lower()


def _jax_fraction_var() -> str:
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


def _jax_fraction(limit_bytes: int, totals: list[int]) -> str:
    """`limit_bytes / max(totals)` rounded down to 6 decimals, as text."""
    fraction = math.floor(limit_bytes / max(totals) * 1e6) / 1e6
    return f"{fraction:.6f}".rstrip("0").rstrip(".")


def _configure_jax(request: _Request) -> MemoryConfig:
    allow_growth, memory_limit_mb = request.allow_growth, request.memory_limit_mb
    limit_bytes = request.limit_bytes
    platforms = _jax_platforms_setting()
    if platforms and not _JAX_GPU_PLATFORMS & {p.strip() for p in platforms.split(",")}:
        return _nothing(
            "jax",
            allow_growth,
            memory_limit_mb,
            f"JAX is restricted to platforms {platforms!r} (JAX_PLATFORMS)",
        )
    started, initialised = _jax_backends_state()
    gpu_backend = bool(initialised and _JAX_GPU_PLATFORMS & set(initialised))
    view = _nvml_visible_totals()
    totals = view.totals
    if not gpu_backend:
        if totals is None and not _nvidia_driver_present():
            why = f"no NVIDIA GPU found: {view.reason}"
            return _nothing("jax", allow_growth, memory_limit_mb, why)
        if totals == []:
            why = "NVML sees no visible GPU"
            return _nothing("jax", allow_growth, memory_limit_mb, why)

    received = f"Received: devices={request.devices_arg!r}"
    if totals is not None:
        if len(_select(request, len(totals))) != len(totals):
            raise ValueError(
                "Under JAX, GPU memory settings are environment variables "
                "that apply to every GPU the process sees, so `devices` must "
                f"select all of {[f'GPU:{i}' for i in range(len(totals))]}. "
                "Pass devices=None, or set CUDA_VISIBLE_DEVICES to the GPUs "
                f"to use before starting Python. {received}"
            )
        _check_limit_fits(limit_bytes, memory_limit_mb, dict(enumerate(totals)))
    elif request.selection is not None:
        raise ValueError(
            f"Cannot check `devices` under JAX without NVML ({view.reason}); "
            f"pass devices=None. {received}"
        )

    settings: dict[str, str] = {}
    if allow_growth is not None:
        settings[JAX_PREALLOCATE_VAR] = "false" if allow_growth else "true"
    fraction_var = _jax_fraction_var()
    fraction: Optional[str] = None
    if limit_bytes is not None:
        if totals is None:
            raise RuntimeError(
                "memory_limit_mb under JAX is set as a fraction of each GPU's "
                f"total memory, read through NVML, but {view.reason}."
            )
        fraction = _jax_fraction(limit_bytes, totals)
        if float(fraction) <= 0:
            raise ValueError(
                "Expected `memory_limit_mb` to be at least a millionth of the "
                f"GPU memory. Received: memory_limit_mb={memory_limit_mb!r}"
            )
        settings[fraction_var] = fraction

    in_effect = all(os.environ.get(k) == v for k, v in settings.items())
    if started and not in_effect:
        if initialised:
            where = f"JAX initialised its backends ({', '.join(initialised)})"
        elif initialised is None:
            where = "JAX initialised its backends"
        else:
            where = "JAX registered its GPU plugin"
        raise _too_late(
            where,
            " and ".join(f"{k}={v}" for k, v in settings.items()),
            "JAX reads these variables once, when it sets up its GPU plugin",
        )
    if started is None:
        logger.warning(
            "configure_memory could not tell whether JAX has started; the "
            "settings take effect only if it has not."
        )

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

    notes: list[str] = []
    if started:
        notes.append("already set before JAX started")
        if not gpu_backend:
            names = ", ".join(initialised or ())
            notes.append(f"JAX started without a GPU backend (platforms: {names})")
    allocator = os.environ.get(JAX_ALLOCATOR_VAR, "").lower()
    if fraction is not None and allocator == "platform":
        notes.append(f"{JAX_ALLOCATOR_VAR}=platform ignores the memory fraction")
        logger.warning(
            "%s=platform: JAX ignores %s, so memory_limit_mb is not enforced.",
            JAX_ALLOCATOR_VAR,
            fraction_var,
        )
    if allow_growth is False and fraction is None:
        notes.append("JAX preallocates its default share (75%) of each GPU")
    if fraction is not None and totals and len(set(totals)) > 1:
        notes.append("one fraction for all GPUs, derived from the largest")
    mechanism = ", ".join(f"{k}={v}" for k, v in settings.items())
    note = "; ".join(notes)
    if totals is None:  # a GPU NVML cannot list: only the growth switch is set
        entry = DeviceMemoryConfig("GPU:*", allow_growth, None, None, mechanism, note)
        return MemoryConfig(
            "jax",
            allow_growth,
            memory_limit_mb,
            (entry,),
            f"set for every GPU JAX will see; {view.reason}",
        )
    entries = tuple(
        DeviceMemoryConfig(
            f"GPU:{i}",
            allow_growth,
            None if fraction is None else int(float(fraction) * total),
            total,
            mechanism,
            note,
        )
        for i, total in enumerate(totals)
    )
    return MemoryConfig("jax", allow_growth, memory_limit_mb, entries)


# --------------------------------------------------------------------------
# PyTorch


def _configure_torch(request: _Request) -> MemoryConfig:
    allow_growth, memory_limit_mb = request.allow_growth, request.memory_limit_mb
    limit_bytes = request.limit_bytes
    import torch

    if not torch.cuda.is_available():
        why = "PyTorch sees no CUDA GPU"
        return _nothing("torch", allow_growth, memory_limit_mb, why)
    chosen = _select(request, torch.cuda.device_count())
    totals = {i: int(torch.cuda.get_device_properties(i).total_memory) for i in chosen}
    _check_limit_fits(limit_bytes, memory_limit_mb, totals)
    if allow_growth is False:
        logger.warning(
            "allow_growth=False has no effect under PyTorch: its caching "
            "allocator cannot preallocate; it allocates on demand."
        )
    entries = []
    for i in chosen:
        mechanisms: list[str] = []
        notes: list[str] = []
        applied = None
        if limit_bytes is not None:
            fraction = limit_bytes / totals[i]
            torch.cuda.set_per_process_memory_fraction(fraction, i)
            applied = int(fraction * totals[i])
            mechanisms.append(
                f"torch.cuda.set_per_process_memory_fraction({fraction:.6g}, {i})"
            )
            reserved = int(torch.cuda.memory_reserved(i))
            if reserved > applied:
                notes.append(
                    f"{format_bytes(reserved)} already reserved, above the cap; it "
                    "stays reserved until freed (torch.cuda.empty_cache())"
                )
                logger.warning(
                    "GPU:%s already has %s reserved by PyTorch, above the new "
                    "cap of %s: new allocations fail until memory is freed.",
                    i,
                    format_bytes(reserved),
                    format_bytes(applied),
                )
        if allow_growth is not None:
            mechanisms.append("nothing set: the caching allocator grows on demand")
            if not allow_growth:
                notes.append("PyTorch cannot preallocate")
        entries.append(
            DeviceMemoryConfig(
                f"GPU:{i}",
                None if allow_growth is None else True,
                applied,
                totals[i],
                "; ".join(mechanisms),
                "; ".join(notes),
            )
        )
    return MemoryConfig("torch", allow_growth, memory_limit_mb, tuple(entries))


__all__ = [
    "DeviceMemoryConfig",
    "MemoryConfig",
    "applied_limit_bytes",
    "configure_memory",
    "last_memory_config",
]
