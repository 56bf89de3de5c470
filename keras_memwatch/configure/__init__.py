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

One module per backend (`tensorflow`, `jax`, `torch`), as in
`keras_memwatch.record.probes`; `arguments` checks the arguments and `results`
holds what is returned.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Optional, Union

from keras_memwatch.configure.arguments import Request, check_arguments
from keras_memwatch.configure.jax import (
    JAX_ALLOCATOR_VAR,
    JAX_LEGACY_MEM_FRACTION_VAR,
    JAX_MEM_FRACTION_VAR,
    JAX_PREALLOCATE_VAR,
    configure_jax,
)
from keras_memwatch.configure.results import DeviceMemoryConfig, DeviceSpec, MemoryConfig
from keras_memwatch.configure.tensorflow import TF_FORCE_GROWTH_VAR, configure_tensorflow
from keras_memwatch.configure.torch import configure_torch

logger = logging.getLogger("keras_memwatch")

_CONFIGURE = {
    "tensorflow": configure_tensorflow,
    "jax": configure_jax,
    "torch": configure_torch,
}


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

    What was applied is logged at INFO on the `keras_memwatch` logger and
    returned.

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
    limit_bytes, selection = check_arguments(allow_growth, memory_limit_mb, devices)
    request = Request(allow_growth, memory_limit_mb, limit_bytes, selection, devices)
    backend = _active_backend()
    if allow_growth is None and limit_bytes is None:
        why = "neither allow_growth nor memory_limit_mb given"
        config = MemoryConfig(backend, None, None, note=why)
    elif backend in _CONFIGURE:
        config = _CONFIGURE[backend](request)
    else:
        why = f"the {backend!r} Keras backend has no GPU memory settings"
        config = MemoryConfig(backend, allow_growth, memory_limit_mb, note=why)
    logger.info("%s", config)
    return config


def _active_backend() -> str:
    import keras

    return keras.backend.backend()


__all__ = [
    "DeviceMemoryConfig",
    "JAX_ALLOCATOR_VAR",
    "JAX_LEGACY_MEM_FRACTION_VAR",
    "JAX_MEM_FRACTION_VAR",
    "JAX_PREALLOCATE_VAR",
    "MemoryConfig",
    "TF_FORCE_GROWTH_VAR",
    "configure_memory",
]
