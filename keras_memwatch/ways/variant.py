"""A model with some levers pulled: what to change (`Setting`), and the
change made for the length of a `with` block (`realized`), then undone.

Each change is the smallest that gives the memory of the model the user
would build with it:

- a dtype policy: a new model, rebuilt from the original's serialized
  config with every `float32` `DTypePolicy` replaced (and compiled from
  its compile config, so a `mixed_float16` optimizer gets Keras's loss
  scaling). The global policy is never set. A model that cannot be
  rebuilt from its config (a subclassed model without `get_config`)
  cannot take this change; `rebuild_problem` says why;
- an optimizer, or `gradient_accumulation_steps`: a new optimizer from
  the original's config, set on the model for the block, built on its
  trainable variables; the original is set back after;
- recomputation: the rematerialization mode that `keras.RematScope` gives
  a layer when it is built, set on every layer of the model (layers read
  it at each call), the old modes set back after;
- a shorter sequence: the token inputs, and targets of the same length,
  cut to the first tokens.

The model's compiled train function is set aside and put back, so that
nothing the user compiled is traced again. Weights and optimizer state
are put back by the caller (`measure.model_state.ModelState`). What the
user's model keeps in memory beside the variant (a rebuilt model's
original with the gradients PyTorch keeps from its last step, a replaced
optimizer's slots) is counted (`Variant.held_bytes`, `room`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator
from typing import Any, Optional

from keras_memwatch.measure.batches import Batches
from keras_memwatch.ways.room import gradient_bytes, held_bytes, state_variables

#: The optimizers of the optimizer lever, by name.
OPTIMIZERS = ("adafactor", "sgd")


@dataclasses.dataclass(frozen=True)
class Setting:
    """What a variant changes; the defaults change nothing.

    Attributes:
        policy: the dtype policy to rebuild the model with, or `None`.
        optimizer: `"adafactor"` or `"sgd"` (with momentum) in place of the
            model's optimizer, or `None`.
        accumulation: `gradient_accumulation_steps` (1: none).
        remat: `keras.RematScope` arguments, or `None`.
        sequence: the token length to cut the token inputs to, or `None`.
    """

    policy: Optional[str] = None
    optimizer: Optional[str] = None
    accumulation: int = 1
    remat: Optional[tuple[tuple[str, Any], ...]] = None
    sequence: Optional[int] = None

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Setting:
        """A setting from `dataclasses.asdict` of one (lists made tuples)."""
        remat = values.get("remat")
        if remat is not None:
            remat = tuple((k, tuple(v) if isinstance(v, list) else v)
                          for k, v in remat)
        return cls(**{**values, "remat": remat})

    def merged(self, other: Setting) -> Setting:
        """This setting with `other`'s changes added (`other` wins)."""
        changes = {f.name: getattr(other, f.name) for f in dataclasses.fields(other)
                   if getattr(other, f.name) != f.default}
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass
class Variant:
    """A realized setting: the model to measure, its sample batch, the
    device batch that stands for the wanted batch, and the bytes of the
    user's training state held beside it that a run of the variant alone
    would not hold (`room.held_bytes`)."""

    model: Any
    data: Batches
    batch_size: int
    held_bytes: int = 0


def _replace_policies(config: Any, policy: str) -> Any:
    """`config` with every serialized `float32` `DTypePolicy` set to `policy`."""
    if isinstance(config, list):
        return [_replace_policies(c, policy) for c in config]
    if not isinstance(config, dict):
        return config
    if config.get("class_name") == "DTypePolicy" and \
            config.get("config", {}).get("name") == "float32":
        return {**config, "config": {**config["config"], "name": policy}}
    return {k: _replace_policies(v, policy) for k, v in config.items()}


def rebuilt(model: Any, policy: str) -> Any:
    """A new model like `model` (same config, compiled the same way) whose
    float32 layers compute in `policy`.

    Raises:
        Exception: whatever serializing or rebuilding the model raises.
    """
    return from_config(model_config(model), policy, like=model)


def model_config(model: Any) -> dict:
    """`model`'s serialized config, to be built again at its first batch."""
    import keras

    config = keras.saving.serialize_keras_object(model)
    config.pop("build_config", None)
    return config


def from_config(config: dict, policy: Optional[str] = None,
                like: Any = None) -> Any:
    """A new model from `model_config`'s `config`, its float32 layers
    computing in `policy` (`None`: as they were), compiled as the model
    `like` was, or else from the config's compile arguments (a model that
    compiles itself when built, as keras-hub's tasks do with their own
    defaults, is compiled again).

    Raises:
        ValueError: for a config without compile arguments, without `like`.
        Exception: whatever rebuilding the model raises.
    """
    import keras

    problem = "" if like is not None else uncompilable(config)
    if problem:
        raise ValueError(problem)
    if policy:
        config = _replace_policies(config, policy)
    with warnings.catch_warnings():
        # a model whose `compile` is its own is compiled below
        warnings.filterwarnings("ignore", message=".*compile.*")
        clone = keras.saving.deserialize_keras_object(config)
    clone.compile(**(_compile_arguments(like) if like is not None
                     else keras.saving.deserialize_keras_object(
                         config["compile_config"])))
    return clone


def uncompilable(config: dict) -> str:
    """Why a model built from `model_config`'s `config` alone cannot be
    compiled as the original was, or `""`."""
    if config.get("compile_config") is not None:
        return ""
    return (f"{config.get('class_name')}'s compile arguments are not in its "
            "config (not serializable), so a model built from it cannot be "
            "compiled as yours was")


def _compile_arguments(model: Any) -> dict[str, Any]:
    """What `model` was compiled with, its optimizer a new one."""
    optimizer = model.optimizer
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return {"optimizer": type(inner).from_config(inner.get_config()),
            "loss": getattr(model, "loss", None)}


