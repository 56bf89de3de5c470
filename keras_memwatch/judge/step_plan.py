"""XLA's plan of each training step, read where `fit` compiles anyway (JAX).

JAX cannot reset its allocator's peak, so no source sees the peak of one
step, and the memory in use read at a batch's end jitters by whatever step
is in flight. But XLA plans every buffer of a compiled step ahead of time.
For the length of a fit, `StepPlanner` wraps `model.train_function`: it
notes the input signature (shapes and dtypes) of each batch as Keras draws
it, and the first time a signature appears it reads the compiled step's
memory analysis (arguments + outputs - aliased + temporaries, per device)
right after that step was dispatched, lowering it with the step's own
arrays. `fit` has just compiled that very step, so jit's caches answer
(about a millisecond a signature); every later batch of a known signature
costs a dictionary look-up. Validation steps are not planned.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Hashable, Iterator
from typing import Any, Callable, Optional

from keras_memwatch.judge import xla_plan
from keras_memwatch.columns import HOST_DEVICE

logger = logging.getLogger("keras_memwatch")

_WRAPPED = "_memwatch_unwrapped"  # the attribute holding the original function

#: The name of the plan among a watch's sources.
PLAN_SOURCE = "xla plan"


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """The device memory XLA planned for one training step, per device.

    Attributes:
        total_bytes: arguments + outputs - aliased (donated) + temporaries.
        working_bytes: `total_bytes` less the training state (weights,
            optimizer and metric variables), which is in memory already: what
            the step needs on top of the memory in use before it.
    """

    total_bytes: int
    working_bytes: int


class StepPlanner:
    """Reads XLA's plan of each training step of a JAX `fit`.

    Call `attach` at train begin, `expect(key)` on the training thread before
    each batch (the key names the batch), `take(key)` for the batch's plan,
    and `detach` at the end. Nothing it does raises into training: a plan
    that cannot be read is missing, with one warning.
    """

    def __init__(self) -> None:
        self._model: Any = None
        self._key: Hashable = None
        self._plans: dict[tuple, Optional[StepPlan]] = {}
        self._by_key: dict[Hashable, StepPlan] = {}
        self.seconds = 0.0  # spent reading plans
        #: `(start, end)` perf_counter times of the steps that compiled a new
        #: input shape (the compilation and the step's dispatch).
        self.compilations: list[tuple[float, float]] = []
        self._warned = False

    @property
    def signatures(self) -> int:
        """Distinct input signatures planned so far."""
        return sum(plan is not None for plan in self._plans.values())

    def attach(self, model: Any, on_batch: Optional[Callable[[Any], None]] = None
               ) -> Optional[str]:
        """Wraps the model's train function; returns why it cannot, else None.

        Args:
            model: the Keras model.
            on_batch: called with each batch's inputs (`x`) as Keras draws
                it, on the training thread.
        """
        self.detach()
        function = getattr(model, "train_function", None)
        original = getattr(function, _WRAPPED, function)  # a fit that raised
        jitted = xla_plan.jitted_step(original)
        if jitted is None:
            return ("the train step is not compiled by XLA (run_eagerly=True or "
                    "jit_compile=False), so it has no plan")
        self._plans, self._by_key, self.seconds, self._warned = {}, {}, 0.0, False
        self.compilations = []

        import jax

        plans, by_key = self._plans, self._by_key
        spe = max(int(getattr(model, "steps_per_execution", 1) or 1), 1)
        leaves = jax.tree_util.tree_leaves

        def signature(data: Any) -> Optional[tuple]:
            """Shapes and dtypes of a batch's arrays: what XLA compiles for
            (None, with one warning, where they cannot be read)."""
            try:
                return tuple([(leaf.shape, leaf.dtype) for leaf in leaves(data)])
            except Exception as e:  # never into training
                self._warn(e)
                return None

        # On the training thread every step: a dictionary look-up when the
        # batch's signature is known, the plan read only when it is new.
        def train_function(state: Any, iterator: Iterator) -> Any:
            batches = [next(iterator)] if spe == 1 else _draw(iterator, spe)
            if on_batch is not None:
                try:
                    for data in batches:
                        on_batch(data[0] if isinstance(data, tuple) else data)
                except Exception:  # a layer name is lost, never a step
                    pass
            signatures = [signature(data) for data in batches]
            if None in signatures:
                return original(state, iter(batches))
            if all(sig in plans for sig in signatures):
                logs, state = original(state, iter(batches))
            else:  # XLA compiles a new input shape in this call
                began = time.perf_counter()
                logs, state = original(state, iter(batches))
                self._plan_new(jitted, state, batches, signatures)
                self.compilations.append((began, time.perf_counter()))
            known = [plans[sig] for sig in signatures]
            if known and None not in known:
                # Steps of one execution run one after another: the largest counts.
                by_key[self._key] = max(known, key=_total)
            return logs, state

        setattr(train_function, _WRAPPED, original)
        model.train_function = train_function
        self._model = model
        return None

    def describe(self, not_judged: dict[str, int]) -> str:
        """The plan's note among the sources; `not_judged` counts, per
        device, the samples left unjudged while XLA compiled."""
        note = (f"XLA's plan of each training step, read where fit compiles: "
                f"{self.signatures} input signature(s), {self.seconds:.2f} s in all")
        if not_judged:
            note += ("; not judged while XLA compiled a new input shape (that host "
                     "memory is not a step's): "
                     + ", ".join(f"{d} at {n} step(s)" for d, n in not_judged.items()))
        return note

    def detach(self) -> None:
        """Gives the model its own train function back."""
        model, self._model = self._model, None
        function = getattr(model, "train_function", None)
        if hasattr(function, _WRAPPED):
            model.train_function = getattr(function, _WRAPPED)

    def expect(self, key: Hashable) -> None:
        """Names the batch the next train-function call runs."""
        self._key = key

    def peek(self, key: Hashable) -> Optional[StepPlan]:
        """The plan of the batch named `key` (None when unknown)."""
        return self._by_key.get(key)

    def take(self, key: Hashable) -> Optional[StepPlan]:
        """The plan of the batch named `key` (None when unknown), once."""
        return self._by_key.pop(key, None)

    def _plan_new(self, jitted: Any, state: Any, batches: list,
                  signatures: list) -> None:
        """Reads the plan of each batch whose signature is new."""
        for data, signature in zip(batches, signatures):
            if signature in self._plans:
                continue
            self._plans[signature] = None  # a failure is not tried again
            try:
                self._plans[signature] = self._plan(jitted, state, data)
            except Exception as e:  # never into training
                self._warn(e)

    def _plan(self, jitted: Any, state: Any, data: Any) -> StepPlan:
        import jax

        began = time.perf_counter()
        # The live arrays, not their shapes alone: lowering reads only their
        # shapes, dtypes and shardings, and with them jit's caches answer
        # (with bare shapes XLA would compile the step once more).
        compiled = jitted.lower(state, data).compile()
        total = xla_plan.planned_bytes(compiled)
        state_bytes = sum(xla_plan.device_bytes(leaf)
                          for leaf in jax.tree_util.tree_leaves(state))
        self.seconds += time.perf_counter() - began
        return StepPlan(total, max(total - state_bytes, 0))

    def _warn(self, error: Exception) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("XLA's plan of the train step could not be read (%r); "
                           "plan_bytes is missing for those steps", error)


def _draw(iterator: Iterator, n: int) -> list:
    """Up to `n` batches (the steps of one execution)."""
    batches = []
    for data in iterator:
        batches.append(data)
        if len(batches) == n:
            break
    return batches


def _total(plan: StepPlan) -> int:
    return plan.total_bytes


def attach_planner(model: Any, on_batch: Optional[Callable[[Any], None]] = None
                   ) -> tuple[Optional[StepPlanner], str, tuple[str, ...]]:
    """On the JAX backend, plans the steps of `model`'s fit (and hands each
    batch's inputs to `on_batch`, where given).

    Returns:
        `(planner, note, devices)`: the attached planner (None when there is
        none, and `note` says why), and the devices a step runs on (its GPUs,
        else the host), whose rows carry the plan.
    """
    import keras

    if keras.backend.backend() != "jax":
        return None, "", ()
    planner = StepPlanner()
    try:
        why = planner.attach(model, on_batch)
    except Exception as e:  # Keras internals moved: no plan, training goes on
        why = f"the train step could not be wrapped ({e!r})"
    if why is not None:
        return None, f"unavailable: {why}", ()
    from keras_memwatch.record.probes.jax import local_gpu_names

    return planner, "", local_gpu_names() or (HOST_DEVICE,)
