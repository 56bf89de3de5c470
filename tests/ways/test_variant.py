"""A variant of the user's model is the setting's, measured afresh, and
leaves the model as it was."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from keras_memwatch.measure.batches import Batches
from keras_memwatch.ways.variant import Setting, realized

BACKEND = keras.backend.backend()


def lion_model():
    inputs = keras.Input((16,))
    h = keras.layers.Dense(64, activation="relu", name="wide")(inputs)
    h = keras.layers.Dense(64, activation="relu", name="wider")(h)
    model = keras.Model(inputs, keras.layers.Dense(4, name="head")(h))
    model.compile(optimizer=keras.optimizers.Lion(1e-4), loss="mse")
    x, y = np.ones((8, 16), "float32"), np.zeros((8, 4), "float32")
    keras.Model.fit(model, x, y, verbose=0)
    return model, Batches(x, y)


@pytest.mark.skipif(BACKEND != "jax", reason="JAX's traced steps")
def test_each_variant_of_the_users_model_is_traced_anew():
    """SGD with momentum keeps one slot a weight, as Lion does: a variant
    that recomputes layers after it has the same arguments, yet its own
    program."""
    from keras_memwatch.judge.xla_plan import lower_step

    model, data = lion_model()
    programs = {}
    remat = (("mode", "list_of_layers"), ("layer_names", ("wide", "wider")))
    for name, setting in [("as is", Setting()), ("sgd", Setting(optimizer="sgd")),
                          ("remat", Setting(remat=remat)), ("as is again", Setting())]:
        with realized(model, data, 8, setting) as variant:
            lowered = lower_step(variant.model, (variant.data.x, variant.data.y), 8)[0]
            programs[name] = lowered.as_text()
    assert len({programs["as is"], programs["sgd"], programs["remat"]}) == 3
    assert programs["as is again"] == programs["as is"]


def test_the_users_model_is_left_as_it_was():
    model, data = lion_model()
    function, optimizer = model.train_function, model.optimizer
    remat = (("mode", "full"),)
    with realized(model, data, 8, Setting(optimizer="sgd", remat=remat)) as variant:
        assert variant.model is model
        assert isinstance(model.optimizer, keras.optimizers.SGD)
    assert model.train_function is function and model.optimizer is optimizer
    assert "train_step" not in vars(model)
    assert all(getattr(layer, "_remat_mode", None) is None
               for layer in model._flatten_layers(include_self=True))


def test_a_rebuilt_model_that_compiles_itself_keeps_the_users_optimizer():
    """keras-hub's tasks compile themselves with their own defaults (Adam)
    when built from a config: the rebuilt model is compiled again as the
    user's was, so a Lion user's mixed-precision row keeps one slot a
    weight, not Adam's two."""
    from conftest import tiny_gpt2
    from keras_memwatch.ways.variant import from_config, model_config, rebuilt

    model, _, _ = tiny_gpt2(optimizer=keras.optimizers.Lion(1e-4))
    clone = rebuilt(model, "mixed_bfloat16")
    assert isinstance(clone.optimizer, keras.optimizers.Lion)
    assert clone.dtype_policy.name == "mixed_bfloat16"
    again = from_config(model_config(model))  # from the config's compile arguments
    assert isinstance(again.optimizer, keras.optimizers.Lion)
    assert float(again.optimizer.learning_rate) == pytest.approx(1e-4)


def test_a_config_without_compile_arguments_is_refused_with_why():
    from conftest import tiny_gpt2
    from keras_memwatch.ways.variant import from_config, model_config, uncompilable

    model, _, _ = tiny_gpt2()
    config = model_config(model)
    assert uncompilable(config) == ""
    del config["compile_config"]
    assert "GPT2CausalLM's compile arguments are not in its config" in uncompilable(
        config)
    with pytest.raises(ValueError, match="cannot be compiled as yours was"):
        from_config(config)
    assert isinstance(from_config(config, like=model).optimizer,
                      type(model.optimizer))  # `like` gives them
