"""PyTorch: the bytes each layer keeps for the backward pass, measured.

Keras's PyTorch backend runs eagerly, so autograd sees every tensor a
forward pass saves for the backward pass. While a step runs under
`torch.autograd.graph.saved_tensors_hooks`, each saved tensor is charged
to the layer that made it (whose call returned it), as XLA's plan charges
a buffer to the name scope that made it (`jax_plan`); a tensor that is no
layer's output (an intermediate of a layer's call, the batch) is charged
to the layer running when it was saved (`CallTracer.owner`). Its
storage's bytes count once per storage (a tensor saved twice, or two
views of one storage, count once), the model's own variables excluded
(they are the weights, not activations). Tensors saved while the model's
`compute_loss` runs are the loss's, whoever made them (the logits); others
saved outside every layer that no layer made are counted apart. The loss row also holds the model's outputs (the logits: the
step holds them to its end, for the metrics) where no layer saved them,
and the gradient the loss's backward pass makes of them: the largest
bytes of gradients in and out of one of the loss's autograd nodes (a
node hook on each node between the loss and the model's outputs). The
counts are exact on any device.

On a CUDA device the allocator also measures each layer's passes. Its
forward pass: bytes allocated at its end minus at its start. Its backward
pass: from the moment the gradient of its outputs is ready (a tensor hook)
to the moment the next layer's is, the allocator's peak less what was
allocated at the start; in a chain of layers that is exactly the layer's
backward, where branches run side by side the work between two hooks is
charged to the layer whose hook came first. The peaks are reset at each
hook; the largest seen is kept (`SavedBytes.peak`).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable, Optional

from keras_memwatch.explain.layers.calls import CallTracer, LayerCalls

__all__ = ["SavedBytes", "measure_saved"]

_LOSS_KEY = -1  # the loss's backward pass, among the layers' `id`s


@dataclasses.dataclass
class SavedBytes:
    """What one PyTorch step kept for its backward pass.

    Attributes:
        rows: the rows in call order (`CallTracer.order`).
        saved: row's `id(layer)` -> bytes saved while it ran.
        outside: bytes saved outside every row (the loss and metrics).
        forward: row's `id(layer)` -> bytes its forward pass left allocated
            on a CUDA device (empty elsewhere).
        backward: row's `id(layer)` -> the peak of its backward pass less
            what was allocated as it began, on a CUDA device (empty
            elsewhere).
        peak: the allocator's largest peak across the resets, or None.
        loss_saved: bytes saved while the model's `compute_loss` ran.
        outputs_held: bytes of the model's outputs (as the loss received
            them) that no saved tensor holds already.
        loss_grad: the largest bytes of gradients in and out of one of the
            loss's autograd nodes, or None where no loss ran.
        outputs: the `(shape, dtype)` of the outputs the loss received.
        loss_forward: on a CUDA device, the bytes the loss's call left
            allocated (what it keeps, its scalar); None elsewhere.
        loss_backward: on a CUDA device, the allocator's peak from the
            start of the backward pass to the start of the first layer's,
            less what was allocated as it began; None elsewhere.
    """

    rows: list[LayerCalls]
    saved: dict[int, int]
    outside: int
    forward: dict[int, int]
    backward: dict[int, int] = dataclasses.field(default_factory=dict)
    peak: Optional[int] = None
    loss_saved: int = 0
    outputs_held: int = 0
    loss_grad: Optional[int] = None
    outputs: tuple = ()
    loss_backward: Optional[int] = None
    loss_forward: Optional[int] = None


def _storage(tensor: Any) -> tuple[int, int]:
    """`(data pointer, bytes)` of a tensor's storage; `(0, 0)` where it has
    none a pointer can name (a meta or sparse tensor)."""
    try:
        storage = tensor.untyped_storage()
        return int(storage.data_ptr()), int(storage.nbytes())
    except Exception:
        return 0, 0


def _tensors(tree: Any) -> list[Any]:
    import keras
    import torch

    return [t for t in keras.tree.flatten(tree) if isinstance(t, torch.Tensor)]


def _nbytes(tensors: Any) -> int:
    """Bytes of the distinct storages among `tensors` (None skipped)."""
    storages = dict(_storage(t) for t in tensors if t is not None)
    return sum(storages.values())


class _LossWatch:
    """Wraps a model's `compute_loss` on the instance: marks its window,
    and hooks the loss's autograd nodes to measure its backward pass."""

    def __init__(self, model: Any, on_backward: Optional[Callable[[], None]]):
        self.model, self.running, self.grad = model, False, None
        self.on_backward = on_backward
        self.y_pred: list[Any] = []
        self.forward: Optional[int] = None  # CUDA: allocated by its call
        self._before = vars(model).get("compute_loss")

    def __enter__(self) -> "_LossWatch":
        original = self.model.compute_loss

        def compute_loss(*args: Any, **kwargs: Any) -> Any:
            import torch

            y_pred = kwargs.get("y_pred", args[2] if len(args) > 2 else None)
            start = torch.cuda.memory_allocated() if torch.cuda.is_available() else None
            self.running = True
            try:
                loss = original(*args, **kwargs)
            finally:
                self.running = False
            if start is not None:
                self.forward = torch.cuda.memory_allocated() - start
            self.y_pred = _tensors(y_pred)
            self._hook(loss)
            return loss

        object.__setattr__(self.model, "compute_loss", compute_loss)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._before is not None:
            object.__setattr__(self.model, "compute_loss", self._before)
        else:
            object.__delattr__(self.model, "compute_loss")

    def _hook(self, loss: Any) -> None:
        """Hooks each node between the loss and the model's outputs."""
        stops = {t.grad_fn for t in self.y_pred if t.grad_fn is not None}
        todo = [loss.grad_fn] if getattr(loss, "grad_fn", None) is not None else []
        done: set[int] = set()
        while todo:
            node = todo.pop()
            if node is None or id(node) in done or node in stops:
                continue
            done.add(id(node))
            if type(node).__name__ == "AccumulateGrad":
                continue
            node.register_hook(self._seen)
            todo.extend(child for child, _ in node.next_functions)
        if done:
            self.grad = 0
            if self.on_backward is not None:
                on_backward = self.on_backward
                loss.register_hook(lambda grad: on_backward())

    def _seen(self, grad_inputs: Any, grad_outputs: Any) -> None:
        size = _nbytes(list(grad_inputs) + list(grad_outputs))
        self.grad = max(self.grad or 0, size)


