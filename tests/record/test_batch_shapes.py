"""BatchShapes: the input signatures of a fit, and each batch's."""

import keras
import numpy as np

from keras_memwatch.record import batch_shapes
from keras_memwatch.record.batch_shapes import BatchInputs, BatchShapes


def model():
    inputs = keras.Input((None, 2))
    return keras.Model(inputs, keras.layers.Dense(3)(inputs))


def batch(steps, size=4):
    return np.zeros((size, steps, 2), "float32")


def noted(shapes, batches, phase="train"):
    for i, x in enumerate(batches):
        shapes.batch_begins((phase, 0, i))
        shapes.note(x)


def test_each_batch_has_its_signature_and_the_usual_is_the_most_common():
    shapes = BatchShapes()
    shapes.attach(model(), BatchInputs.PLANNER)
    noted(shapes, [batch(8), batch(64), batch(8), batch(8), batch(64)])
    assert [found for _, found in shapes.seen] == [(((4, 8, 2), "float32"),),
                                                   (((4, 64, 2), "float32"),)]
    assert [shapes.of(("train", 0, i)) for i in range(5)] == [None, 1, 0, 0, 1]
    assert shapes.usual == 0


def test_a_fit_of_one_signature_keeps_no_batches():
    shapes = BatchShapes()
    shapes.attach(model(), BatchInputs.PLANNER)
    noted(shapes, [batch(8)] * 3)
    assert shapes.of(("train", 0, 1)) is None and shapes.usual == 0


def test_steps_of_one_execution_keep_the_largest():
    shapes = BatchShapes()
    shapes.attach(model(), BatchInputs.PLANNER)
    noted(shapes, [batch(8)])
    shapes.batch_begins(("train", 0, 3))  # one execution of three steps
    for steps in (8, 64, 16):
        shapes.note(batch(steps))
    assert shapes.seen[shapes.of(("train", 0, 3))][1] == (((4, 64, 2), "float32"),)


def test_only_the_recent_batches_are_kept(monkeypatch):
    monkeypatch.setattr(batch_shapes, "RECENT", 4)
    shapes = BatchShapes()
    shapes.attach(model(), BatchInputs.PLANNER)
    noted(shapes, [batch(8), batch(64)] * 4)
    assert [shapes.of(("train", 0, i)) for i in range(8)] == [None] * 4 + [0, 1, 0, 1]


def test_calls_are_noted_per_batch_or_at_traces_and_the_model_let_go():
    m = model()
    shapes = BatchShapes()
    shapes.attach(m, BatchInputs.MODEL_CALL)
    shapes.batch_begins(("train", 0, 0))
    m(batch(8))
    shapes.batch_begins(("train", 0, 1))
    m(batch(64))
    assert shapes.of(("train", 0, 1)) == 1 and shapes.per_batch
    shapes.quiet = True
    m(batch(128))  # MemWatch's own symbolic calls are not noted
    assert len(shapes.seen) == 2
    shapes.quiet = False
    shapes.detach()
    assert "call" not in vars(m) and not shapes.per_batch
    shapes.attach(m)  # traces only: signatures, no batches
    m(batch(32))
    assert len(shapes.seen) == 3 and shapes.of(("train", 0, 1)) is None
    assert shapes.usual is None
