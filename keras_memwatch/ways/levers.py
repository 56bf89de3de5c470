"""The levers: each change a user can make to fit a batch, as a small
object that knows whether it applies to a model, the `Setting` it makes
(`variant.Setting`), the code to write, and its caveats in one line."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Optional

from keras_memwatch.measure.batches import Batches
from keras_memwatch.ways.recompute import (MIXED_REMAT_BACKENDS, MIXED_REMAT_WORDS,
                                           REMAT_LAYERS, containing, heaviest,
                                           mixed_mismatch, recomputed_bytes,
                                           refused_when_traced)
from keras_memwatch.ways.variant import Setting, rebuild_problem, token_length

#: Optimizers whose state the optimizer levers shrink (two slots a weight).
ADAM_LIKE = ("Adam", "AdamW", "Adamax", "Nadam", "Lamb", "Lion", "Ftrl")


@dataclasses.dataclass
class Situation:
    """What the levers need to know about the model and the wanted batch.

    Attributes:
        model: the user's compiled, built model.
        data: its sample batch.
        batch_size: the wanted batch.
        on_gpu: whether the device measured is a GPU.
        bf16_slow: the device lacks fast bfloat16 (a GPU before Ampere).
        layers_by_activation: `(path, activation_bytes)` of each layer of
            the by-layer table with its blocks expanded (`memory_by_layer`:
            what the layer keeps itself), or why none are known.
        left_out: layer name -> why the scope cannot recompute it here.
        accumulation: the gradient accumulation steps to measure.
        settings: each measured row's setting, by its lever.
        rooms: each measured row's `(held_bytes, widened_bytes)`: the
            user's state held beside its variant, and what the cap was
            widened by (`room`).
    """

    model: Any
    data: Batches
    batch_size: int
    on_gpu: bool = False
    bf16_slow: bool = False
    layers_by_activation: Any = ()
    left_out: dict = dataclasses.field(default_factory=dict)
    accumulation: int = 2
    settings: dict = dataclasses.field(default_factory=dict)
    rooms: dict = dataclasses.field(default_factory=dict)

    @functools.cached_property
    def layer_names(self) -> list[str]:
        """Every layer's name, once, outermost first (the inputs left out)."""
        import keras

        return list(dict.fromkeys(
            layer.name for layer in self.model._flatten_layers(include_self=False)
            if not isinstance(layer, keras.layers.InputLayer)))

    @property
    def heavy_layers(self) -> Any:
        """The layers to recompute (`heaviest`), or why there are none."""
        rows = self.layers_by_activation
        if isinstance(rows, str):
            return rows
        names = heaviest(rows, self.left_out)
        if names:
            return names
        if self.left_out:
            return ("every layer that keeps activations is one the scope cannot "
                    "recompute here (see the notes)")
        return "the by-layer table shows no layer keeping activations"

    @property
    def left_out_words(self) -> str:
        """The layers left out, grouped by why: where the by-layer table was
        made, those that keep activations, the heaviest first; `""` where
        none were."""
        rows = self.layers_by_activation
        saves = recomputed_bytes(rows) if rows and not isinstance(rows, str) else None
        by_why: dict[str, list[str]] = {}
        for name in sorted(self.left_out, key=lambda n: -(saves or {}).get(n, 0.0)):
            if saves is None or saves.get(name, 0.0) > 0:
                by_why.setdefault(self.left_out[name], []).append(name)
        return "; ".join(f"{', '.join(names[:REMAT_LAYERS])}"
                         f"{' and more' if len(names) > REMAT_LAYERS else ''} ({why})"
                         for why, names in by_why.items())

    @property
    def optimizer_name(self) -> str:
        optimizer = self.model.optimizer
        return type(getattr(optimizer, "inner_optimizer", optimizer)).__name__


