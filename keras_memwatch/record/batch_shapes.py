"""The input shapes a fit called its model with, for `MemWatch.by_layer`.

For the length of a fit, `BatchShapes` wraps the model's `call` on the
instance: each distinct input signature (the shapes and dtypes of the
inputs) is kept, in the order first seen. Under JAX and TensorFlow the
model is called only while a step is traced, so this costs nothing per
step; under PyTorch it costs a shape comparison per step. TensorFlow may
trace with an unknown batch dimension (`None`).
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["BatchShapes"]


def _signature(inputs: Any) -> Optional[tuple]:
    import keras

    leaves = keras.tree.flatten(inputs)
    if not leaves or not all(hasattr(t, "shape") and hasattr(t, "dtype")
                             for t in leaves):
        return None
    return tuple((tuple(None if d is None else int(d) for d in t.shape),
                  keras.backend.standardize_dtype(t.dtype)) for t in leaves)


class BatchShapes:
    """Input signatures of a model's calls during a fit.

    Attributes:
        seen: `(structure, signature)` pairs in the order first seen: the
            inputs' structure as `keras.KerasTensor`s, and their
            `((shape, dtype), ...)`.
    """

    def __init__(self) -> None:
        self.seen: list[tuple[Any, tuple]] = []
        self.model: Any = None
        self._wrapper: Any = None
        self._before: Any = None  # the model's own instance `call`, if any

    def attach(self, model: Any) -> None:
        """Starts noting `model`'s input shapes (a new model forgets the
        shapes of the one before)."""
        self.detach()
        if model is None:
            return
        if model is not self.model:
            self.seen = []
        self.model = model
        self._before = vars(model).get("call")
        original = model.call
        known = {signature for _, signature in self.seen}
        last: list[Any] = [None]

        def call(*args: Any, **kwargs: Any) -> Any:
            inputs = args[0] if args else kwargs.get("inputs")
            first = inputs if hasattr(inputs, "shape") else None
            if first is None or first.shape != last[0]:
                last[0] = None if first is None else first.shape
                try:
                    signature = _signature(inputs)
                    if signature is not None and signature not in known:
                        known.add(signature)
                        self.seen.append((_specs(inputs), signature))
                except Exception:  # never into training
                    pass
            return original(*args, **kwargs)

        object.__setattr__(model, "call", call)
        self._wrapper = call

    def detach(self) -> None:
        """Gives the model its own `call` back."""
        model, wrapper = self.model, self._wrapper
        if wrapper is not None and vars(model).get("call") is wrapper:
            if self._before is not None:
                object.__setattr__(model, "call", self._before)
            else:
                object.__delattr__(model, "call")
        self._wrapper = self._before = None


def _specs(inputs: Any) -> Any:
    import keras

    return keras.tree.map_structure(
        lambda t: keras.KerasTensor(tuple(t.shape),
                                    keras.backend.standardize_dtype(t.dtype)),
        inputs)
