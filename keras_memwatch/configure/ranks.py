"""Which process of a distributed run this is, without starting anything.

Asked at train begin, when the framework is up anyway: JAX's
`process_index()` once `jax.distributed` is initialised, the TensorFlow
task index of `TF_CONFIG` (`MultiWorkerMirroredStrategy`), PyTorch's rank
once `torch.distributed` is initialised, else the `RANK` launchers set, else
a single process (0 of 1).
"""

from __future__ import annotations

import json
import os
import platform
import sys


def process_index_and_count() -> tuple[int, int]:
    """`(index, count)` of this process among the processes that train."""
    for read in (_jax, _tf_config, _torch, _environment):
        try:
            found = read()
        except Exception:  # a half-initialised framework: ask the next one
            found = None
        if found is not None and found[1] > 1:
            return found
    return 0, 1


def hostname() -> str:
    """This machine's name, as rows and alerts give it."""
    return platform.node()


def _jax() -> tuple[int, int] | None:
    jax = sys.modules.get("jax")
    if jax is None or not _backend_is("jax"):
        return None
    return int(jax.process_index()), int(jax.process_count())


def _tf_config() -> tuple[int, int] | None:
    text = os.environ.get("TF_CONFIG")
    if not text:
        return None
    config = json.loads(text)
    cluster, task = config.get("cluster", {}), config.get("task", {})
    roles = [r for r in ("chief", "worker") if r in cluster]
    order = [(r, i) for r in roles for i in range(len(cluster[r]))]
    me = (task.get("type"), int(task.get("index", 0)))
    return (order.index(me), len(order)) if me in order else None


def _torch() -> tuple[int, int] | None:
    torch = sys.modules.get("torch")
    if torch is None or not torch.distributed.is_available():
        return None
    if not torch.distributed.is_initialized():
        return None
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def _environment() -> tuple[int, int] | None:
    rank, size = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or size is None:
        return None
    return int(rank), int(size)


def _backend_is(name: str) -> bool:
    keras = sys.modules.get("keras")
    return keras is not None and keras.backend.backend() == name