class Lever:
    """One change. Subclasses set `name` and `notes` and define the rest."""

    name = ""
    notes = ""

    def why_not(self, s: Situation) -> str:
        """Why the lever cannot apply to this model, and what to do; `""`
        where it applies."""
        return ""

    def setting(self, s: Situation) -> Setting:
        raise NotImplementedError

    def change(self, s: Situation) -> str:
        raise NotImplementedError

    def note(self, s: Situation) -> str:
        return self.notes

    def leave_out(self, s: Situation, layers: list, why: str) -> bool:
        """Where measuring raised in the call of one of `layers` (outermost
        first) that the lever may do without, leaves it out (in `s`) and
        says `True`: the lever is measured again."""
        return False

    def failure_hint(self, error: BaseException) -> str:
        """What to do where measuring the lever raised `error`; `""` where
        the error says enough."""
        return ""


class MixedPrecision(Lever):
    name = "mixed_precision"

    def policy(self, s: Situation) -> str:
        return "mixed_float16" if s.bf16_slow else "mixed_bfloat16"

    def why_not(self, s: Situation) -> str:
        current = s.model.dtype_policy.name
        if current != "float32":
            return (f"the model already computes in {current}; nothing to change "
                    "here")
        problem = rebuild_problem(s.model)
        if problem:
            return (f"{problem}. Call `keras.mixed_precision.set_dtype_policy("
                    f"{self.policy(s)!r})` before building it, and measure that model")
        return ""

    def setting(self, s: Situation) -> Setting:
        return Setting(policy=self.policy(s))

    def change(self, s: Situation) -> str:
        return (f'keras.mixed_precision.set_dtype_policy("{self.policy(s)}")  '
                "# before building the model")

    def note(self, s: Situation) -> str:
        if s.bf16_slow:
            return ("weights stay float32; float16 needs loss scaling, Keras does it "
                    "(LossScaleOptimizer); this GPU has no fast bfloat16")
        return ("weights stay float32, layers compute in bfloat16 (float32's range, "
                "fewer mantissa bits); slow on CPUs and GPUs before Ampere")


class LeanOptimizer(Lever):
    """An optimizer with less state than Adam's two slots a weight."""

    def __init__(self, kind: str):
        self.kind = kind
        self.name = kind if kind == "adafactor" else "sgd_momentum"

    def why_not(self, s: Situation) -> str:
        name = s.optimizer_name
        if name not in ADAM_LIKE:
            return (f"the model trains with {name}, not an Adam-like optimizer with "
                    "two slots a weight; nothing to gain here")
        return ""

    def setting(self, s: Situation) -> Setting:
        return Setting(optimizer=self.kind)

    def change(self, s: Situation, accumulation: int = 1) -> str:
        """The compile call; with `accumulation` > 1, the new optimizer
        accumulates that many steps' gradients."""
        name, arguments = (("Adafactor", []) if self.kind == "adafactor"
                           else ("SGD", ["momentum=0.9"]))
        if accumulation > 1:
            arguments.append(f"gradient_accumulation_steps={accumulation}")
        return (f"model.compile(optimizer=keras.optimizers.{name}("
                f"{', '.join(arguments)}), ...)  # was {s.optimizer_name}")

    def note(self, s: Situation) -> str:
        if self.kind == "adafactor":
            return ("factored second moments and one full-size velocity a weight "
                    "(Keras's); tune its learning rate (relative step sizes by "
                    "default)")
        return ("one slot a weight instead of two; needs a tuned learning rate and "
                "often a schedule; converges slower on transformers")


