"""Keras's PyTorch tree functions without the reference cycles they make.

Keras 3.15 and earlier flatten a structure with a predicate that refers to
the structure, and PyTorch's `tree_flatten` keeps the predicate in a cycle
of its own, so each step's arrays stay until Python's cyclic collector runs
(keras-team/keras#23110). `break_tree_cycles` puts in place the fix merged
into Keras (keras-team/keras#23111); the functions below are Keras's
(Apache 2.0) with that fix. docs/capacity.md has what it changes.
Nothing is imported until a function is called.
"""

from __future__ import annotations

import gc
import inspect
import logging
import weakref
from collections import defaultdict
from typing import Any, Callable

logger = logging.getLogger("keras_memwatch")


#: The predicate of Keras's tree functions that hold the structure, and
#: those functions (of `keras.src.tree.torchtree_impl`).
_HOLDS = "is_leaf=lambda x: x is not structure"
REPLACED = ("_dict_to_ordered_dict", "traverse")


def tree_holds_cycles() -> bool:
    """Whether `keras.tree.flatten` leaves the structure it flattened in a
    reference cycle (checked with the collector paused)."""
    import keras

    class Leaf:
        pass

    leaf = Leaf()
    ref = weakref.ref(leaf)
    collecting = gc.isenabled()
    gc.disable()
    try:
        keras.tree.flatten([[leaf], leaf])  # nested: no short cut
        del leaf
        return ref() is not None
    finally:
        if collecting:
            gc.enable()


def break_tree_cycles() -> bool:
    """Stops Keras's PyTorch backend from leaving each step's arrays in
    reference cycles, for the rest of the process.

    Replaces the two functions of Keras's PyTorch tree module that hold the
    structure they flatten (`_dict_to_ordered_dict` and `traverse`) with
    the fix merged into Keras (keras-team/keras#23111): the predicate they
    hand to PyTorch's `tree_flatten` compares the structure's `id`, so a
    step's arrays are freed when the step drops them. Results are the same.
    Call it once, before `fit`; it changes nothing where it is not needed.

    Returns:
        `True` where Keras's tree functions held the structure and now do
        not; `False` where nothing was changed: another backend, a Keras
        that holds nothing, or one whose functions are not the ones this
        replaces (a warning says so).

    Example:

    ```python
    keras_memwatch.break_tree_cycles()  # before the first `fit`
    ```
    """
    import keras

    if keras.backend.backend() != "torch" or not tree_holds_cycles():
        return False
    from keras.src.tree import torchtree_impl as impl

    if not all(_holds_structure(getattr(impl, name, None)) for name in REPLACED):
        logger.warning("break_tree_cycles: Keras %s holds flattened structures in "
                       "reference cycles, but not in the functions this replaces; "
                       "nothing changed (use CollectCycles)", keras.__version__)
        return False
    impl._dict_to_ordered_dict = _dict_to_ordered_dict
    impl.traverse = _traverse
    return not tree_holds_cycles()


def _holds_structure(function: Any) -> bool:
    """Whether `function` is one of Keras's that hand the structure's own
    predicate to PyTorch (read from its source)."""
    try:
        return _HOLDS in inspect.getsource(function)
    except (OSError, TypeError):  # no source, or not a function
        return False


def _one_level(structure: Any, recurse: Callable[[Any], Any]) -> Any:
    """`structure` rebuilt from `recurse` of each of its children, or
    itself where it has none. The predicate holds the structure's `id`."""
    from torch.utils import _pytree as torch_tree

    own = id(structure)
    children, treedef = torch_tree.tree_flatten(structure,
                                                is_leaf=lambda x: id(x) != own)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
        return structure
    return torch_tree.tree_unflatten([recurse(c) for c in children], treedef)


def _dict_to_ordered_dict(structure: Any) -> Any:
    """Keras's `torchtree_impl._dict_to_ordered_dict`, with the fix of
    keras-team/keras#23111: a dict with its keys sorted; any other
    structure rebuilt with this applied to each of its children."""
    if type(structure) is dict:
        return {k: structure[k] for k in sorted(structure)}
    if type(structure) is defaultdict:
        return defaultdict(structure.default_factory,
                           {k: structure[k] for k in sorted(structure)})
    return _one_level(structure, _dict_to_ordered_dict)


def _traverse(func: Callable[[Any], Any], structure: Any, top_down: bool = True) -> Any:
    """Keras's `torchtree_impl.traverse`, with the fix of keras-team/keras#23111."""

    def recurse(child: Any) -> Any:
        return _traverse(func, child, top_down=top_down)

    structure = _dict_to_ordered_dict(structure)
    if top_down:
        ret = func(structure)
        if ret is None:
            return _one_level(structure, recurse)
    else:
        traversed = _one_level(structure, recurse)
        ret = func(traversed)
        if ret is None:
            return traversed
    if isinstance(ret, type) and ret.__name__ == "MAP_TO_NONE":
        return None
    return ret
