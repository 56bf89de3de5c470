"""The user's sample batch, grown to any size, and steps trained on it as
`fit` trains them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any


def _as_array(value: Any) -> Any:
    """`value` as a NumPy array of at least one dimension."""
    import numpy as np

    if isinstance(value, np.ndarray):
        array = value
    elif hasattr(value, "shape") and hasattr(value, "dtype"):
        import keras

        array = keras.ops.convert_to_numpy(value)
    else:
        array = np.asarray(value)
    if array.ndim < 1 or array.dtype == object:
        raise TypeError(
            "Expected `x` and `y` to be arrays (or nested lists/dicts of arrays) "
            "holding a sample batch, not a dataset or generator. Received: "
            f"{type(value).__name__}")
    return array


class Batches:
    """A sample batch, repeated along axis 0 to any batch size.

    Args:
        x: the inputs: arrays, or lists/dicts of arrays.
        y: the matching targets, or `None`.

    Raises:
        TypeError: for `x` or `y` that are not arrays.
        ValueError: for arrays of unequal length, or empty ones.
    """

    def __init__(self, x: Any, y: Any):
        import keras
        import numpy as np

        self.x = keras.tree.map_structure(_as_array, x)
        self.y = None if y is None else keras.tree.map_structure(_as_array, y)
        leaves = keras.tree.flatten(self.x) + (
            [] if self.y is None else keras.tree.flatten(self.y))
        sizes = {int(a.shape[0]) for a in leaves}
        if len(sizes) != 1 or 0 in sizes:
            raise ValueError(
                "Expected every array of `x` and `y` to hold the same, non-zero "
                f"number of samples. Received: {sorted(sizes)}")
        self.n = sizes.pop()
        #: Bytes of one sample of the inputs and targets together.
        self.bytes_per_sample = sum(
            int(a.itemsize) * int(np.prod(a.shape[1:], dtype=np.int64))
            for a in leaves)

    def take(self, size: int) -> tuple[Any, Any]:
        """`(x, y)` of `size` samples, the sample batch repeated as needed."""
        import keras
        import numpy as np

        n = self.n

        def take(a: Any) -> Any:
            if size <= n:
                return a[:size]
            return np.take(a, np.arange(size) % n, axis=0)

        return (keras.tree.map_structure(take, self.x),
                None if self.y is None else keras.tree.map_structure(take, self.y))


def fit_steps(model: Any, batch: tuple[Any, Any], steps: int,
              callbacks: Sequence[Any] = ()) -> None:
    """Trains `steps` steps on `batch` through Keras's own `fit`, with
    `callbacks`, and waits for them (`wait_for_steps`): a step that ran out
    of memory raises here.

    `fit` packs array batches as `(x, y)` (or `(x,)`), which a custom
    `train_step` unpacks, and runs the step function it compiles for them;
    `train_on_batch` packs `(x, y, None)` and compiles another. The base
    class's `fit` is called, so that a model overriding it (keras-hub's
    tasks build a `tf.data` pipeline there) trains the same step on plain
    arrays.
    """
    import keras

    x, y = batch
    size = keras.tree.flatten(x)[0].shape[0]
    if steps > 1:
        x, y = Batches(x, y).take(size * steps)
    with _quiet_retracing():
        keras.Model.fit(model, x, y, batch_size=size, epochs=1, shuffle=False,
                        verbose=0, callbacks=list(callbacks))
    wait_for_steps(model)


def wait_for_steps(model: Any) -> None:
    """Waits for the steps that made the model's weights, and raises what
    they raised.

    JAX runs steps asynchronously: an allocation that fails inside a step
    surfaces only when its results are awaited, and `fit` returns without
    awaiting them when no callback needs its logs as numbers. The other
    backends raise within the step.
    """
    import keras

    if keras.backend.backend() == "jax":
        import jax

        jax.block_until_ready([v.value for v in model.trainable_variables])


@contextlib.contextmanager
def _quiet_retracing() -> Iterator[None]:
    """TensorFlow's logger at ERROR: it warns of a function traced again for
    each new shape, and every size measured is a new shape on purpose."""
    import keras

    if keras.backend.backend() != "tensorflow":
        yield
        return
    quiet = logging.getLogger("tensorflow")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        quiet.setLevel(level)


def repeated(x: Any, y: Any, steps: int) -> Any:
    """A `keras.utils.PyDataset` of `steps` batches, each `(x, y)` (or `(x,)`
    where `y` is None, as Keras packs arrays): a job's epoch as the device
    meets it, for the host memory of one batch."""
    import keras

    class Repeated(keras.utils.PyDataset):
        def __len__(self) -> int:
            return steps

        def __getitem__(self, index: int) -> Any:
            return (x,) if y is None else (x, y)

    return Repeated()