def rebuild_problem(model: Any) -> str:
    """Why `model` cannot be rebuilt from its config, or `""`."""
    import keras

    try:
        keras.saving.serialize_keras_object(model)
        if type(model).get_config is keras.Model.get_config and \
                type(model).__init__ is not keras.Model.__init__:
            return (f"{type(model).__name__} is a subclassed model without "
                    "`get_config`: it cannot be rebuilt with another dtype policy")
    except Exception as e:  # noqa: BLE001 - the user's config, any error
        return f"{type(model).__name__} cannot be serialized to be rebuilt: {e}"
    return ""


def new_optimizer(original: Any, kind: Optional[str], accumulation: int) -> Any:
    """An optimizer of `kind` (or the original's class, from its config),
    with `gradient_accumulation_steps` where `accumulation` > 1, wrapped in
    loss scaling where the original is."""
    import keras

    inner = getattr(original, "inner_optimizer", original)
    config = inner.get_config()
    steps = accumulation if accumulation > 1 else config.get(
        "gradient_accumulation_steps")
    rate = config.get("learning_rate", 0.001)
    if isinstance(rate, dict):
        rate = keras.optimizers.schedules.deserialize(rate)
    common = {"learning_rate": rate, "gradient_accumulation_steps": steps}
    if kind == "adafactor":
        made = keras.optimizers.Adafactor(**common)
    elif kind == "sgd":
        made = keras.optimizers.SGD(momentum=0.9, **common)
    else:
        made = type(inner).from_config({**config, "gradient_accumulation_steps": steps})
    if inner is not original:
        made = keras.optimizers.LossScaleOptimizer(made)
    return made


def remat_mode(arguments: tuple[tuple[str, Any], ...]) -> Any:
    """The mode `keras.RematScope(**arguments)` gives a layer built in it."""
    import keras

    with keras.RematScope(**dict(arguments)):
        return keras.layers.Identity()._remat_mode


def token_length(data: Batches) -> Optional[int]:
    """The sequence length of the token inputs (integer arrays of two or
    more dimensions), or `None` where `x` holds none, or several."""
    import keras
    import numpy as np

    lengths = {int(a.shape[1]) for a in keras.tree.flatten(data.x)
               if a.ndim >= 2 and np.issubdtype(a.dtype, np.integer)}
    return lengths.pop() if len(lengths) == 1 else None


def shortened(data: Batches, length: int) -> Batches:
    """`data` with every array whose second axis is the token length cut
    to its first `length` positions."""
    import keras

    full = token_length(data)

    def cut(a: Any) -> Any:
        return a[:, :length] if a.ndim >= 2 and a.shape[1] == full else a

    return Batches(keras.tree.map_structure(cut, data.x),
                   None if data.y is None else keras.tree.map_structure(cut, data.y))


def pulled(model: Any, data: Batches, setting: Setting,
           build: bool = True) -> Batches:
    """Pulls `setting`'s levers other than the dtype policy on `model` (its
    optimizer, built on its variables with `build`; its layers'
    recomputation) and returns `data` as the setting feeds it."""
    if setting.optimizer or setting.accumulation > 1:
        model.optimizer = new_optimizer(model.optimizer, setting.optimizer,
                                        setting.accumulation)
        if build:
            model.optimizer.build(model.trainable_variables)
    if setting.remat is not None:
        mode = remat_mode(setting.remat)
        for layer in model._flatten_layers(include_self=True, recursive=True):
            layer._remat_mode = mode
    model.train_function = None
    return shortened(data, setting.sequence) if setting.sequence else data


@contextlib.contextmanager
def _restored(model: Any) -> Iterator[None]:
    """Puts the user's `model` back after the block: its layers' remat
    modes, optimizer and train function. On JAX its train step is a
    function of its own for the block, since JAX reuses a traced step for an
    equal function (the same model's bound `train_step`) given arguments of
    the same shapes, and a variant (recomputation, an optimizer with as
    many slots) can change the step and keep both."""
    import keras

    layers = list(model._flatten_layers(include_self=True, recursive=True))
    modes = [getattr(layer, "_remat_mode", None) for layer in layers]
    function, optimizer = getattr(model, "train_function", None), model.optimizer
    own = vars(model).get("train_step")
    if keras.backend.backend() == "jax":
        bound = model.train_step

        def train_step(*args: Any, **kwargs: Any) -> Any:
            return bound(*args, **kwargs)

        model.train_step = train_step
    try:
        yield
    finally:
        for layer, mode in zip(layers, modes):
            layer._remat_mode = mode
        model.optimizer, model.train_function = optimizer, function
        if own is not None:
            model.train_step = own
        elif "train_step" in vars(model):
            del model.train_step


@contextlib.contextmanager
def realized(model: Any, data: Batches, batch_size: int,
             setting: Setting) -> Iterator[Variant]:
    """The model and batch of `setting`, for the block.

    Args:
        model: the user's compiled, built model.
        data: its sample batch.
        batch_size: the wanted batch.
        setting: what to change.

    Yields:
        The `Variant` to measure.
    """
    import gc

    target = rebuilt(model, setting.policy) if setting.policy else model
    saved_optimizer = target.optimizer
    try:
        with _restored(model) if target is model else contextlib.nullcontext():
            shown = pulled(target, data, setting)
            users = saved_optimizer if target is model else model.optimizer
            held = held_bytes(state_variables(model, users),
                              state_variables(target, target.optimizer))
            if target is not model:
                held += gradient_bytes(model)
            yield Variant(target, shown, max(1, batch_size // setting.accumulation),
                          held)
    finally:
        del target
        gc.collect()
