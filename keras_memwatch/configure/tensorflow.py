"""GPU memory settings under TensorFlow.

Growth goes through `tf.config.experimental.set_memory_growth`, a cap
through one logical device per GPU,
`tf.config.set_logical_device_configuration(memory_limit=...)`. TensorFlow
refuses memory growth on a GPU with a logical device configuration, and
ignores every GPU's growth setting once any GPU has one; so growth beside a
cap goes through `TF_FORCE_GPU_ALLOW_GROWTH`, which TensorFlow's GPU BFC
allocator reads whatever the configuration.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from keras_memwatch.configure.arguments import Request, check_limit_fits, select, too_late
from keras_memwatch.configure.results import DeviceMemoryConfig, MemoryConfig
from keras_memwatch.configure.nvml_devices import visible_totals
from keras_memwatch.units import MIB

logger = logging.getLogger("keras_memwatch")

# Read by TensorFlow's GPU BFC allocator; overrides the growth in tf.config.
TF_FORCE_GROWTH_VAR = "TF_FORCE_GPU_ALLOW_GROWTH"


def configure_tensorflow(request: Request) -> MemoryConfig:
    """Applies `request` to TensorFlow's GPUs; see `configure_memory`."""
    import tensorflow as tf

    allow_growth, memory_limit_mb = request.allow_growth, request.memory_limit_mb
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        why = "TensorFlow sees no GPU"
        return MemoryConfig("tensorflow", allow_growth, memory_limit_mb, note=why)
    chosen = select(request, len(gpus))
    if allow_growth is not None:
        _check_same_growth(tf, gpus, chosen, request)
    totals = _totals(gpus, chosen, request)
    env_growth = os.environ.get(TF_FORCE_GROWTH_VAR)
    want_env = _wanted_growth_variable(request, env_growth)
    if want_env is not None and env_growth != want_env and _runtime_started():
        raise too_late(
            "TensorFlow started its runtime",
            f"{TF_FORCE_GROWTH_VAR}={want_env}",
            "TensorFlow reads it when it creates its GPU devices",
        )

    mechanisms = [_apply(tf, gpus, chosen, request)]
    if want_env is not None:
        _set_growth_variable(env_growth, want_env)
        mechanisms.append(f"{TF_FORCE_GROWTH_VAR}={want_env}")
    growth, note = _growth_and_note(request, env_growth, want_env, totals)
    mechanism = "; ".join(mechanisms)
    entries = tuple(
        DeviceMemoryConfig(
            f"GPU:{i}", growth, request.limit_bytes, totals.get(i), mechanism, note
        )
        for i in chosen
    )
    return MemoryConfig("tensorflow", allow_growth, memory_limit_mb, entries)


def _runtime_started() -> Optional[bool]:
    """Whether TensorFlow's eager context is initialised (None: can't tell)."""
    try:
        from tensorflow.python.eager import context

        return context.context()._context_handle is not None
    except Exception:  # private API moved: rely on TensorFlow's own errors
        return None


def _check_same_growth(
    tf: Any, gpus: list, chosen: list[int], request: Request
) -> None:
    """TensorFlow requires one memory growth setting for all visible GPUs."""
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


def _totals(
    gpus: list, chosen: list[int], request: Request
) -> dict[int, Optional[int]]:
    """Each chosen GPU's total memory (None: unknown), checked against a cap."""
    totals: dict[int, Optional[int]] = {i: None for i in chosen}
    if request.limit_bytes is None:
        return totals
    view = visible_totals()
    if view.totals is not None and len(view.totals) == len(gpus):
        totals = {i: view.totals[i] for i in chosen}
    check_limit_fits(request.limit_bytes, request.memory_limit_mb, totals)
    return totals


def _wanted_growth_variable(
    request: Request, env_growth: Optional[str]
) -> Optional[str]:
    """The `TF_FORCE_GPU_ALLOW_GROWTH` value to set, or None to leave it.

    With a cap it is the only growth switch TensorFlow honours; without one
    it is rewritten only when it contradicts the request.
    """
    if request.allow_growth is None:
        return None
    wanted = "true" if request.allow_growth else "false"
    if request.limit_bytes is not None or (
        env_growth in ("true", "false") and env_growth != wanted
    ):
        return wanted
    return None


def _apply(tf: Any, gpus: list, chosen: list[int], request: Request) -> str:
    """Sets growth or a logical device with a cap; returns what it called."""
    allow_growth, limit_bytes = request.allow_growth, request.limit_bytes
    try:
        if limit_bytes is None:
            for i in chosen:
                tf.config.experimental.set_memory_growth(gpus[i], allow_growth)
            return f"tf.config.experimental.set_memory_growth({allow_growth})"
        limit_arg: float = (
            limit_bytes // MIB if limit_bytes % MIB == 0 else limit_bytes / MIB
        )
        for i in chosen:
            tf.config.set_logical_device_configuration(
                gpus[i],
                [tf.config.LogicalDeviceConfiguration(memory_limit=limit_arg)],
            )
        return f"tf.config.set_logical_device_configuration(memory_limit={limit_arg})"
    except RuntimeError as error:  # "... cannot be modified after being init..."
        raise too_late(
            "TensorFlow started its runtime",
            "memory growth or a memory limit",
            f"TensorFlow says {str(error)!r}",
        ) from error


def _set_growth_variable(env_growth: Optional[str], want_env: str) -> None:
    """Sets `TF_FORCE_GPU_ALLOW_GROWTH`, warning when it replaces a value."""
    if env_growth not in (None, want_env):
        logger.warning(
            "configure_memory replaced %s=%s with %s (it overrides tf.config).",
            TF_FORCE_GROWTH_VAR,
            env_growth,
            want_env,
        )
    os.environ[TF_FORCE_GROWTH_VAR] = want_env


def _growth_and_note(
    request: Request,
    env_growth: Optional[str],
    want_env: Optional[str],
    totals: dict[int, Optional[int]],
) -> tuple[Optional[bool], str]:
    """The growth in effect on every GPU, and what a user should know."""
    growth = request.allow_growth
    notes: list[str] = []
    if want_env is not None:
        notes.append(f"{TF_FORCE_GROWTH_VAR} holds for all GPUs")
    elif growth is None and env_growth in ("true", "false"):
        growth = env_growth == "true"
        notes.append(f"growth from {TF_FORCE_GROWTH_VAR}={env_growth}, already set")
    if request.limit_bytes is not None and not growth:
        notes.append("TensorFlow preallocates the whole cap when it starts")
    if request.limit_bytes is not None and None in totals.values():
        notes.append("GPU memory unknown (no NVML): cap not checked against it")
    return growth, "; ".join(notes)
