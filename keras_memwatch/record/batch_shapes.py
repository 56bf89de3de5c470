"""The input shapes a fit called its model with, and which shape each batch
had.

For the length of a fit, `BatchShapes` wraps the model's `call` on the
instance: each distinct input signature (the shapes and dtypes of the
inputs) is kept, in the order first seen. Under JAX and TensorFlow the
model is called only while a step is traced, so this costs nothing per
step; TensorFlow may trace with an unknown batch dimension (`None`).

Where every batch's inputs are seen, it also keeps which signature each
recent batch had, under the key the batch hooks name it by
(`batch_begins`), and
how many batches had each: PyTorch's eager steps call the model at every
batch (a shape comparison each), and under JAX XLA's step planner hands
it each batch it draws (`note`). `of(key)` and `usual` answer.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from typing import Any, Optional

from keras_memwatch.call_wrapping import elements, signature, unwrap_call, wrap_call

__all__ = ["BatchShapes", "BatchInputs", "input_specs"]

#: Batches whose signature is kept: enough for spikes judged late.
RECENT = 4096


class BatchInputs(enum.Enum):
    """How each training batch's inputs reach `BatchShapes`."""

    #: The model is called at every batch (PyTorch's eager steps).
    MODEL_CALL = "model call"
    #: XLA's step planner hands `note` each batch it draws (JAX).
    PLANNER = "planner"
    #: Not at all: a compiled step calls the model only while it is traced.
    UNSEEN = "unseen"


class BatchShapes:
    """Input signatures of a model's calls during a fit.

    Attributes:
        seen: `(structure, signature)` pairs in the order first seen: the
            inputs' structure as `keras.KerasTensor`s, and their
            `((shape, dtype), ...)`.
        per_batch: whether each batch's signature is known.
        key: the key of the batch running (set by `batch_begins`).
        quiet: while True, calls of the model are not noted (a symbolic
            call of MemWatch's own).
    """

    def __init__(self) -> None:
        self.seen: list[tuple[Any, tuple]] = []
        self.model: Any = None
        self.per_batch = False
        self.key: Hashable = None
        self.quiet = False
        self._token: Optional[tuple] = None
        self._index: dict[tuple, int] = {}  # signature -> its place in `seen`
        self._reset_batches()

    def _reset_batches(self) -> None:
        self._counts: list[int] = [0] * len(self.seen)
        self._recent: dict[Hashable, int] = {}
        self._last: Any = None  # the first input's shape, of the last batch
        self._current: Optional[int] = None

    def attach(self, model: Any, inputs: BatchInputs = BatchInputs.UNSEEN) -> None:
        """Starts noting `model`'s input shapes (a new model forgets the
        shapes of the one before).

        Args:
            model: the Keras model.
            inputs: how each batch's inputs are seen. Defaults to
                `BatchInputs.UNSEEN`.
        """
        self.detach()
        if model is None:
            return
        if model is not self.model:
            self.seen, self._index = [], {}
        self.model = model
        self.per_batch = inputs is not BatchInputs.UNSEEN
        self._reset_batches()
        every_call = inputs is BatchInputs.MODEL_CALL

        def make(original: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                if self.quiet:
                    return original(*args, **kwargs)
                try:
                    inputs = args[0] if args else kwargs.get("inputs")
                    if every_call:
                        self.note(inputs)
                    else:
                        self._find(inputs)
                except Exception:  # never into training
                    pass
                return original(*args, **kwargs)

            return call

        self._token = wrap_call(model, make)

    def detach(self) -> None:
        """Gives the model its own `call` back."""
        if self._token is not None:
            unwrap_call(self._token)
        self._token, self.per_batch = None, False

    def batch_begins(self, key: Hashable) -> None:
        """Notes that the batch named `key` runs next (training thread)."""
        self.key = key

    def note(self, inputs: Any) -> None:
        """Notes the inputs of the batch named last."""
        first = getattr(inputs, "shape", None)
        if first is None or first != self._last:
            self._last = first
            self._current = self._find(inputs)
        i = self._current
        if i is None:
            return
        self._counts[i] += 1
        if len(self.seen) > 1:
            recent, key = self._recent, self.key
            known = recent.get(key)  # steps of one execution: the largest
            if known is None or elements(self.seen[i][1]) > elements(self.seen[known][1]):
                recent[key] = i
            if len(recent) > RECENT:
                del recent[next(iter(recent))]

    def of(self, key: Hashable) -> Optional[int]:
        """The place in `seen` of the signature of the batch `key` (None
        where it was not seen, or the fit had a single signature)."""
        return self._recent.get(key)

    @property
    def usual(self) -> Optional[int]:
        """The place in `seen` of the signature most batches had."""
        counts = self._counts
        return max(range(len(counts)), key=counts.__getitem__) if any(counts) else None

    def _find(self, inputs: Any) -> Optional[int]:
        """The place of the inputs' signature in `seen`, added where new."""
        found = signature(inputs)
        if found is None:
            return None
        i = self._index.get(found)
        if i is None:
            i = self._index[found] = len(self.seen)
            self.seen.append((input_specs(inputs), found))
            self._counts.append(0)
        return i


def input_specs(inputs: Any) -> Any:
    """`inputs` (arrays or tensors, nested) as `keras.KerasTensor`s of their
    shapes and dtypes."""
    import keras

    return keras.tree.map_structure(
        lambda t: keras.KerasTensor(tuple(t.shape),
                                    keras.backend.standardize_dtype(t.dtype)),
        inputs)
