"""The by-layer table: one row per layer in call order, and the rest.

Each layer's row holds its activation bytes (what it keeps for the backward
pass), its parameter bytes, the gradient bytes a step creates for them, and
its optimizer state, each variable counted once (in the row of the first
layer that holds it). `working_bytes` is what the row adds to a step's
working memory: its activations plus its gradients. The last row, the
rest, is the step's measured working memory less the layers' sum: the
loss, the batch, the optimizer's update, the framework's workspaces
(negative where the layers' sum overstates the step's peak: activations
are freed during the backward pass as gradients appear).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

import pandas as pd

from keras_memwatch.variables import unique_variables, variable_bytes
from keras_memwatch.explain.layers.calls import LayerCalls
from keras_memwatch.explain.layers.shapes import output_shape
from keras_memwatch.units import format_bytes

__all__ = ["COLUMNS", "REST", "by_layer_table", "format_by_layer"]

#: The name of the row holding what no layer holds.
REST = "(rest: loss, batch, optimizer update, workspaces)"

COLUMNS = ("layer", "class", "calls", "output_shape", "activation_bytes",
           "param_bytes", "grad_bytes", "optimizer_bytes", "working_bytes",
           "measured_forward_bytes", "measured_backward_bytes", "remat", "source")


def _slots_by_variable(model: Any) -> dict[str, int]:
    """Optimizer bytes per trainable variable's path: Keras optimizers name
    a slot after its variable's path (`/` as `_`) and the slot."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not getattr(optimizer, "built", False):
        return {}
    names = {v.path.replace("/", "_"): v.path
             for v in unique_variables(model.trainable_variables)}
    out: dict[str, int] = {}
    for slot in unique_variables(optimizer.variables):
        name = slot.name
        owner = max((n for n in names if name.startswith(n + "_")), key=len,
                    default=None)
        if owner is not None and len(slot.shape):
            out[names[owner]] = out.get(names[owner], 0) + variable_bytes([slot])
    return out


def by_layer_table(
    model: Any,
    rows: Sequence[LayerCalls],
    activations: Mapping[int, int],
    source: str,
    working_bytes: Optional[int] = None,
    working_source: str = "",
    forward: Optional[Mapping[int, int]] = None,
    rest_source: str = "measured",
    backward: Optional[Mapping[int, int]] = None,
) -> pd.DataFrame:
    """Builds the table.

    Args:
        model: the Keras model.
        rows: its rows in call order.
        activations: `id(layer)` -> activation bytes of each row.
        source: `"measured"`, `"plan"` or `"shapes"`: where the activation
            bytes come from.
        working_bytes: the step's measured working memory, or `None`.
        working_source: where `working_bytes` comes from, in words.
        forward: `id(layer)` -> measured bytes of its forward pass.
        backward: `id(layer)` -> measured bytes of its backward pass.
        rest_source: the rest's source: `"measured"`, or `"plan"` where the
            step's working memory is XLA's plan.

    Returns:
        The DataFrame (see `memory_by_layer`), with `attrs` holding
        `working_bytes`, `working_source` and `source`.
    """
    slots = _slots_by_variable(model)
    trainable = {id(v) for v in model.trainable_variables}
    seen: set[int] = set()
    records = []
    for row in rows:
        own = [v for v in unique_variables(row.layer.weights) if id(v) not in seen]
        seen.update(id(v) for v in own)
        grads = [v for v in own if id(v) in trainable]
        key = id(row.layer)
        act = int(activations.get(key, 0))
        grad = variable_bytes(grads)
        records.append({
            "layer": row.path, "class": type(row.layer).__name__,
            "calls": row.calls, "output_shape": output_shape(row),
            "activation_bytes": act, "param_bytes": variable_bytes(own),
            "grad_bytes": grad,
            "optimizer_bytes": sum(slots.get(v.path, 0) for v in grads),
            "working_bytes": act + grad,
            "measured_forward_bytes": (forward or {}).get(key, pd.NA),
            "measured_backward_bytes": (backward or {}).get(key, pd.NA),
            "remat": row.remat, "source": source})
    layers_sum = sum(r["working_bytes"] for r in records)
    rest = pd.NA if working_bytes is None else working_bytes - layers_sum
    records.append({
        "layer": REST, "class": "", "calls": 0, "output_shape": "",
        "activation_bytes": pd.NA, "param_bytes": 0, "grad_bytes": 0,
        "optimizer_bytes": 0, "working_bytes": rest,
        "measured_forward_bytes": pd.NA, "measured_backward_bytes": pd.NA,
        "remat": False, "source": rest_source if working_bytes is not None else ""})
    table = pd.DataFrame.from_records(records, columns=list(COLUMNS))
    for column in COLUMNS:
        if column.endswith("_bytes"):
            table[column] = table[column].astype("Int64")
    table.attrs.update(working_bytes=working_bytes, working_source=working_source,
                       source=source)
    return table


def format_by_layer(table: pd.DataFrame, top: int = 5) -> str:
    """"Where a step's working memory goes": the `top` layers by working
    bytes, and the rest, for a person."""
    layers = table[table["layer"] != REST]
    total = table.attrs.get("working_bytes")
    head = layers.sort_values("working_bytes", ascending=False, kind="stable").head(top)
    lines = ["Where a step's working memory goes (by layer):"]
    # Shares of the step, or of the layers' sum where that is larger.
    denominator = max(total or 0, int(layers["working_bytes"].sum()))
    for _, row in head.iterrows():
        share = (f" ({row['working_bytes'] / denominator:.0%})"
                 if denominator else "")
        lines.append(
            f"  {row['layer']} ({row['class']}, {row['output_shape']}): "
            f"{format_bytes(row['working_bytes'])}{share}, activations "
            f"{format_bytes(row['activation_bytes'])} [{row['source']}]")
    if len(layers) > top:
        others = layers["working_bytes"].sum() - head["working_bytes"].sum()
        lines.append(f"  {len(layers) - top} other layers: {format_bytes(others)}")
    if total is not None:
        rest = table.loc[table["layer"] == REST, "working_bytes"].iloc[0]
        lines.append(f"  {REST}: {format_bytes(rest)}")
        lines.append(f"  = {format_bytes(total)}, the step's working memory "
                     f"({table.attrs.get('working_source', '')})")
    else:
        lines.append("  the step's working memory was not measured, so the rest "
                     "is unknown")
    grew = table.attrs.get("grew")
    if grew is not None:
        lines.append(f"  where the input grew from {grew.before_shape} to "
                     f"{grew.after_shape}, {grew.message}")
    return "\n".join(lines)
