"""A model's training state is copied and put back bit for bit; on PyTorch
the gradients its last step left are moved off the device meanwhile."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from keras_memwatch.measure.model_state import ModelState


def trained():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(8, 6)), rng.normal(size=(8, 1)), verbose=0)
    return model


def test_weights_slots_and_counters_come_back_bit_for_bit():
    model = trained()
    before = [np.array(v) for v in model.variables + model.optimizer.variables]
    state = ModelState(model)
    model.fit(np.ones((8, 6)), np.ones((8, 1)), verbose=0)  # moves everything
    state.restore()
    after = [np.array(v) for v in model.variables + model.optimizer.variables]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="PyTorch's .grad")
def test_the_last_steps_gradients_leave_the_device_and_come_back():
    model = trained()
    tensors = [v.value for v in model.trainable_variables]
    grads = [t.grad.clone() for t in tensors]
    state = ModelState(model)
    assert all(t.grad is None for t in tensors)  # nothing held while measuring
    state.restore()
    for tensor, grad in zip(tensors, grads):
        assert tensor.grad.device == grad.device
        assert bool((tensor.grad == grad).all())