def _wrap_update(optimizer: Any, begin: Callable[[], None],
                 end: Callable[[], None]) -> Callable[[], None]:
    """Wraps `optimizer.apply` on the instance; returns what undoes it."""
    before = vars(optimizer).get("apply")
    original = optimizer.apply

    def apply(*args: Any, **kwargs: Any) -> Any:
        begin()
        try:
            return original(*args, **kwargs)
        finally:
            end()

    object.__setattr__(optimizer, "apply", apply)

    def undo() -> None:
        if before is not None:
            object.__setattr__(optimizer, "apply", before)
        else:
            object.__delattr__(optimizer, "apply")

    return undo


def measure_saved(model: Any, run: Callable[[], None],
                  expand_nested: bool = True,
                  at_backward: Optional[Callable[[], None]] = None,
                  expand_blocks: bool = False,
                  at_update: Optional[tuple[Callable[[], None],
                                            Callable[[], None]]] = None
                  ) -> SavedBytes:
    """Runs `run()` (a step or a forward pass of `model`) and counts the
    bytes autograd saves, per row.

    Args:
        model: a built Keras model on the PyTorch backend.
        run: what to run, once.
        expand_nested: rows for the layers of nested models. Defaults to
            `True`.
        at_backward: called once, as the backward pass first reads a saved
            tensor (when the forward pass holds all it saved). Defaults to
            `None`.
        expand_blocks: rows for the parts of composite layers
            (`CallTracer`). Defaults to `False`.
        at_update: `(begin, end)`, called as the optimizer's `apply` begins
            and ends (the last layer's backward pass ends as it begins).
            Defaults to `None`.
    """
    import keras
    import torch

    weights = {_storage(v.value)[0] for v in model.variables}
    seen: set[int] = set()
    saved: dict[int, int] = {}
    outside = [0]
    cuda = torch.cuda.is_available()
    forward: dict[int, int] = {}
    started: dict[int, int] = {}

    def enter(row: LayerCalls) -> None:
        if cuda:
            started[id(row.layer)] = torch.cuda.memory_allocated()

    backward: dict[int, int] = {}
    # The layer whose backward pass runs, what was allocated as it began, and
    # the largest peak so far.
    window: list[Any] = [None, 0, None]

    def close() -> None:
        """Ends the running backward pass: charges its peak to its layer."""
        peak = torch.cuda.max_memory_allocated()
        key, start, most = window
        if key is not None:
            backward[key] = backward.get(key, 0) + max(peak - start, 0)
        window[2] = peak if most is None else max(most, peak)

    def gradient_ready(key: int) -> None:
        close()
        torch.cuda.reset_peak_memory_stats()
        window[0], window[1] = key, torch.cuda.memory_allocated()

    # an output's storage -> the row that made it, and the output: once the
    # output is freed, a later tensor may take its storage's address
    made: dict[int, tuple[LayerCalls, Any]] = {}

    def maker(pointer: int) -> Optional[LayerCalls]:
        row, output = made.get(pointer, (None, lambda: None))
        return row if output() is not None else None

    def leave(row: LayerCalls, outputs: Any) -> None:
        for t in keras.tree.flatten(outputs):
            if isinstance(t, torch.Tensor):
                pointer = _storage(t)[0]
                if maker(pointer) is None:
                    made[pointer] = (row, weakref.ref(t))
        if cuda:
            key = id(row.layer)
            delta = torch.cuda.memory_allocated() - started.pop(key)
            forward[key] = forward.get(key, 0) + delta
            for t in keras.tree.flatten(outputs):
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(lambda grad, key=key: gradient_ready(key))

    tracer = CallTracer(model, expand_nested, on_enter=enter, on_exit=leave,
                        expand_blocks=expand_blocks)
    # The loss's backward pass runs from its gradient to a layer's.
    loss = _LossWatch(model, (lambda: gradient_ready(_LOSS_KEY)) if cuda else None)
    loss_saved = [0]

    def pack(tensor: Any) -> Any:
        pointer, size = _storage(tensor)
        if pointer and pointer not in seen and pointer not in weights:
            seen.add(pointer)
            row: Optional[LayerCalls] = (None if loss.running else
                                         maker(pointer) or tracer.owner())
            if row is None:
                outside[0] += size
                if loss.running:
                    loss_saved[0] += size
            else:
                saved[id(row.layer)] = saved.get(id(row.layer), 0) + size
        return tensor

    first_unpack = [at_backward]

    def unpack(tensor: Any) -> Any:
        if first_unpack[0] is not None:
            first_unpack[0], call = None, first_unpack[0]
            call()
        return tensor

    def update_begins() -> None:
        if cuda:
            close()
            window[0] = None
        if at_update is not None:
            at_update[0]()

    def update_ends() -> None:
        if at_update is not None:
            at_update[1]()

    undo = (_wrap_update(model.optimizer, update_begins, update_ends)
            if getattr(model, "optimizer", None) is not None else None)
    try:
        with tracer, loss, torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            run()
    finally:
        if undo is not None:
            undo()
    if cuda:
        close()
    from keras_memwatch.call_wrapping import signature

    held = {_storage(t) for t in loss.y_pred}
    return SavedBytes(
        tracer.order, saved, outside[0], forward, backward, window[2],
        loss_backward=backward.pop(_LOSS_KEY, None),
        loss_saved=loss_saved[0],
        outputs_held=sum(size for pointer, size in held if pointer not in seen),
        loss_grad=loss.grad, outputs=signature(loss.y_pred) or (),
        loss_forward=loss.forward)
