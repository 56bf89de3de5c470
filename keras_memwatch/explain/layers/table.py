"""The by-layer table: one row per layer in call order, the step's own
rows (the loss, the optimizer's update), and the rest.

Each layer's row holds its activation bytes (what it keeps for the backward
pass), its parameter bytes, the gradient bytes a step creates for them, and
its optimizer state, each variable counted once (in the row of the most
deeply nested layer that holds it). `working_bytes` is what the row adds to
a step's working memory: its activations plus its gradients.

The loss row (`LOSS`) holds what the loss keeps of the model's outputs (the
logits, and what it computes from them, such as their log-softmax) and the
gradient its backward pass makes of them. The update row (`UPDATE`) holds
the optimizer update's own buffers where the update holds the step's peak
(zero where the peak comes before it). The last row, the rest, is the
step's measured working memory less the sum of the other rows: the batch,
the framework's workspaces, what no row explains; negative where the sum
overstates the step's peak (activations are freed during the backward pass
as gradients appear). A `note` says why, where the rest is over 5% of the
step's working memory either way (the rows then miss the step by more).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import pandas as pd

from keras_memwatch.variables import unique_variables, variable_bytes
from keras_memwatch.explain.layers.calls import LayerCalls
from keras_memwatch.explain.layers.shapes import output_shape
from keras_memwatch.units import format_bytes

__all__ = ["COLUMNS", "LOSS", "REST", "STEP_ROWS", "UPDATE", "StepRow",
           "by_layer_table", "format_by_layer"]

#: The name of the row holding the loss: the logits it keeps and their gradient.
LOSS = "(loss: logits and their gradient)"
#: The name of the row holding the optimizer update's own buffers.
UPDATE = "(optimizer update)"
#: The name of the row holding what no other row holds.
REST = "(rest: batch, workspaces, not explained)"
#: The rows that are not layers.
STEP_ROWS = (LOSS, UPDATE, REST)
#: A rest beyond this share of the step's working memory gets a note.
REST_SHARE = 0.05

COLUMNS = ("layer", "class", "calls", "output_shape", "activation_bytes",
           "param_bytes", "grad_bytes", "optimizer_bytes", "working_bytes",
           "measured_forward_bytes", "measured_backward_bytes", "remat", "source",
           "note")


@dataclasses.dataclass
class StepRow:
    """A row of the step's own (the loss, the optimizer update).

    Attributes:
        layer: the row's name (`LOSS`, `UPDATE`).
        activation_bytes: what it keeps for the backward pass.
        grad_bytes: the gradients it makes (the loss: of the model's
            outputs).
        source: where the figures come from.
        output_shape: the shape of what it keeps, as text. Defaults to `""`.
        extra_bytes: bytes of `working_bytes` beyond activations and
            gradients (the update's buffers); None where not measured (the
            row's `working_bytes` is then missing). Defaults to `0`.
        measured_backward_bytes: its backward pass, measured by an
            allocator, or None. Defaults to `None`.
        note: why its figures are what they are. Defaults to `""`.
    """

    layer: str
    activation_bytes: int
    grad_bytes: int
    source: str
    output_shape: str = ""
    extra_bytes: Optional[int] = 0
    measured_backward_bytes: Optional[int] = None
    note: str = ""


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
    step_rows: Sequence[StepRow] = (),
    notes: Optional[Mapping[int, str]] = None,
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
        rest_source: the rest's source: `"measured"`, or `"plan"` where the
            step's working memory is XLA's plan.
        backward: `id(layer)` -> measured bytes of its backward pass.
        step_rows: the step's own rows (the loss, the update), after the
            layers. Defaults to `()`.
        notes: `id(layer)` -> a note on the row. Defaults to `None`.

    Returns:
        The DataFrame (see `memory_by_layer`), with `attrs` holding
        `working_bytes`, `working_source` and `source`.
    """
    slots = _slots_by_variable(model)
    trainable = {id(v) for v in model.trainable_variables}
    # A variable belongs to the most deeply nested row that holds it (a
    # block's parts before the block, where blocks are opened).
    owned: dict[int, list[Any]] = {}
    seen: set[int] = set()
    for row in sorted(rows, key=lambda r: -r.path.count("/")):
        owned[id(row)] = [v for v in unique_variables(row.layer.weights)
                          if id(v) not in seen]
        seen.update(id(v) for v in owned[id(row)])
    records = []
    for row in rows:
        own = owned[id(row)]
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
            "remat": row.remat, "source": source,
            "note": (notes or {}).get(key, "")})
    for step in step_rows:
        records.append({
            "layer": step.layer, "class": "", "calls": 1,
            "output_shape": step.output_shape,
            "activation_bytes": step.activation_bytes, "param_bytes": 0,
            "grad_bytes": step.grad_bytes, "optimizer_bytes": 0,
            "working_bytes": (pd.NA if step.extra_bytes is None else
                              step.activation_bytes + step.grad_bytes
                              + step.extra_bytes),
            "measured_forward_bytes": pd.NA,
            "measured_backward_bytes": (pd.NA if step.measured_backward_bytes is None
                                        else step.measured_backward_bytes),
            "remat": False, "source": step.source, "note": step.note})
    explained = sum(r["working_bytes"] for r in records
                    if r["working_bytes"] is not pd.NA)
    rest = pd.NA if working_bytes is None else working_bytes - explained
    records.append({
        "layer": REST, "class": "", "calls": 0, "output_shape": "",
        "activation_bytes": pd.NA, "param_bytes": 0, "grad_bytes": 0,
        "optimizer_bytes": 0, "working_bytes": rest,
        "measured_forward_bytes": pd.NA, "measured_backward_bytes": pd.NA,
        "remat": False, "source": rest_source if working_bytes is not None else "",
        "note": _rest_note(rest, working_bytes, records, working_source)})
    table = pd.DataFrame.from_records(records, columns=list(COLUMNS))
    for column in COLUMNS:
        if column.endswith("_bytes"):
            table[column] = table[column].astype("Int64")
    table.attrs.update(working_bytes=working_bytes, working_source=working_source,
                       source=source)
    return table


