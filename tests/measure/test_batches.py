"""`repeated`: a job's epoch of one batch, as `fit` takes it."""

from __future__ import annotations

import numpy as np

from keras_memwatch.measure.batches import repeated


def test_an_epoch_is_the_same_batch_steps_times():
    x, y = np.ones((4, 3), "float32"), np.zeros((4,), "int32")
    epoch = repeated(x, y, steps=5)
    assert len(epoch) == 5
    assert all(epoch[i][0] is x and epoch[i][1] is y for i in range(5))


def test_without_targets_each_step_is_the_inputs_alone_packed_as_keras_packs_them():
    x = np.ones((4, 3), "float32")
    epoch = repeated(x, None, steps=2)
    assert epoch[0] == (x,) and epoch[1][0] is x
