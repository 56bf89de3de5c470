"""How many batches a JAX `fit` holds ahead of its step, measured.

Keras's JAX loop dispatches steps ahead of the device, and each step
dispatched holds its batch on the device until it runs
(`xla_plan.BATCHES_AHEAD`). How many depends on the model. On an H200, each
model alone in a new process for 300 steps (`benchmarks/in_flight.py
--series`), a ResNet at batch 495 and at 256 held 7 and 8 at most, and a
convnet at 731 held 13: the host ran ahead until something stopped it at a
count of the model's own, within 25 steps, and stayed there (83-94% of the
last 150 batch ends within one batch of it). A block of two attention
layers at 260, whose host dispatched no faster than the device ran, mostly
held none and rose to 16 in bursts (none of the last 150 near it): such a
count wanders, and a short run cannot bound it.

So on an accelerator, where the batches ahead are a part of the answer
that matters, the estimate trains `STEPS` steps at its answer and counts:
where the count settled, the plans count what was seen plus one; where it
wandered, it trains `STEPS` more once, and where it wanders again,
`BATCHES_AHEAD`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any, Callable, Optional

from keras_memwatch.judge import xla_plan
from keras_memwatch.capacity.batches import Batches, repeated
from keras_memwatch.capacity.model_state import ModelState
from keras_memwatch.capacity.result import CapacityEstimate
from keras_memwatch.configure.devices import gpu_index

logger = logging.getLogger("keras_memwatch")

STEPS = 96
#: Runs of `STEPS` before a count is taken to wander: of five runs of a
#: ResNet on an H200, four settled at 7 within 15 steps and one did not.
ATTEMPTS = 2
#: The count settled where this share of the last half's batch ends lie
#: within one batch of the most seen.
SETTLED = 0.5
#: Below this share of the room, the batches ahead move the answer too
#: little to be worth the steps.
MATTERS = 0.01


def batches_held(in_use: Sequence[int], before: int, plan: int,
                 batch_bytes: int) -> list[float]:
    """The batches held beyond the step's plan at each batch end: the device
    memory in use less what was in use before and the plan, in batches (below
    zero where the device was between steps)."""
    return [(b - before - plan) / batch_bytes for b in in_use]


def settled_count(held: Sequence[float]) -> Optional[int]:
    """The batches the plans should count ahead: one more than the most
    held, where the count settled there (`SETTLED`); `None` where it
    wandered, or too few batch ends were seen to say."""
    if len(held) < 8:
        return None
    most = max(held)
    last = held[len(held) // 2:]
    near = sum(h >= most - 1 for h in last) / len(last)
    return max(math.ceil(most), 0) + 1 if near >= SETTLED else None


def measure(model: Any, data: Batches, size: int, plan_bytes: int,
            device_index: int = 0, steps: int = STEPS) -> list[float]:
    """Trains `steps` steps of one batch of `size` with `fit` and returns
    `batches_held` at each batch end. Every variable is put back after.

    Args:
        model: a compiled, built Keras model on the JAX backend.
        data: the sample batch.
        size: the batch size to train.
        plan_bytes: XLA's plan of that step as `fit` compiles it, less the
            training state (`xla_compile.Planner.plan`).
        device_index: the local JAX device trained on.
        steps: steps to train.
    """
    import jax
    import keras

    stats = jax.local_devices()[device_index].memory_stats
    seen: list[int] = []

    class InUse(keras.callbacks.Callback):
        # Read on Keras's worker thread, so that nothing waits for a step.
        async_safe = True

        def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
            seen.append(stats()["bytes_in_use"])

    x, y = data.take(size)
    state = ModelState(model)
    try:
        before = stats()["bytes_in_use"]
        model.fit(repeated(x, y, steps), epochs=1, verbose=0, callbacks=[InUse()])
    finally:
        state.restore()
    return batches_held(seen, before, plan_bytes, xla_plan.batch_bytes((x, y), size))


def recheck(line: CapacityEstimate, checked: CapacityEstimate, model: Any,
            data: Batches, planner: Any,
            check: Callable[[CapacityEstimate], CapacityEstimate],
            progress: Callable[[str], None]) -> CapacityEstimate:
    """The checked estimate, with the batches ahead counted as measured.

    Args:
        line: the line's estimate, before `check`.
        checked: `check(line)`, counting `planner.batches_ahead`.
        model: the model.
        data: the sample batch.
        planner: the `xla_compile.Planner` of `check`; its count ahead is
            set to the one measured.
        check: checks an estimate by compiling (`xla_check.check_compiled`
            with `planner`), reusing its plans.
        progress: receives a line before the steps.

    Returns:
        `checked` where nothing needed measuring; else the estimate
        checked again with the count measured (or `checked`, where the
        count wandered or the steps failed), saying so, with
        `batches_ahead` set.
    """
    size = checked.predicted_batch_size
    assumed = planner.batches_ahead
    if not planner.accelerator or not size:
        return checked
    checked = dataclasses.replace(checked, batches_ahead=assumed)
    assert line.limit_bytes is not None and line.in_use_bytes is not None
    room = line.limit_bytes * (1 - line.headroom) - line.in_use_bytes
    if planner.ahead(size) < MATTERS * room:
        return checked  # before `plan`, which may compile (13-16 s on an H200)
    plan = planner.plan(size)
    if not isinstance(plan, int):
        return checked
    try:
        for attempt in range(ATTEMPTS):
            progress(f"estimate_max_batch_size: training {STEPS} steps at batch "
                     f"{size} to count the batches a fit holds ahead of the step"
                     + (" (again: the count did not settle)" if attempt else ""))
            held = measure(model, data, size, plan,
                           gpu_index(checked.device, "device"))
            count = settled_count(held)
            if count is not None:
                break
    except Exception as e:
        logger.warning("estimate_max_batch_size: the steps that count the batches "
                       "ahead failed (%r); the plans count %d", e, assumed)
        return dataclasses.replace(
            checked, explanation=f"{checked.explanation} The batches a fit holds "
            f"ahead were counted as {assumed}: the steps to measure them failed "
            f"({type(e).__name__}).")
    seen = (f"A fit of batch {size} held at most {max(held, default=0):.0f} batches "
            f"ahead of its step in {len(held)} steps")
    if count is None:
        return dataclasses.replace(
            checked, explanation=f"{checked.explanation} {seen}, in bursts (in "
            f"{attempt + 1} runs), which a short run cannot bound, so the plans "
            f"count {assumed}.")
    if count == assumed:
        return dataclasses.replace(
            checked, explanation=f"{checked.explanation} {seen}, as the plans count.")
    planner.batches_ahead = count
    rechecked = check(line)
    return dataclasses.replace(
        rechecked, batches_ahead=count,
        explanation=f"{rechecked.explanation} {seen} and stayed there, so the "
                    f"plans count {count} (one more), not {assumed}.")
