"""`break_tree_cycles` stops Keras's PyTorch tree functions holding the
structures they flatten in reference cycles, and changes no result."""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest

from conftest import tensors_left_by
from keras_memwatch import break_tree_cycles
from keras_memwatch.configure.tree_cycles import tree_holds_cycles


torch_only = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="the cycles are Keras's PyTorch backend's")


def structures():
    import collections

    Point = collections.namedtuple("Point", "x y")
    fallback = collections.defaultdict(list, {"b": [2], "a": (1, None)})
    return [1, None, [1, (2, 3)], {"b": 1, "a": {"d": [4], "c": 3}}, fallback,
            Point(x=[1, 2], y={"z": 3}), ([], {}, ()), [np.ones(2), {"k": np.zeros(1)}]]


def tree_results():
    """What the tree functions that go through the replaced ones give."""
    tree = keras.tree

    def stop_at_tuples(x):
        return tree.MAP_TO_NONE if isinstance(x, tuple) else None

    out = []
    for s in structures():
        out.append((tree.flatten(s), tree.flatten_with_path(s),
                    tree.map_structure(lambda v: v, s), tree.lists_to_tuples(s),
                    tree.traverse(stop_at_tuples, s),
                    tree.traverse(lambda v: None, s, top_down=False)))
    return repr(out)


@torch_only
def test_break_tree_cycles_stops_keras_holding_a_flattened_structure(
        tree_functions_restored):
    held = tree_holds_cycles()
    before = tree_results()
    assert break_tree_cycles() is held  # True where this Keras held it
    assert not tree_holds_cycles()
    assert tree_results() == before  # the same results, structure by structure
    assert break_tree_cycles() is False  # nothing left to change


@torch_only
def test_after_break_tree_cycles_a_step_leaves_no_tensor_in_cycles(
        tree_functions_restored):
    if not tree_holds_cycles():
        pytest.skip("this Keras leaves no tensor in cycles (keras-team/keras#23111)")
    assert tensors_left_by([]) >= 23
    break_tree_cycles()
    assert tensors_left_by([]) == 0


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="the other backends")
def test_break_tree_cycles_changes_nothing_on_jax_and_tensorflow():
    before = tree_results()
    assert break_tree_cycles() is False
    assert not tree_holds_cycles() and tree_results() == before


@torch_only
def test_break_tree_cycles_leaves_a_keras_it_does_not_know_as_it_is(
        tree_functions_restored, monkeypatch, caplog):
    if not tree_holds_cycles():
        pytest.skip("this Keras leaves no tensor in cycles (keras-team/keras#23111)")
    from keras.src.tree import torchtree_impl

    original = torchtree_impl.traverse
    monkeypatch.setattr(torchtree_impl, "traverse", lambda *a, **k: original(*a, **k))
    with caplog.at_level(logging.WARNING, logger="keras_memwatch"):
        assert break_tree_cycles() is False
    assert "not in the functions this replaces" in caplog.text
    assert tree_holds_cycles()
