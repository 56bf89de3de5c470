"""MemWatch's batch hooks for one fit: the hot path.

Keras calls them at every batch, so they are built once per fit as closures
over exactly what they touch, and installed on the callback for the length
of the fit (`install`, `remove`): Keras then calls them directly, with no
dispatch in between.

- A batch-end hook reads the probes and hands the raw readings to the
  pipeline, in the order read, with the batch's key; it fills Keras's logs
  for training batches. Nothing else: the pipeline's thread judges, records
  and streams.
- Where batch-end hooks run on Keras's worker threads (`async_safe`), the
  batch-begin hook, on the training thread, announces each sampled batch in
  batch order (the pipeline's `Sequencer` pairs it with a read) and names
  the batch XLA's planner sees. Otherwise batch-end hooks run in order and
  the begin hook does nothing.
- On the training thread, a hook does the chores: it drains the pipeline
  when its thread fell behind, and calls `on_spike` with the spikes found.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any, Callable, Optional

#: The callback's methods these hooks stand in for during a fit.
NAMES = ("on_train_batch_begin", "on_train_batch_end",
         "on_test_batch_begin", "on_test_batch_end")


def batch_hooks(watch: Any, read: Callable[[], list],
                figures: Optional[Callable[[tuple, list, dict], None]],
                plans: Optional[Callable[[Optional[tuple]], None]],
                every_n: int, steps_per_execution: int,
                in_order: bool) -> dict[str, Callable]:
    """The fit's batch hooks, by the name of the method each stands in for.

    Args:
        watch: the started `MemWatch`: its pipeline and lock, `_training`,
            `_epoch`, and its `_chores` and `_fault`.
        read: reads every probe (`Sampler.read`).
        figures: puts a training batch's figures into Keras's logs from its
            raw read, or `None`.
        plans: names the training batch whose step runs next (XLA's
            planner), or `None`.
        every_n: sample every n-th batch.
        steps_per_execution: batches one call of the train function runs
            (a hook sees only the last).
        in_order: whether Keras runs the batch-end hooks in order on the
            training thread.
    """
    pipe, lock = watch._pipe, watch._lock
    pending, expect, wake = pipe.pending, pipe.expect, pipe.wake
    block, overdue = pipe.block, pipe.overdue_at
    chores, fault = watch._chores, watch._fault
    spe = steps_per_execution
    every = every_n == 1 and spe == 1

    def due(last: int) -> bool:
        """Whether the execution that ends at batch `last` covers an n-th batch."""
        return (last + 1) // every_n > (last + 1 - spe) // every_n

    def end_hook(phase: str, logs_figures: Optional[Callable]) -> Callable:
        def on_batch_end(batch: int, logs: Optional[dict] = None) -> None:
            if not watch._training:
                return
            try:
                if in_order and (len(pending) >= overdue or pipe.events):
                    chores()
                if every or due(batch):
                    key = (phase, watch._epoch, batch)
                    with lock:  # appended in the order read
                        raw = read()
                        pending.append((key, perf_counter(), raw))
                    if len(pending) >= block:
                        wake()
                    if logs_figures is not None and logs is not None:
                        logs_figures(key, raw, logs)
            except Exception as e:
                fault("on_batch_end", e)

        return on_batch_end

    def begin_hook(phase: str, name_step: Optional[Callable]) -> Callable:
        def on_batch_begin(batch: int, logs: Optional[dict] = None) -> None:
            if not watch._training:
                return
            try:
                if len(pending) >= overdue or pipe.events:
                    chores()
                last = batch + spe - 1
                key = (phase, watch._epoch, last) if every or due(last) else None
                if key is not None:
                    expect(key)
                if name_step is not None:
                    name_step(key)
            except Exception as e:
                fault("on_batch_begin", e)

        return on_batch_begin

    hooks = {"on_train_batch_end": end_hook("train", figures),
             "on_test_batch_end": end_hook("test", None)}
    if in_order:
        hooks["on_train_batch_begin"] = hooks["on_test_batch_begin"] = _nothing
    else:
        hooks["on_train_batch_begin"] = begin_hook("train", plans)
        hooks["on_test_batch_begin"] = begin_hook("test", None)
    return hooks


def _nothing(batch: int, logs: Optional[dict] = None) -> None:
    """A batch-begin hook where batch-end hooks run in order."""


def install(callback: Any, hooks: dict[str, Callable]) -> None:
    """Puts the hooks on the callback, in front of its methods."""
    vars(callback).update(hooks)


def remove(callback: Any) -> None:
    """Takes the hooks off: the callback's own methods answer again."""
    for name in NAMES:
        vars(callback).pop(name, None)