class Remat(Lever):
    """Activation recomputation (`keras.RematScope`): the whole model, or
    the layers that hold the most."""

    def __init__(self, layers: bool):
        self.layers = layers
        self.name = "remat_layers" if layers else "remat"

    def _names(self, s: Situation) -> Optional[list[str]]:
        """The layers named; `None` for the whole model (`mode="full"`),
        which stands until a layer is left out."""
        if self.layers:
            return list(s.heavy_layers) if not isinstance(s.heavy_layers, str) else []
        if not s.left_out:
            return None
        return [name for name in s.layer_names if name not in s.left_out]

    def leave_out(self, s: Situation, layers: list, why: str) -> bool:
        """A layer whose recomputed call raised (on JAX, one that branches on
        an argument, which the scope traces) is left out, with every layer
        of its class (their calls are the same code) and every layer that
        holds one of them (their recomputed calls trace it again). For the
        layers named, the outermost named one that the error went through;
        for the whole model, the innermost."""
        names = self._names(s)
        if self.layers:
            failed = next((layer for layer in layers if layer.name in names), None)
        else:
            failed = layers[-1] if layers else None
        if failed is None:
            return False
        before = len(s.left_out)
        for other in s.model._flatten_layers(include_self=False):
            if type(other) is type(failed):
                s.left_out.setdefault(other.name, why)
        for name, inner in containing(s.model, s.left_out).items():
            s.left_out.setdefault(name, f"{why} in {inner}")
        return len(s.left_out) > before

    def why_not(self, s: Situation) -> str:
        names = self._names(s)
        if self.layers and not names:
            why = s.heavy_layers if isinstance(s.heavy_layers, str) and \
                s.heavy_layers else "the by-layer table named no layer"
            return (f"{why}. Name layers yourself with `keras.RematScope(mode="
                    "\"list_of_layers\", layer_names=[...])`, or recompute the whole "
                    "model (`remat`)")
        if names == []:
            return "the scope can recompute no layer of this model here (see the notes)"
        return ""

    def arguments(self, s: Situation) -> tuple[tuple[str, Any], ...]:
        names = self._names(s)
        if names is None:
            return (("mode", "full"),)
        return (("mode", "list_of_layers"), ("layer_names", tuple(names)))

    def setting(self, s: Situation) -> Setting:
        return Setting(remat=self.arguments(s))

    def change(self, s: Situation) -> str:
        names = self._names(s)
        scope = ('keras.RematScope(mode="full")' if names is None else
                 f'keras.RematScope(mode="list_of_layers", layer_names={names!r})')
        return f"with {scope}: model = build_model()"

    def note(self, s: Situation) -> str:
        left_out = s.left_out_words
        if self.layers:
            what = ("recomputes those layers' forward pass in the backward pass "
                    "(more compute, same results)")
        elif self._names(s) is None:
            what = ("recomputes the forward pass in the backward pass (about a third "
                    "more compute, same results)")
        else:
            what = ("recomputes every layer the scope can recompute here in the "
                    "backward pass (more compute, same results)")
        return what + (f"; left out: {left_out}" if left_out else "")

    def failure_hint(self, error: BaseException) -> str:
        if mixed_mismatch(str(error)):
            return (f"{MIXED_REMAT_WORDS}: recompute on JAX, or leave the layers "
                    "with weights out of the scope")
        if "custom_gradient" in str(error):
            return ("on TensorFlow, Keras recomputes a layer through "
                    "`tf.custom_gradient`, which takes no keyword arguments in a "
                    "compiled step: compile with `run_eagerly=True` (slower), or "
                    "recompute on JAX or PyTorch")
        if not refused_when_traced(error):
            return ""
        return ("on JAX, a rematerialized layer's call gets every argument traced, "
                "and this one branches on an argument: keep the layer out of the "
                "scope (`remat_layers` names layers; `keras.RematScope(mode="
                "\"list_of_layers\", layer_names=[...])`)")


