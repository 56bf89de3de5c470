"""PyTorch's CUDA caching allocator: its settings, its cache and its peaks.

The caching allocator holds *reserved* segments from the device and hands
out blocks inside them. A per-process cap (`configure_memory`) bounds the
reserved bytes, not the allocated ones, so what a step needs is its
allocated peak plus what block rounding and fragmentation cost: a freed
block too small for the next request stays reserved, and when a request
finds no room under the cap the allocator frees only the segments that are
wholly unused before it gives up.

`PYTORCH_CUDA_ALLOC_CONF` (`PYTORCH_ALLOC_CONF` from torch 2.9) is read
once, when CUDA starts. One of its options, `expandable_segments`, is
consulted each time the allocator creates a segment, and torch lets a
running process change it (`torch._C._accelerator_setAllocatorSettings`,
earlier `torch.cuda.memory._set_allocator_settings`; torch's own tests and
vLLM switch it that way). So the gain of `expandable_segments:True` can be
measured in this process: free the cache, switch it on, train, switch it
back. What is already allocated (the weights, the optimizer state) stays in
the segments it has; a process started with the setting would hold those in
an expandable segment too, which changes nothing that grows with the batch.

This module imports torch only inside its functions.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Optional

logger = logging.getLogger("keras_memwatch")

#: Steps trained per size measured from a freed cache. The second step
#: reserves more than the first (the first step's freed blocks do not all
#: fit the second's requests): on an H200 under a 6 GiB cap, a transformer
#: at batch 128 reserved 5.1 GiB in its first step and 5.8 GiB in its
#: second, and batch 154 trained one step while 140 failed in the second. A
#: third step reserved no more than the second.
STEPS_PER_SIZE = 2

#: The environment variables PyTorch reads its allocator settings from.
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def parse_alloc_conf(text: str) -> dict[str, str]:
    """`"expandable_segments:True,max_split_size_mb:128"` as a dict."""
    out: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition(":")
        if key:
            out[key.strip()] = value.strip() if sep else ""
    return out


@dataclasses.dataclass(frozen=True)
class AllocatorSettings:
    """PyTorch's allocator settings in effect.

    Attributes:
        variables: each of `ALLOC_CONF_VARS` that is set, with its value.
        options: the options they set (the first variable wins a clash,
            as in PyTorch).
        backend: `"native"` (the caching allocator), `"cudaMallocAsync"`,
            or `""` when torch cannot say.
    """

    variables: tuple[tuple[str, str], ...] = ()
    options: tuple[tuple[str, str], ...] = ()
    backend: str = ""

    @property
    def expandable(self) -> bool:
        """Whether `expandable_segments:True` is set."""
        return dict(self.options).get("expandable_segments", "").lower() == "true"

    @property
    def caching(self) -> bool:
        """Whether the native caching allocator is in use."""
        return self.backend in ("", "native")

    def text(self) -> str:
        """The settings, in words: what is set, or that none is."""
        if self.variables:
            where = ", ".join(f"{k}={v}" for k, v in self.variables)
        else:
            where = "PYTORCH_CUDA_ALLOC_CONF not set (the defaults)"
        kind = ("" if not self.backend else
                f"; allocator backend {self.backend}")
        segments = ("expandable segments" if self.expandable else
                    "fixed-size segments (expandable_segments off)")
        return f"{where}{kind}; {segments}"


def read_settings(environ: Optional[Mapping[str, str]] = None) -> AllocatorSettings:
    """The allocator settings of this process (torch imported if present)."""
    environ = os.environ if environ is None else environ
    variables = tuple((k, environ[k]) for k in ALLOC_CONF_VARS if environ.get(k))
    options: dict[str, str] = {}
    for _, value in reversed(variables):
        options.update(parse_alloc_conf(value))
    backend = ""
    try:
        import torch

        backend = str(torch.cuda.get_allocator_backend())
    except Exception:
        pass
    return AllocatorSettings(variables, tuple(sorted(options.items())), backend)


def _setter(torch: Any) -> Optional[Callable[[str], Any]]:
    """torch's call that changes allocator settings at run time, or None."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if setter is not None:
        return setter
    legacy = getattr(getattr(torch.cuda, "memory", None), "_set_allocator_settings",
                     None)
    if legacy is None:
        return None

    def quiet(text: str) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return legacy(text)

    return quiet


class TorchCache:
    """The caching allocator of one CUDA device, as the estimate uses it.

    Args:
        index: the CUDA device index.
    """

    def __init__(self, index: int):
        import torch

        self.torch = torch
        self.index = index

    def free(self) -> None:
        """Waits for the device, collects garbage, hands the cache back."""
        cuda = self.torch.cuda
        gc.collect()
        cuda.synchronize(self.index)
        cuda.empty_cache()

    def sync(self) -> None:
        """Waits for the device's queued work."""
        self.torch.cuda.synchronize(self.index)

    def reset_peaks(self) -> None:
        self.torch.cuda.reset_peak_memory_stats(self.index)

    def peaks(self) -> tuple[int, int]:
        """`(allocated peak, reserved peak)` since the last reset."""
        cuda = self.torch.cuda
        cuda.synchronize(self.index)
        return (int(cuda.max_memory_allocated(self.index)),
                int(cuda.max_memory_reserved(self.index)))

    def allocated(self) -> int:
        """Bytes allocated now."""
        return int(self.torch.cuda.memory_allocated(self.index))

    def reserved(self) -> int:
        """Bytes reserved now."""
        return int(self.torch.cuda.memory_reserved(self.index))

    def device_free(self) -> Optional[int]:
        """Bytes free on the device now, or `None` where CUDA cannot say."""
        try:
            return int(self.torch.cuda.mem_get_info(self.index)[0])
        except Exception:
            return None

    def set_expandable(self, on: bool) -> bool:
        """Switches `expandable_segments` for segments created from now on.

        Returns:
            Whether torch took the setting.
        """
        setter = _setter(self.torch)
        if setter is None:
            return False
        try:
            setter(f"expandable_segments:{'True' if on else 'False'}")
        except Exception as e:
            logger.info("estimate_max_batch_size: torch refused "
                        "expandable_segments:%s (%r)", on, e)
            return False
        return True


def torch_cache(backend: str, gpu_index: Optional[int]) -> Optional[TorchCache]:
    """The caching allocator of the GPU measured, on PyTorch; else None."""
    if backend != "torch" or gpu_index is None:
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
    except ImportError:
        return None
    return TorchCache(gpu_index)
