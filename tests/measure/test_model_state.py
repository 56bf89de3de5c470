"""A model's training state is copied and put back bit for bit; on PyTorch
the gradients its last step left are moved off the device meanwhile; a
block that measures gets it all back, the global dtype policy too."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from keras_memwatch.measure.model_state import ModelState, state_kept


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


def test_a_block_that_raises_still_gets_state_and_policy_back():
    model = trained()
    before = [np.array(v) for v in model.variables + model.optimizer.variables]
    policy = keras.config.dtype_policy().name
    with pytest.raises(RuntimeError, match="measuring failed"):
        with state_kept(model):
            keras.config.set_dtype_policy("mixed_bfloat16")
            model.fit(np.ones((8, 6)), np.ones((8, 1)), verbose=0)
            raise RuntimeError("measuring failed")
    assert keras.config.dtype_policy().name == policy
    after = [np.array(v) for v in model.variables + model.optimizer.variables]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_an_unbuilt_model_is_built_with_its_optimizer_slots():
    model = keras.Sequential([keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="mse")
    with state_kept(model, (np.ones((1, 5), "float32"), np.ones((1, 3), "float32"))):
        assert model.built and model.optimizer.built
        assert len(model.optimizer.variables) > 2  # the slots, not only counters