class GradientAccumulation(Lever):
    name = "gradient_accumulation"

    def why_not(self, s: Situation) -> str:
        if s.batch_size < 2:
            return "the wanted batch is 1: there is nothing to split"
        return ""

    def setting(self, s: Situation) -> Setting:
        return Setting(accumulation=s.accumulation)

    def change(self, s: Situation) -> str:
        return (f"{s.optimizer_name}(..., gradient_accumulation_steps="
                f"{s.accumulation}); {self.fit_change(s)}")

    def fit_change(self, s: Situation) -> str:
        """The `fit` call alone (where another lever's optimizer accumulates)."""
        return f"model.fit(..., batch_size={max(1, s.batch_size // s.accumulation)})"

    def note(self, s: Situation) -> str:
        k = s.accumulation
        return (f"the same update over {s.batch_size} samples, from {k} steps of "
                f"{max(1, s.batch_size // k)}; batch statistics (BatchNormalization) "
                f"see {max(1, s.batch_size // k)}; largest_batch counts all {k}")


class ShorterSequence(Lever):
    name = "shorter_sequence"

    def why_not(self, s: Situation) -> str:
        length = token_length(s.data)
        if length is None:
            return ("the inputs hold no token ids (one integer array of shape "
                    "(batch, length) or a dict of them)")
        if length < 2:
            return f"the sequence is {length} token long"
        return ""

    def length(self, s: Situation) -> int:
        return max(1, (token_length(s.data) or 2) // 2)

    def setting(self, s: Situation) -> Setting:
        return Setting(sequence=self.length(s))

    def change(self, s: Situation) -> str:
        return (f"cut or pack the token inputs to {self.length(s)} tokens "
                f"(a preprocessor's `sequence_length={self.length(s)}`)")

    def note(self, s: Situation) -> str:
        return (f"the model sees {self.length(s)} tokens of context instead of "
                f"{token_length(s.data)}; a step trains on half the tokens")

    def failure_hint(self, error: BaseException) -> str:
        if "is incompatible with the layer" not in str(error):
            return ""
        return ("the model's inputs are built for one length: build them with "
                "`keras.Input((None,), dtype=\"int32\")` to train on any length")


def changes(group: list[Lever], s: Situation) -> str:
    """The code to write for the levers of `group`, one after another; where
    an optimizer lever joins gradient accumulation, the new optimizer is the
    one that accumulates."""
    together = (any(isinstance(lever, LeanOptimizer) for lever in group)
                and any(isinstance(lever, GradientAccumulation) for lever in group))
    parts = []
    for lever in group:
        if together and isinstance(lever, LeanOptimizer):
            parts.append(lever.change(s, s.accumulation))
        elif together and isinstance(lever, GradientAccumulation):
            parts.append(lever.fit_change(s))
        else:
            parts.append(lever.change(s))
    return "; ".join(parts)


def notes(group: list[Lever], s: Situation) -> str:
    """The levers' notes, one after another."""
    return "; ".join(lever.note(s) for lever in group)


def all_levers() -> list[Lever]:
    """Every lever, in the order the table lists levers that save alike."""
    return [MixedPrecision(), LeanOptimizer("adafactor"), LeanOptimizer("sgd"),
            Remat(layers=False), Remat(layers=True), GradientAccumulation(),
            ShorterSequence()]


#: Every lever's name, as `levers=` takes them.
LEVER_NAMES = tuple(lever.name for lever in all_levers())


def compatible(levers: list[Lever]) -> bool:
    """Whether the levers can be pulled together: one optimizer, one remat,
    and on TensorFlow and PyTorch no recomputation with mixed precision
    (`MIXED_REMAT_WORDS`)."""
    import keras

    kinds = [("optimizer" if isinstance(lever, LeanOptimizer) else
              "remat" if isinstance(lever, Remat) else lever.name) for lever in levers]
    if "remat" in kinds and "mixed_precision" in kinds and \
            keras.backend.backend() in MIXED_REMAT_BACKENDS:
        return False
    return len(kinds) == len(set(kinds))


def combined(levers: list[Lever], s: Situation) -> Optional[Setting]:
    """The setting of the levers together, or `None` where they clash."""
    if not compatible(levers):
        return None
    setting = Setting()
    for lever in levers:
        setting = setting.merged(lever.setting(s))
    return setting
