"""Building a model for training, and putting its training state back."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

from keras_memwatch.variables import unique_variables


def _numpy_copy(variable: Any) -> Any:
    """A host copy of a variable's value."""
    import keras
    import numpy as np

    return np.array(keras.ops.convert_to_numpy(variable.value), copy=True)


def build_for_training(model: Any, batch: tuple[Any, Any]) -> None:
    """Creates every variable a training step needs, without changing any.

    Keras's own `Trainer._symbolic_build` (what `fit` and `train_on_batch`
    run first) builds the model, its compiled metrics and loss, and the
    optimizer's slots, all symbolically. Without it, the model is called
    once on the batch and the optimizer built on the trainable variables.

    Args:
        model: a compiled Keras model.
        batch: `(x, y)`, a batch of one sample.
    """
    x, y = batch
    symbolic = getattr(model, "_symbolic_build", None)
    if callable(symbolic):
        symbolic(data_batch=(x, y, None))
    else:  # pragma: no cover - every Keras 3 trainer has it
        if not model.built:
            model(x)
    optimizer = model.optimizer
    if optimizer is not None and not getattr(optimizer, "built", True):
        optimizer.build(model.trainable_variables)


class ModelState:
    """A copy of a model's whole training state, to put back afterwards.

    The state is every variable of the model (weights and seed-generator
    states), of its optimizer (slots, iteration counter, learning rate,
    loss scale) and of its metrics, copied to host memory, and the global
    dtype policy; on PyTorch also each parameter's `.grad`, which a Keras
    train step leaves filled: moved to host memory until `restore`, so that
    the device does not hold them while steps are measured (Keras's own
    next step frees them first).

    Args:
        model: a compiled and built Keras model.
    """

    def __init__(self, model: Any):
        import keras

        self.model = model
        self.policy = keras.config.dtype_policy()
        self.variables = unique_variables(list(model.variables)
                                          + list(model.optimizer.variables)
                                          + list(model.metrics_variables))
        self.values = [_numpy_copy(v) for v in self.variables]
        self.grads: list[tuple[Any, Any]] = []
        for v in model.trainable_variables:
            tensor = getattr(v, "value", None)
            if hasattr(tensor, "grad") and hasattr(tensor, "requires_grad"):
                grad = tensor.grad
                if grad is not None:
                    grad = (grad.device, grad.detach().to("cpu", copy=True))
                    tensor.grad = None
                self.grads.append((tensor, grad))

    def restore(self) -> None:
        """Puts every value (and `.grad`) copied back into the model, and
        the global dtype policy back."""
        import keras

        keras.config.set_dtype_policy(self.policy)
        for variable, value in zip(self.variables, self.values):
            variable.assign(value)
        for tensor, grad in self.grads:
            tensor.grad = None if grad is None else grad[1].to(grad[0])
        if getattr(self.model, "_jax_state", None) is not None:
            # The JAX trainer keeps the last step's state (what `fit` clears
            # at its end); it would hold a second copy of every variable.
            self.model._jax_state = None
            self.model._jax_state_synced = True


@contextlib.contextmanager
def state_kept(model: Any, batch: Optional[tuple[Any, Any]] = None
               ) -> Iterator[ModelState]:
    """Builds `model` for training on `batch` (where given) and puts its
    whole training state back when the block ends, however it ends.

    Args:
        model: a compiled Keras model.
        batch: `(x, y)`, a batch of one sample; `None` for a built model.

    Yields:
        The `ModelState` copied.
    """
    if batch is not None:
        build_for_training(model, batch)
    state = ModelState(model)
    try:
        yield state
    finally:
        state.restore()
