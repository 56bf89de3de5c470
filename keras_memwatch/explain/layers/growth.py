"""Which layer's activations grew most where the input's shape grew.

From shapes alone (`trace_step`): the model is called symbolically at
both input shapes, so nothing runs and no device memory is taken. The loss
is a candidate too (`LOSS`: the model's outputs, what the loss keeps of
them and their gradient, as `shapes_loss_row` counts them): on a language
model whose sequences grow, the logits usually grow most.
`SpikeLayers` answers it during a fit, for a spike whose batch had another
input shape than most batches.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Optional

from keras_memwatch.explain.layers.shapes import trace_step
from keras_memwatch.explain.layers.steps import shapes_activations, shapes_loss_row
from keras_memwatch.explain.layers.table import LOSS
from keras_memwatch.units import format_bytes

__all__ = ["Growth", "SpikeLayers", "growth"]

logger = logging.getLogger("keras_memwatch")


@dataclasses.dataclass(frozen=True)
class Growth:
    """The layer whose activations grew most from one input to another.

    Attributes:
        layer: its name, prefixed by the nested models it sits in.
        before_bytes, after_bytes: its outputs' bytes at each input.
        before_shape, after_shape: the shape of each input (its first
            tensor).
    """

    layer: str
    before_bytes: int
    after_bytes: int
    before_shape: tuple
    after_shape: tuple

    @property
    def message(self) -> str:
        """"the activations of dense grew most: 8.0 MiB -> 128 MiB (from shapes)"."""
        what = ("the loss's logits and their gradient" if self.layer == LOSS
                else f"the activations of {self.layer}")
        return (f"{what} grew most: "
                f"{format_bytes(self.before_bytes)} -> "
                f"{format_bytes(self.after_bytes)} (from shapes)")


def growth(model: Any, before: Any, after: Any, expand_nested: bool = True
           ) -> Optional[Growth]:
    """The layer (or the loss, `LOSS`) whose bytes grew most from input
    `before` to input `after` (each as `keras.KerasTensor`s); None where
    none grew."""
    import keras

    was, now = _bytes(model, before, expand_nested), _bytes(model, after, expand_nested)
    if not now:
        return None
    name = max(now, key=lambda p: now[p] - was.get(p, 0))
    if now[name] <= was.get(name, 0):
        return None

    def shape(spec: Any) -> tuple:
        return tuple(keras.tree.flatten(spec)[0].shape)

    return Growth(name, was.get(name, 0), now[name], shape(before), shape(after))


def _bytes(model: Any, spec: Any, expand_nested: bool) -> dict[str, int]:
    """Each row's outputs' bytes and the loss row's, by path."""
    rows, outputs = trace_step(model, spec, expand_nested)
    activations = shapes_activations(rows, outputs)
    out = {r.path: activations[id(r.layer)] for r in rows}
    if outputs:
        loss = shapes_loss_row(outputs)
        out[LOSS] = loss.activation_bytes + loss.grad_bytes
    return out


class SpikeLayers:
    """Names the layer behind a spike whose batch had an unusual input shape.

    Args:
        model: gives the model being fit, its variables in place (a
            callback's `model`: under JAX, Keras keeps their values out of
            the model until an epoch ends, and puts them back for it).
        shapes: its `BatchShapes`, noting each batch's signature.
        alert: log each pair of shapes the first time it is named.
    """

    def __init__(self, model: Callable[[], Any], shapes: Any, alert: bool = True
                 ) -> None:
        self.model, self.shapes, self.alert = model, shapes, alert
        self._known: dict[tuple[int, int], Optional[Growth]] = {}

    def layer_of(self, event: Any) -> Optional[Growth]:
        """The layer that grew most from the usual input to the spike's
        batch's; None where the batch's input was the usual one or is not
        known. The first time a pair of shapes is named, it is logged."""
        shapes = self.shapes
        if not shapes.per_batch:
            return None
        usual, mine = shapes.usual, shapes.of((event.phase, event.epoch, event.batch))
        if usual is None or mine is None or mine == usual:
            return None
        pair = (usual, mine)
        if pair in self._known:
            return self._known[pair]
        shapes.quiet = True
        try:
            found = self._known[pair] = growth(self.model(), shapes.seen[usual][0],
                                               shapes.seen[mine][0])
        finally:
            shapes.quiet = False
        if found is not None and self.alert:
            logger.warning("memory spike at %s came with input shape %s, where "
                           "most batches had %s: %s", event.where,
                           found.after_shape, found.before_shape, found.message)
        return found
