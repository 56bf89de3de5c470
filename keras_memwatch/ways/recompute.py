"""Which layers `keras.RematScope` can recompute on a backend, and which of
them recomputing spares the most: the rules the `remat_layers` lever names
its layers by."""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

__all__ = ["MIXED_REMAT_BACKENDS", "MIXED_REMAT_WORDS", "REMAT_LAYERS", "containing",
           "heaviest", "mixed_mismatch", "not_recomputable", "recomputed_bytes",
           "refused_when_traced", "why_not_recomputable"]

#: The most layers the by-layer recomputation names.
REMAT_LAYERS = 3
#: Keras recomputes a layer on TensorFlow and PyTorch without casting its
#: weights to a mixed policy's compute dtype (keras-team/keras#21448).
MIXED_REMAT_BACKENDS = ("tensorflow", "torch")
MIXED_REMAT_WORDS = ("Keras recomputes a layer on TensorFlow and PyTorch without "
                     "casting its float32 weights to the mixed policy's compute "
                     "dtype (keras-team/keras#21448)")


def why_not_recomputable(layer: Any, backend: str) -> str:
    """Why `keras.RematScope` cannot recompute `layer`'s call on `backend`,
    as far as the layer shows it before a step, or `""`. On TensorFlow
    `tf.custom_gradient` takes no keyword arguments in a compiled step, so
    a layer whose call takes any argument besides its inputs is left out
    (Keras passes `training` and `mask` as keywords); on
    TensorFlow and PyTorch a layer under a mixed dtype policy is recomputed
    without casting the weights it reads cast (`MIXED_REMAT_WORDS`; not
    BatchNormalization's, which it reads in float32)."""
    arguments = list(getattr(layer, "call_signature_parameters", ()))[1:]
    if backend == "tensorflow" and arguments:
        return ("its call takes arguments besides its inputs (Keras passes "
                "`training` and `mask` as keywords, a caller may pass others), "
                "which TensorFlow's recomputation refuses in a compiled step")
    policy = getattr(layer, "dtype_policy", None)
    cast = [w for w in layer.weights if getattr(w, "_autocast", False)]
    if backend in MIXED_REMAT_BACKENDS and cast and policy is not None \
            and policy.compute_dtype != policy.variable_dtype:
        return f"computes in {policy.compute_dtype}: {MIXED_REMAT_WORDS}"
    return ""


def not_recomputable(model: Any, backend: str) -> dict[str, str]:
    """The model's layers that the scope cannot recompute on `backend`, by
    name, with why (`why_not_recomputable`)."""
    out = {}
    for layer in model._flatten_layers(include_self=False, recursive=True):
        why = why_not_recomputable(layer, backend)
        if why:
            out[layer.name] = why
    return out


def containing(model: Any, names: Container[str]) -> dict[str, str]:
    """The layers of `model`, by name, that hold a layer of `names` at any
    depth, each with the class of one it holds: recomputing a layer runs
    the calls of every layer inside it again, traced."""
    out: dict[str, str] = {}

    def held(layer: Any) -> str:
        found = ""
        for inner in layer._flatten_layers(include_self=False, recursive=False):
            below = held(inner)
            found = found or (type(inner).__name__ if inner.name in names else below)
        if found and layer is not model and layer.name not in names:
            out[layer.name] = found
        return found

    held(model)
    return out


#: JAX's errors for a traced value used as a Python one: what a layer that
#: branches on an argument raises in a recomputed call.
TRACING_ERRORS = ("TracerBoolConversionError", "ConcretizationTypeError",
                  "TracerIntegerConversionError", "TracerArrayConversionError")


def refused_when_traced(error: BaseException) -> bool:
    """Whether `error` (the one a step raised) is JAX refusing a traced
    value where a layer's call needs a Python one."""
    return type(error).__name__ in TRACING_ERRORS


def mixed_mismatch(text: str) -> bool:
    """Whether an error reads as a recomputed layer's uncast weights: a
    float16 and a float32 operand (TensorFlow), or recomputed tensors whose
    dtype differs from the forward pass's (PyTorch's checkpoint)."""
    return ("float16" in text or "bfloat16" in text) and (
        "does not match type" in text or "different metadata" in text)


def _inside(path: str, outer: str) -> bool:
    return path.startswith(outer + "/")


def _paths_by_name(rows: Sequence[tuple[str, float]]) -> dict[str, list[str]]:
    by_name: dict[str, list[str]] = {}
    for path, _ in rows:
        by_name.setdefault(path.split("/")[-1], []).append(path)
    return by_name


def recomputed_bytes(rows: Sequence[tuple[str, float]]) -> dict[str, float]:
    """What recomputing each name would spare: what every layer of that
    name keeps, with what the layers inside it keep (`heaviest`'s rows)."""
    return {name: sum(size for path in paths for other, size in rows
                      if other == path or _inside(other, path))
            for name, paths in _paths_by_name(rows).items()}


def heaviest(rows: Sequence[tuple[str, float]], left_out: Container[str]) -> list[str]:
    """The names of the layers whose recomputation saves the most.

    A name stands for every layer of that name (as `keras.RematScope`
    matches them), and a layer for what it keeps and what the layers inside
    it keep. The most first, to half of all the layers keep or
    `REMAT_LAYERS` names; none in `left_out`, none wholly inside a layer
    already named (a block left out leaves its layers to be named).

    Args:
        rows: `(path, activation_bytes)` of each layer, what it keeps
            itself, with paths `outer/inner` for layers inside others.
        left_out: names the scope cannot recompute.

    Returns:
        The names, the most first.
    """
    saves = recomputed_bytes(rows)
    by_name = _paths_by_name(rows)
    total = sum(size for _, size in rows)
    names: list[str] = []
    chosen: list[str] = []
    held = 0.0
    for name in sorted(saves, key=lambda n: -saves[n]):
        if name in left_out or saves[name] <= 0:
            continue
        if all(any(_inside(p, c) for c in chosen) for p in by_name[name]):
            continue
        names.append(name)
        chosen += by_name[name]
        held += saves[name]
        if held >= total / 2 or len(names) >= REMAT_LAYERS:
            break
    return names
