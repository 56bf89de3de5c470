"""`compilation_cache=`: JAX's persistent compilation cache in a directory,
the user's own setting left as it is, nothing done on PyTorch and
TensorFlow, bad values refused."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from keras_memwatch.configure import compilation_cache as CC
from keras_memwatch.configure.compilation_cache import (default_cache_directory,
                                                         use_compilation_cache)

BACKEND = keras.backend.backend()
jax_only = pytest.mark.skipif(BACKEND != "jax", reason="JAX's own cache")


def tiny_model():
    model = keras.Sequential([keras.Input((7,)), keras.layers.Dense(5),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


@jax_only
def test_an_estimate_writes_its_compilations_into_the_directory(jax_config, tmp_path):
    from keras_memwatch.capacity import estimate_max_batch_size

    jax = jax_config
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    cache = tmp_path / "cache"
    estimate_max_batch_size(tiny_model(), np.zeros((4, 7), "float32"),
                            np.zeros((4, 1), "float32"), trial_sizes=(2, 8),
                            compilation_cache=str(cache), verbose=0)
    assert jax.config.jax_compilation_cache_dir == str(cache)
    entries = list(cache.iterdir())
    assert entries, "nothing was written"
    # a fit that follows writes its own step there too
    before = len(entries)
    tiny_model().fit(np.zeros((6, 7), "float32"), np.zeros((6, 1), "float32"),
                     batch_size=3, verbose=0)
    assert len(list(cache.iterdir())) > before
    # the user's minimum compile time (0 here) is left as it is
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0


@jax_only
def test_the_users_own_directory_wins(jax_config, tmp_path, caplog):
    jax = jax_config
    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    jax.config.update("jax_compilation_cache_dir", str(theirs))
    with caplog.at_level("INFO", logger="keras_memwatch"):
        assert use_compilation_cache(str(ours)) == str(theirs)
        assert use_compilation_cache(True) == str(theirs)
    assert jax.config.jax_compilation_cache_dir == str(theirs)
    assert not ours.exists()
    assert caplog.text.count("leaves it as it is") == 1  # logged once


@jax_only
def test_true_means_a_directory_under_the_users_cache(jax_config, tmp_path,
                                                      monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_directory() == str(tmp_path / "keras_memwatch" / "jax")
    assert use_compilation_cache(True) == default_cache_directory()
    assert (tmp_path / "keras_memwatch" / "jax").is_dir()
    # JAX's default minimum compile time is lowered, so shorter steps are kept
    assert jax_config.config.jax_persistent_cache_min_compile_time_secs == \
        CC.MIN_COMPILE_SECONDS
    # a second directory of ours replaces the first
    assert use_compilation_cache(tmp_path / "other") == str(tmp_path / "other")


def test_none_sets_nothing(tmp_path):
    before = _jax_dir()
    use_compilation_cache(None)
    use_compilation_cache(False)
    assert _jax_dir() == before


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_other_backends_accept_it_and_do_nothing(backend, tmp_path):
    before = _jax_dir()
    assert use_compilation_cache(str(tmp_path / "c"), backend=backend) is None
    assert not (tmp_path / "c").exists()
    assert _jax_dir() == before


@pytest.mark.parametrize("value, error", [
    (3, TypeError), (["a"], TypeError), ("", ValueError), ("FILE", ValueError)])
def test_bad_values_name_the_argument(value, error, tmp_path):
    if value == "FILE":
        value = tmp_path / "a_file"
        value.write_text("x")
    with pytest.raises(error, match="Expected `compilation_cache` to be"):
        use_compilation_cache(value)


def _jax_dir():
    import sys

    if "jax" not in sys.modules:
        return None
    return sys.modules["jax"].config.jax_compilation_cache_dir
