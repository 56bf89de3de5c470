"""What the measuring process holds beside a variant that a run of the
variant alone would not, and the cap that widens by it."""

from __future__ import annotations

import keras
import numpy as np

from keras_memwatch.measure.batches import Batches
from keras_memwatch.variables import variable_bytes
from keras_memwatch.ways import room
from keras_memwatch.ways.variant import Setting, realized


def trained_model():
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32),
                              keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss="mse")
    x, y = np.ones((4, 16), "float32"), np.zeros((4, 4), "float32")
    keras.Model.fit(model, x, y, verbose=0)
    return model, Batches(x, y)


def test_a_new_optimizer_holds_the_old_ones_state_beside_it():
    model, data = trained_model()
    adam = variable_bytes(model.optimizer.variables)
    with realized(model, data, 4, Setting(optimizer="sgd")) as variant:
        assert variant.model is model
        assert variant.held_bytes == adam  # its slots and counters
    with realized(model, data, 4, Setting(remat=(("mode", "full"),))) as variant:
        assert variant.held_bytes == 0  # the same model, the same optimizer


def test_a_rebuilt_model_holds_the_whole_original_beside_it():
    model, data = trained_model()
    whole = variable_bytes(room.state_variables(model, model.optimizer))
    with realized(model, data, 4, Setting(policy="mixed_bfloat16")) as variant:
        assert variant.model is not model
        # and on PyTorch the gradients its last step left on its parameters
        assert variant.held_bytes == whole + room.gradient_bytes(model)
    slot = variable_bytes(model.trainable_variables)
    torch = keras.backend.backend() == "torch"  # keeps a step's gradients
    assert room.gradient_bytes(model) == (slot if torch else 0)


def test_the_cap_widens_only_where_an_allocator_cap_can_move():
    # The host, and any backend without a capped CUDA GPU: nothing widens.
    with room.widened(keras.backend.backend(), "host", 2**30) as extra:
        assert extra == 0
    with room.widened(keras.backend.backend(), None, 0) as extra:
        assert extra == 0
