"""XLA's memory plan of the train step Keras compiles on the JAX backend.

XLA plans every buffer of a compiled program ahead of time, so the device
memory a train step needs can be read without running it:
`jax.jit(step).lower(state, batch).compile().memory_analysis()`. Compiling
for a batch that does not fit is harmless, and on a GPU it is the only way
to know what fits: where the plan would exceed the device's memory, XLA
*rematerializes* (recomputes activations in the backward pass instead of
keeping them), so the memory needed stops growing linearly with the batch
well before the step runs out of memory.

This module imports no framework until a function runs.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

#: The batches a `fit` on an accelerator holds on the device beside the
#: running step's own: Keras's JAX loop sends the next batch ahead and,
#: dispatching asynchronously, runs ahead of the device, each step
#: dispatched holding its batch until it runs. The count seen, and why 16,
#: are in docs/capacity.md (`benchmarks/gpu/in_flight.py` measures it).
BATCHES_AHEAD = 16


def jitted_step(function: Any) -> Optional[Any]:
    """The jitted step inside a Keras step function (`model.train_function`),
    or None where there is none (eager, or Keras internals moved)."""
    for cell in getattr(function, "__closure__", None) or ():
        try:
            candidate = cell.cell_contents
        except ValueError:
            continue
        if hasattr(candidate, "lower"):
            return candidate
    return None


def jitted_train_step(model: Any) -> Any:
    """The jitted train step `fit` runs (made as `fit` makes it, where the
    model has none yet), else an equal one: a step compiled through it is
    in JAX's cache when `fit` runs at that size."""
    import jax

    if getattr(model, "train_function", None) is None and hasattr(
            model, "make_train_function"):
        model.make_train_function()
    found = jitted_step(getattr(model, "train_function", None))
    return found if found is not None else jax.jit(model.train_step, donate_argnums=0)


def planned_bytes(compiled: Any) -> int:
    """Device bytes a compiled program needs: arguments + outputs - aliased
    (donated) + temporaries, per device.

    Raises:
        RuntimeError: when XLA gives no memory analysis.
    """
    analysis = compiled.memory_analysis()
    if analysis is None:
        raise RuntimeError("XLA gives no memory analysis for this compiled step")
    return int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes
               - analysis.alias_size_in_bytes + analysis.temp_size_in_bytes)


def device_bytes(array: Any) -> int:
    """Bytes of one device's shard of an array (or `ShapeDtypeStruct`)."""
    shape = tuple(array.shape)
    sharding = getattr(array, "sharding", None)
    if sharding is not None:
        shape = tuple(sharding.shard_shape(shape))
    return math.prod(shape) * array.dtype.itemsize


def batch_spec(batch: tuple[Any, Any], size: int) -> tuple[Any, ...]:
    """The batch as `fit` passes it to the train step, `(x, y)` or `(x,)`
    (as Keras packs arrays without sample weights), in shapes and dtypes
    only, with `size` samples. Packed any other way (`(x, y, None)`), the
    step lowered here is another program to JAX, and `fit` compiles it
    again (seconds on a GPU)."""
    import jax
    import keras

    def spec(a: Any) -> Any:
        return None if a is None else jax.ShapeDtypeStruct(
            (size,) + tuple(a.shape[1:]), a.dtype)

    x, y = batch
    x = keras.tree.map_structure(spec, x)
    return (x,) if y is None else (x, keras.tree.map_structure(spec, y))


def batch_bytes(batch: tuple[Any, Any], size: int) -> int:
    """Bytes of `size` samples of `batch` (inputs and targets)."""
    import keras

    leaves = [a for a in keras.tree.flatten(batch) if a is not None]
    return sum(size * math.prod(a.shape[1:]) * a.dtype.itemsize for a in leaves)


def training_state(model: Any) -> tuple[list, list, list, list]:
    """The state Keras's JAX train step takes, shaped as Keras passes it (a
    tuple of four lists), so a step lowered with it is the step `fit`
    compiles and finds in JAX's cache."""
    return (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in model.optimizer.variables],
        [v.value for v in model.metrics_variables],
    )


