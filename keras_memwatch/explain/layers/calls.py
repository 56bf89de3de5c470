"""Which layer is running: every layer call of a model, in call order.

`CallTracer` wraps the `call` of each layer that gets a row (and of the
models it walks through) for the length of a `with` block, on the instance
only: other models and other threads are untouched. A call records its
layer, the layer that made it, and its outputs. While a call runs,
`owner()` names the layer whose row the work belongs to: the innermost row
layer on the stack (the sublayers of a row layer, such as the projections
of a `MultiHeadAttention`, belong to it).

Rows: the layers of the model (`model.layers`, recursively), a nested
model (a layer that is a `keras.Model`) expanded into its own layers, or
kept whole as one row with `expand_nested=False`. A layer called several
times (shared) is one row. With `expand_blocks=True` a composite layer
that is not a model (a transformer block, a `MultiHeadAttention`: a layer
holding layers) is opened: each of its parts is a row of its own
(`"block/part"`, recursively), and the block's row keeps only the work of
its own `call` outside its parts (a residual add, the attention scores'
product).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from keras_memwatch.call_wrapping import signature, unwrap_call, wrap_call

__all__ = ["CallTracer", "LayerCalls"]


@dataclasses.dataclass
class LayerCalls:
    """One row's layer and what its calls returned.

    Attributes:
        layer: the Keras layer.
        path: its name, prefixed by the nested models it sits in
            (`"encoder/dense"`).
        outputs: the `(shape, dtype)` of each flat output of each call
            (a dimension the trace does not know is `None`).
        remat: whether the layer rematerializes (keras `RematScope`).
    """

    layer: Any
    path: str
    outputs: list[list[tuple[tuple, str]]] = dataclasses.field(default_factory=list)
    remat: bool = False

    @property
    def calls(self) -> int:
        return len(self.outputs)


def _remat(layer: Any) -> bool:
    return getattr(layer, "_remat_mode", None) is not None


class CallTracer:
    """Records a model's layer calls while active (a context manager).

    Args:
        model: the Keras model.
        expand_nested: give the layers of a nested model rows of their own.
            Defaults to `True`.
        on_enter, on_exit: called with the `LayerCalls` of a row layer as
            each of its calls starts, and with it and the call's outputs as
            it ends (on the calling thread).
        no_remat: switch rematerialization off while active (the shapes of
            a symbolic walk do not depend on it). Defaults to `False`.
        expand_blocks: open composite layers that are not models: their
            parts get rows of their own. Defaults to `False`.
    """

    def __init__(self, model: Any, expand_nested: bool = True,
                 on_enter: Optional[Callable[[LayerCalls], None]] = None,
                 on_exit: Optional[Callable[[LayerCalls, Any], None]] = None,
                 no_remat: bool = False, expand_blocks: bool = False):
        import keras

        self.model = model
        self.rows: dict[int, LayerCalls] = {}
        self.order: list[LayerCalls] = []  # rows by their first call
        self._stack: list[Optional[LayerCalls]] = []
        self._on_enter, self._on_exit = on_enter, on_exit
        self._no_remat = no_remat
        # (wrap_call's token, the layer's remat mode)
        self._wrapped: list[tuple[tuple, Any]] = []
        self._walk: list[tuple[Any, Optional[str]]] = []  # (layer, row path or None)
        self._expand_blocks = expand_blocks
        self._expand(model, "", keras.Model, expand_nested)

    def _expand(self, model: Any, prefix: str, model_type: type,
                expand_nested: bool) -> None:
        self._walk.append((model, None))
        for layer in getattr(model, "layers", ()):
            if any(layer is seen for seen, _ in self._walk):
                continue  # shared: one row
            if isinstance(layer, model_type) and expand_nested:
                self._expand(layer, f"{prefix}{layer.name}/", model_type, True)
            elif type(layer).__name__ != "InputLayer":
                self._walk.append((layer, prefix + layer.name))
                if self._expand_blocks:
                    self._open(layer, prefix + layer.name)

    def _open(self, block: Any, path: str) -> None:
        """Rows for the parts of a composite layer, recursively."""
        for part in block._flatten_layers(include_self=False, recursive=False):
            if not any(part is seen for seen, _ in self._walk):
                self._walk.append((part, f"{path}/{part.name}"))
                self._open(part, f"{path}/{part.name}")

    def owner(self) -> Optional[LayerCalls]:
        """The row the running work belongs to, or None outside every row."""
        for row in reversed(self._stack):
            if row is not None:
                return row
        return None

    def __enter__(self) -> "CallTracer":
        for layer, path in self._walk:
            row = None if path is None else LayerCalls(layer, path, remat=_remat(layer))
            mode = getattr(layer, "_remat_mode", None)
            token = wrap_call(layer, lambda original, layer=layer, row=row:
                              self._wrap(layer, original, row))
            self._wrapped.append((token, mode))
            if self._no_remat and mode is not None:
                object.__setattr__(layer, "_remat_mode", None)
        return self

    def __exit__(self, *exc: Any) -> None:
        for token, mode in reversed(self._wrapped):
            unwrap_call(token)  # gives back MemWatch's own, during a fit
            if self._no_remat and mode is not None:
                object.__setattr__(token[0], "_remat_mode", mode)
        self._wrapped = []
        self._stack = []

    def _wrap(self, layer: Any, original: Callable, row: Optional[LayerCalls]
              ) -> Callable:
        tracer = self

        def call(*args: Any, **kwargs: Any) -> Any:
            owner = tracer.owner()
            # A row layer called inside another row layer is part of it,
            # unless it is a part of an opened block.
            mine = (row if owner is None or (
                row is not None and row.path.startswith(owner.path + "/"))
                else None)
            if mine is not None and id(layer) not in tracer.rows:
                tracer.rows[id(layer)] = mine
                tracer.order.append(mine)
            tracer._stack.append(mine)
            if mine is not None and tracer._on_enter is not None:
                tracer._on_enter(mine)
            try:
                outputs = original(*args, **kwargs)
            finally:
                tracer._stack.pop()
            if mine is not None:
                mine.outputs.append(list(signature(outputs) or ()))
                if tracer._on_exit is not None:
                    tracer._on_exit(mine, outputs)
            return outputs

        return call

