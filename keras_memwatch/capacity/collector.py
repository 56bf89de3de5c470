"""Python's garbage collector, paused while the estimate measures steps.

Keras's PyTorch backend leaves each step's input batch, and some of its
activations, in reference cycles: its tree functions
(`keras/src/tree/torchtree_impl.py`) pass `torch.utils._pytree.tree_flatten`
a closure over the structure, and `tree_flatten`'s recursive helper refers
to itself (keras-team/keras#23110). Only Python's cyclic garbage collector
frees them, at a moment set by every object the process made before. So a
step's peak depends on the process's history (the likely reason why the
PyTorch block on an H200 under a 6 GiB cap trained batch 601 five times of
five from one script and none of five from another doing the same), and
within a job of 60 steps at batch 500 its peak rose by 383 MiB, three of
its batch-sized tensors, above the first steps'. With the cycles broken
(keras-team/keras#23111, applied by hand) the memory in use at every batch
end of 60 steps at batch 585 was the same, 234 MiB.

The steps the estimate measures in its own process therefore run from one
collection, with none during them: the same in every process, each step
meeting the garbage of the steps before it, and `freed_by_collection` says
what the cycles held. This is not a long job's worst case (the block
trained 585 for two such steps and ran out of memory at 537 within 60), so
the answer on PyTorch comes from jobs of many steps in new processes
(`fresh_process`).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Callable


@contextlib.contextmanager
def paused(collect: bool = True) -> Iterator[None]:
    """Collects garbage, then keeps the collector off until the block ends.

    Args:
        collect: whether to collect first; `False` where the caller has
            just collected (`TorchCache.free`): a collection costs a
            quarter of a second in a process holding a Keras model.

    Example:

    ```python
    with collector.paused():
        model.train_on_batch(x, y)
        model.train_on_batch(x, y)  # the first step's cycles still held
    ```
    """
    enabled = gc.isenabled()
    if collect:
        gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def freed_by_collection(allocated: Callable[[], int]) -> int:
    """The bytes that one collection frees, read by `allocated` (device
    bytes in use) before and after it: what reference cycles held."""
    before = allocated()
    gc.collect()
    return max(before - allocated(), 0)