def lower_step(model: Any, batch: tuple[Any, Any], size: int,
               batches_ahead: int = BATCHES_AHEAD) -> tuple[Any, int, int]:
    """The train step on `size` samples, traced and lowered, not compiled.

    Returns:
        `(lowered, state_bytes, ahead_bytes)`: the lowered step, the bytes
        of the training state, and the `batches_ahead` batches a `fit`
        holds ahead of it on an accelerator (see `working_bytes`).
    """
    import jax

    state = training_state(model)
    lowered = jitted_train_step(model).lower(state, batch_spec(batch, size))
    state_bytes = sum(int(leaf.nbytes) for leaf in jax.tree_util.tree_leaves(state))
    # Keras's JAX trainer sends batches ahead only to an accelerator.
    ahead = (0 if jax.default_backend() == "cpu"
             else batches_ahead * batch_bytes(batch, size))
    return lowered, state_bytes, ahead


def compiled_working_bytes(lowered: Any, state_bytes: int, ahead: int,
                           compiler_options: Optional[dict[str, Any]] = None) -> int:
    """Compiles a step from `lower_step` and returns its working bytes."""
    compiled = (lowered.compile(compiler_options=compiler_options) if compiler_options
                else lowered.compile())
    return max(int(planned_bytes(compiled)) - state_bytes, 0) + ahead


def working_bytes(model: Any, batch: tuple[Any, Any], size: int,
                  compiler_options: Optional[dict[str, Any]] = None) -> int:
    """Device bytes a `fit` step on `size` samples needs beyond the training
    state: the compiled plan (arguments + outputs - donated + temporaries)
    less the state, which is in memory already, plus the `BATCHES_AHEAD`
    batches a `fit` holds ahead of the step on an accelerator. Compiles the
    step for that shape; runs nothing.

    Args:
        model: a compiled Keras model, built, on the JAX backend.
        batch: `(x, y)` arrays with at least one sample; only their shapes
            past the first axis and their dtypes are used.
        size: the batch size to plan for.
        compiler_options: XLA options of the compilation (`fit` compiles
            with none).
    """
    return compiled_working_bytes(*lower_step(model, batch, size), compiler_options)


def largest_that_fits(fits: Callable[[int], bool], start: int, max_checks: int,
                      factor: float = 1.25, resolution: float = 0.01,
                      ) -> tuple[Optional[int], Optional[int]]:
    """The largest size for which `fits` holds, searched from `start`.

    Checks `start` and its neighbour `resolution` away (up when `start`
    fits, down when not), steps on by `factor` until the answer changes,
    then bisects until the bracket is within `resolution` of its upper
    end, calling `fits` at most `max_checks` times. Where `start` is right
    to within `resolution`, two checks settle it.

    Returns:
        `(largest size that fits, smallest size found not to)`; either is
        `None` when the checks ran out before one was found.
    """
    lo: Optional[int] = None
    hi: Optional[int] = None
    checks = 0

    def check(size: int) -> bool:
        nonlocal checks, lo, hi
        checks += 1
        if fits(size):
            lo = size if lo is None else max(lo, size)
            return True
        hi = size if hi is None else min(hi, size)
        return False

    size = max(int(start), 1)
    step = max(1, int(resolution * size))
    if check(size):
        if checks < max_checks:
            check(size + step)
    elif size > 1 and checks < max_checks:
        check(max(size - step, 1))
    while (lo is None or hi is None) and checks < max_checks:
        if lo is None:
            if hi == 1:
                break
            size = max(int(hi / factor), 1)
        else:
            size = max(int(math.ceil(lo * factor)), lo + 1)
        check(size)
    while (lo is not None and hi is not None and hi - lo > max(1, resolution * hi)
           and checks < max_checks):
        check((lo + hi) // 2)
    return lo, hi