def _rest_note(rest: Any, working: Optional[int], records: list[dict],
               working_source: str) -> str:
    """Why the rest is large, where it is over `REST_SHARE` of the step."""
    if working is None:
        return "the step's working memory was not measured"
    if not working or abs(rest) <= REST_SHARE * working:
        return ""
    if rest < 0:
        grads = sum(r["grad_bytes"] for r in records if r["layer"] not in STEP_ROWS)
        return (f"the rows overstate the step's peak by {format_bytes(-rest)} "
                f"({-rest / working:.0%}): "
                "activations are freed during the backward pass as gradients "
                f"({format_bytes(grads)} of the layers' weights) appear, and the "
                "optimizer update runs once the activations are gone")
    host = (", and the allocator's free blocks that the host's resident memory "
            "still counts" if "host" in working_source else "")
    return (f"{format_bytes(rest)} ({rest / working:.0%}) held at the step's peak "
            "by no row: the batch, the gradients of activations between layers, "
            f"the framework's workspaces, work outside the layers and the loss{host}")


def format_by_layer(table: pd.DataFrame, top: int = 5) -> str:
    """"Where a step's working memory goes": the `top` rows by working
    bytes (layers, the loss, the update), and the rest, for a person."""
    ranked = table[table["layer"] != REST]
    total = table.attrs.get("working_bytes")
    head = ranked.sort_values("working_bytes", ascending=False, kind="stable").head(top)
    lines = ["Where a step's working memory goes (by layer):"]
    # Shares of the step, or of the rows' sum where that is larger.
    denominator = max(total or 0, int(ranked["working_bytes"].sum()))
    for _, row in head.iterrows():
        share = (f" ({row['working_bytes'] / denominator:.0%})"
                 if denominator else "")
        what = ", ".join(filter(None, (row["class"], row["output_shape"])))
        lines.append(
            f"  {row['layer']}{f' ({what})' if what else ''}: "
            f"{format_bytes(row['working_bytes'])}{share}, activations "
            f"{format_bytes(row['activation_bytes'])} [{row['source']}]")
    if len(ranked) > top:
        others = ranked["working_bytes"].sum() - head["working_bytes"].sum()
        lines.append(f"  {len(ranked) - top} other rows: {format_bytes(others)}")
    if total is not None:
        rest = table.loc[table["layer"] == REST].iloc[0]
        lines.append(f"  {REST}: {format_bytes(rest['working_bytes'])}")
        if rest["note"]:
            lines.append(f"    {rest['note']}")
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
