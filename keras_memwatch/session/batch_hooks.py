"""MemWatch's batch hooks for one call of `fit`, `evaluate` or `predict`:
the hot path.

Keras calls them at every batch, so they are built once per call as
closures over exactly what they touch, and installed on the callback for
the length of the call (`install`, `remove`): Keras then calls them
directly, with no dispatch in between.

- A batch-end hook reads the probes and hands the raw readings to the
  pipeline, in the order read, with the batch's key; it fills Keras's logs
  (`LogsFigures`). Nothing else: the pipeline's thread judges, records and
  streams.
- Where batch-end hooks run on Keras's worker threads (`async_safe`), the
  batch-begin hook, on the training thread, announces each sampled batch in
  batch order (the pipeline's `Sequencer` pairs it with a read) and names
  the training batch XLA's planner sees. Otherwise batch-end hooks run in
  order and the begin hook does nothing.
- On the training thread, a hook catches up when the call is behind: it
  drains the pipeline when its thread fell behind, and delivers the spikes
  found.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any, Callable, Optional, Protocol

from keras_memwatch.record.pipeline import Pipeline
from keras_memwatch.session.logs_figures import LogsFigures

#: The callback's methods these hooks stand in for during a call.
NAMES = ("on_train_batch_begin", "on_train_batch_end",
         "on_test_batch_begin", "on_test_batch_end",
         "on_predict_batch_begin", "on_predict_batch_end")


class CallStatus(Protocol):
    """Where a call stands, as the hooks read it: whether it is recording,
    and its epoch."""

    recording: bool
    epoch: int


def batch_hooks(pipe: Pipeline, status: CallStatus, read: Callable[[], list],
                figures: Optional[LogsFigures],
                plans: Optional[Callable[[Optional[tuple]], None]],
                name_batch: Optional[Callable[[tuple], None]],
                every_n: int, steps_per_execution: int, in_order: bool,
                behind: Callable[[], bool], catch_up: Callable[[], None],
                fault: Callable[[str, Exception], None]) -> dict[str, Callable]:
    """The call's batch hooks, by the name of the method each stands in for.

    Args:
        pipe: the call's started pipeline; the hooks append to its
            `pending`, holding its `lock`.
        status: whether the call is recording, and its epoch.
        read: reads every probe (`Sampler.read`).
        figures: puts each batch's figures into Keras's logs, or `None`.
        plans: names the training batch whose step runs next (XLA's
            planner), or `None`.
        name_batch: names every batch whose step runs next, sampled or
            not, by the key a sample of it would have
            (`BatchShapes.remember_batch`), or `None`.
        every_n: sample every n-th batch.
        steps_per_execution: batches one call of the step function runs
            (a hook sees only the last).
        in_order: whether Keras runs the batch-end hooks in order on the
            training thread.
        behind: whether the call has work for the training thread.
        catch_up: does it, on the training thread: drains the pipeline and
            delivers the spikes found.
        fault: reports a fault of a hook once (`fault(where, error)`);
            training goes on.
    """
    pending, expect, wake, lock = pipe.pending, pipe.expect, pipe.wake, pipe.lock
    block = pipe.block
    figures_of = figures.figures_of if figures is not None else None
    fill_batch = figures.fill_batch if figures is not None else None
    batch_begins = figures.batch_begins if figures is not None else None
    spe = steps_per_execution
    every = every_n == 1 and spe == 1

    def due(last: int) -> bool:
        """Whether the execution that ends at batch `last` covers an n-th batch."""
        return (last + 1) // every_n > (last + 1 - spe) // every_n

    def end_hook(phase: str) -> Callable:
        def on_batch_end(batch: int, logs: Optional[dict] = None) -> None:
            if not status.recording:
                return
            try:
                if in_order and behind():
                    catch_up()
                if every or due(batch):
                    key = (phase, status.epoch, batch)
                    with lock:  # appended in the order read
                        raw = read()
                        read_figures = (figures_of(key, raw)
                                        if figures_of is not None else None)
                        pending.append((key, perf_counter(), raw))
                    if len(pending) >= block:
                        wake()
                    if read_figures is not None and logs is not None:
                        fill_batch(key, read_figures, logs)  # type: ignore[misc]
            except Exception as e:
                fault("on_batch_end", e)

        return on_batch_end

    def begin_hook(phase: str, name_step: Optional[Callable]) -> Callable:
        def on_batch_begin(batch: int, logs: Optional[dict] = None) -> None:
            if not status.recording:
                return
            try:
                if behind():
                    catch_up()
                last = batch + spe - 1
                named = (phase, status.epoch, last)
                if name_batch is not None:
                    name_batch(named)
                key = named if every or due(last) else None
                if key is not None:
                    expect(key)
                    if batch_begins is not None:
                        batch_begins(key)
                if name_step is not None:
                    name_step(key)
            except Exception as e:
                fault("on_batch_begin", e)

        return on_batch_begin

    def name_hook(phase: str) -> Callable:
        def on_batch_begin(batch: int, logs: Optional[dict] = None) -> None:
            if status.recording:
                name_batch((phase, status.epoch, batch + spe - 1))  # type: ignore[misc]

        return on_batch_begin

    hooks = {}
    for phase in ("train", "test", "predict"):
        hooks[f"on_{phase}_batch_end"] = end_hook(phase)
        if not in_order:
            hooks[f"on_{phase}_batch_begin"] = begin_hook(
                phase, plans if phase == "train" else None)
        else:
            hooks[f"on_{phase}_batch_begin"] = (
                _nothing if name_batch is None else name_hook(phase))
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
