"""A callback that frees what reference cycles hold, every few batches.

Keras's PyTorch backend leaves each step's input batch, and some of its
activations, in reference cycles (keras-team/keras#23110). Only Python's
cyclic garbage collector frees them, at moments set by everything the
process allocates, so device memory can pile up for many steps and a job
dies at a size that trained its first epochs. A full collection every few
batches bounds that; `keras_memwatch.break_tree_cycles()` stops Keras's
tree functions making them. The jobs that show it, and what each costs,
are in docs/capacity.md.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any, Optional

import keras

logger = logging.getLogger("keras_memwatch")


class CollectCycles(keras.callbacks.Callback):
    """Runs Python's full garbage collection when training begins and every
    `every` training batches after.

    The first collection frees what Keras's build of the model for the first
    batch left: on PyTorch, a model whose forward pass cannot run on the
    meta device (keras-hub's Phi-3) is run for real at the batch's shape,
    and its activations, the logits among them, stay in reference cycles.

    A collection takes a fraction of a second in a process holding a Keras
    model (a job's total is in `seconds`). The callback reads no logs, so
    Keras may run it on its worker threads without waiting for the step
    (`async_safe`). With the JAX and TensorFlow backends nothing is held in
    cycles and it is not needed.

    Args:
        every: batches between collections, a positive integer.

    Example:

    ```python
    model.fit(x, y, callbacks=[MemWatch(), CollectCycles(every=50)])
    ```
    """

    async_safe = True

    def __init__(self, every: int = 50) -> None:
        super().__init__()
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(
                f"CollectCycles: `every` must be a positive integer number of "
                f"batches, got {every!r}; pass e.g. every=50.")
        self.every = every
        self.collections = 0
        self.seconds = 0.0
        self.objects_freed = 0
        self._batches = 0
        self._lock = threading.Lock()

    def on_train_begin(self, logs: Optional[dict[str, Any]] = None) -> None:
        self.collections, self.seconds, self.objects_freed, self._batches = 0, 0.0, 0, 0
        self._collect()  # what Keras's build for the first batch left

    def on_train_batch_end(self, batch: int, logs: Optional[dict[str, Any]] = None) -> None:
        with self._lock:  # `batch` restarts every epoch; hooks may overlap
            self._batches += 1
            if self._batches % self.every == 0:
                self._collect()

    def _collect(self) -> None:
        began = time.perf_counter()
        self.objects_freed += gc.collect()
        self.seconds += time.perf_counter() - began
        self.collections += 1

    def on_train_end(self, logs: Optional[dict[str, Any]] = None) -> None:
        logger.info("CollectCycles: %d collections in %d batches took %.2f s and "
                    "freed %d objects", self.collections, self._batches,
                    self.seconds, self.objects_freed)
