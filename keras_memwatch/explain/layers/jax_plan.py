"""JAX: what XLA's compiled train step keeps for the backward pass, per
name scope, and the step's own buffers (the loss's, the update's).

XLA compiles `fit`'s whole step into one scheduled program. Its entry
computation lists the instructions in the order they run, each with the
op metadata JAX gives it: Keras's name scopes, under `jvp(...)` in the
forward pass and `transpose(jvp(...))` in the backward pass
(`jit(train_step)/jvp(conv1)/conv_general_dilated`); the optimizer's
update and the metrics carry their own scopes (`adam_w/...`).

`read_plan` follows every buffer of the schedule from the instruction that
makes it to its last reader (an alias's readers are its buffer's; each
element of a tuple is a buffer of its own, as in XLA's buffer assignment;
the program's outputs live to its end; a fusion that overwrites an
operand dying in it writes into that operand's buffer, by XLA's rules,
as a GPU writes the gradient of the logits into the logits') and gives:

- what each name scope keeps for the backward pass: the buffers made by
  the forward pass that an instruction of the backward pass reads. That
  does not depend on where XLA schedules the forward pass's last
  instruction (a loss's scalar, needed only as an output, may run late),
  nor on where the step's peak falls (in the optimizer's update, on a
  GPU, the activations are gone);
- the step's peak, and the peak up to the backward pass's last
  instruction: what the update, after it, adds to the step is the
  difference;
- the loss's buffers where the most of them are live at once: those of
  its forward pass, those its forward pass reads (the logits, though a
  layer's backward pass may read them too) or only the loss reads (their
  log-softmax), and those of its backward pass (the gradient of the
  logits).

An instruction without metadata (a layout copy; on a GPU, a call of a
command buffer and the elements it returns) takes the scope of what it
computes: a called computation's root, else its nearest operand's.

A fusion's buffer carries its root's scope, though the fusion may compute
other layers' work too (a residual add fused into the dense before it,
attention scores into their softmax): `Plan.fused` lists the kept
buffers whose fusions hold forward work of other scopes, so that a row can
say its figure follows XLA's fusions where PyTorch's would follow its ops.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Callable, Optional

from keras_memwatch.explain.layers.buffer_sharing import same_room, writes_in_place
from keras_memwatch.explain.layers.hlo_text import (
    Instruction, array_bytes, computations as parsed, tuple_elements)

__all__ = ["Plan", "read_plan", "row_of"]

_SCOPE = re.compile(r"(?:transpose\()?jvp\(([^()]*)\)\)?(/.*)?$")
_ALIASES = ("bitcast", "get-tuple-element")
_NOT_ACTIVATIONS = ("parameter", "constant", "tuple", "after-all")


def _scope(op_name: str) -> Optional[str]:
    """`"conv1/conv_general_dilated"` of a forward or backward op's name."""
    for part in op_name.split("/"):
        if part.startswith(("jvp(", "transpose(jvp(")):
            tail = op_name.split(part, 1)[1]
            match = _SCOPE.match(part)
            return None if match is None else match.group(1) + tail
    return None


def row_of(scope: Optional[str], paths: Sequence[str], root: str
           ) -> Optional[str]:
    """The row whose path starts `scope` (the longest; the root model's own
    scope, where present, left out). A layer called outside the model that
    holds it (a tied embedding's reverse call, in a task's `call`) has a
    scope of its own name alone: it matches the one row of that name."""
    if scope is None:
        return None
    parts = [scope]
    if scope.startswith(root + "/"):
        parts.append(scope[len(root) + 1:])
    ordered = sorted(paths, key=len, reverse=True)
    row = next((p for s in parts for p in ordered
                if s == p or s.startswith(p + "/")), None)
    if row is not None:
        return row
    first = scope.split("/", 1)[0]
    named = [p for p in paths if p.rsplit("/", 1)[-1] == first]
    return named[0] if len(named) == 1 else None


def _phase(op_name: str) -> str:
    """`"backward"`, `"forward"`, `"other"` (the update, the metrics) or
    `""` (no metadata)."""
    if "transpose(jvp(" in op_name:
        return "backward"
    if "jvp(" in op_name:
        return "forward"
    return "other" if op_name else ""


def _outer(op_name: str) -> str:
    """The first name scope under the step's `jit(...)`: `"adam_w"`."""
    parts = [p for p in op_name.split("/") if p and not p.startswith("jit(")]
    return parts[0] if parts else ""


@dataclasses.dataclass
class _Buffer:
    """A buffer of the program: where it is made, its bytes, its maker's
    op name, the last instruction that reads it, and its readers'
    `(phase, scope)`."""

    made_at: int
    size: int
    op_name: str
    last_read: int
    readers: set = dataclasses.field(default_factory=set)
    element: int = 0  # which element of its instruction's result it is
    shape: str = ""  # its array's shape text: `f32[8,512]{1,0}`
    in_place: bool = False  # its last reader writes a result into it

    @property
    def end(self) -> int:
        """The first instruction that runs without it."""
        return self.last_read if self.in_place else self.last_read + 1


@dataclasses.dataclass
class Plan:
    """A compiled train step's buffers, split (see `read_plan`).

    Attributes:
        kept: name scope -> bytes made by the forward pass and read by the
            backward pass (None: no scope found), the loss's left out.
        loss_kept: bytes live at the loss's peak (the most bytes of the
            loss's buffers live at once) of its forward pass's buffers and
            of those only the loss reads (the logits).
        loss_grad: bytes of its backward pass's buffers live then (the
            gradient of the logits).
        peak_bytes: the most bytes live at once (the training state and
            the batch, which are parameters, not counted).
        passes_peak_bytes: the same, up to the backward pass's last
            instruction.
        peak_phase: where the peak is: `"forward"` or `"backward"` (the
            pass of the last instruction of either at or before it), or
            `"update"` (after the backward pass's last instruction: the
            optimizer's update, the metrics).
        update_bytes: what the update adds to the step's peak:
            `peak_bytes - passes_peak_bytes`.
        other_at_peak: outer name scope -> bytes made outside both passes
            and live at the peak.
        fused: `(scope, bytes, work)` of each kept buffer (in `kept` under
            `scope`) made by a fusion that computes forward work of other
            scopes too: `work`, those scopes.
    """

    kept: dict[Optional[str], int]
    loss_kept: int
    loss_grad: int
    peak_bytes: int
    passes_peak_bytes: int
    peak_phase: str
    update_bytes: int
    other_at_peak: dict[str, int]
    fused: list = dataclasses.field(default_factory=list)


def _forward_work(computations: dict[str, list[Instruction]], ins: Instruction,
                  element: int, memo: dict[str, frozenset]) -> frozenset:
    """The forward-pass scopes of the work that makes element `element` of
    `ins`: every instruction of a fusion's computations; through a call
    (a GPU command buffer), the instruction its root returns there; empty
    for an instruction that calls nothing."""
    if not ins.calls:
        return frozenset()
    if ins.opcode == "fusion":
        return frozenset().union(*(_fused_scopes(computations, c, memo)
                                   for c in ins.calls))
    body = computations.get(ins.calls[0])
    if not body:
        return frozenset()
    root = body[-1]
    local = {i.name: i for i in body}
    part = (local.get(root.operands[element]) if root.opcode == "tuple"
            and element < len(root.operands) else root)
    return frozenset() if part is None else _forward_work(computations, part, 0, memo)


def _fused_scopes(computations: dict[str, list[Instruction]], name: str,
                  memo: dict[str, frozenset]) -> frozenset:
    """The forward-pass scopes of a computation's instructions, and of the
    computations they call."""
    if name not in memo:
        memo[name] = frozenset()  # a cycle, should one appear, ends here
        scopes: set = set()
        for ins in computations.get(name, ()):
            if _phase(ins.op_name) == "forward":
                scopes.add(_scope(ins.op_name))
            for callee in ins.calls:
                scopes |= _fused_scopes(computations, callee, memo)
        memo[name] = frozenset(scopes - {None})
    return memo[name]


def _share_in_place(computations: dict[str, list[Instruction]],
                    resolved: list[tuple[Instruction, list[str]]],
                    buffers: dict[str, list[str]], made: dict[str, _Buffer],
                    gpu: bool) -> None:
    """Marks each buffer that a fusion, its last reader, overwrites with a
    result (`buffer_sharing`), one operand an output."""
    for i, (ins, _) in enumerate(resolved):
        if ins.opcode != "fusion":
            continue
        taken: set[str] = set()
        for out in buffers.get(ins.name, ()):
            result = made[out]
            for index, operand in enumerate(ins.operands):
                named = buffers.get(operand, ())
                if named != [f"{operand}#0"] or named[0] in taken:
                    continue  # made elsewhere: through an alias, no sharing
                buffer = made[named[0]]
                if (buffer.last_read == i and not buffer.in_place and result.size
                        and same_room(buffer.shape, result.shape, gpu)
                        and writes_in_place(computations, ins, index,
                                            result.element, gpu)):
                    buffer.in_place = True
                    taken.add(named[0])
                    break


def _nearest(ins: Instruction, table: dict[str, Instruction]) -> str:
    """The op name of `ins`, else of its nearest operand (breadth first)
    in `table` that has one; `""` where none has."""
    todo, done = [ins], set()
    while todo:
        current = todo.pop(0)
        if current.name in done:
            continue
        done.add(current.name)
        if current.op_name:
            return current.op_name
        todo.extend(table[o] for o in current.operands if o in table)
    return ""


def _resolved(computations: dict[str, list[Instruction]], entry: str
              ) -> list[tuple[Instruction, list[str]]]:
    """The entry's instructions, each with the op name of each buffer it
    makes (one per tuple element): its own metadata, else its called
    computation's root's (per element of a root tuple), else its nearest
    operand's."""
    instructions = computations.get(entry, [])
    by_name = {ins.name: ins for ins in instructions}

    def called(ins: Instruction, count: int) -> list[str]:
        for callee in ins.calls:
            body = computations.get(callee)
            if not body:
                continue
            local = {i.name: i for i in body}
            root = body[-1]
            parts = ([local.get(o) for o in root.operands] if root.opcode == "tuple"
                     else [root])
            names = [_nearest(p, local) for p in parts if p is not None]
            if len(names) == count:
                return names
            found = next((n for n in names if n), "") or next(
                (i.op_name for i in body if i.op_name), "")
            return [found] * count
        return [""] * count

    out: list[tuple[Instruction, list[str]]] = []
    names: dict[str, list[str]] = {}
    for ins in instructions:
        count = len(tuple_elements(ins.shape))
        if ins.op_name:
            op_names = [ins.op_name] * count
        elif ins.calls:
            op_names = called(ins, count)
        elif ins.opcode == "get-tuple-element" and ins.operands:
            source = names.get(ins.operands[0], [""])
            op_names = [source[ins.index] if 0 <= ins.index < len(source)
                        else source[0]]
        else:
            op_names = [""] * count
        if not any(op_names) and ins.opcode not in _NOT_ACTIVATIONS:
            near = next((n for o in ins.operands for n in names.get(o, ()) if n),
                        "") or _nearest(ins, by_name)
            op_names = [near] * count
        names[ins.name] = op_names
        out.append((ins, op_names))
    return out


def read_plan(hlo: str, is_loss: Callable[[Optional[str]], bool],
              gpu: bool = False) -> Optional[Plan]:
    """Splits a compiled train step's optimized HLO text (see the module's
    docstring).

    Args:
        hlo: the text (`compiled.as_text()`).
        is_loss: whether a name scope is the loss's.
        gpu: whether XLA compiled the text for a GPU (its rules for writing
            a fusion's result into an operand's buffer).

    Returns:
        The `Plan`, or None where the program has no backward pass.
    """
    computations, entry = parsed(hlo)
    resolved = _resolved(computations, entry)
    if not any(_phase(n) == "backward" for _, names in resolved for n in names):
        return None
    buffers: dict[str, list[str]] = {}  # instruction -> the buffers it names
    made: dict[str, _Buffer] = {}
    memo: dict[str, frozenset] = {}
    phases: list[str] = []
    for i, (ins, op_names) in enumerate(resolved):
        reader = {_phase(n) for n in op_names}
        phase = ("backward" if "backward" in reader else "forward" if "forward"
                 in reader else "other" if "other" in reader else "")
        phases.append(phase)
        if ins.opcode == "get-tuple-element" and ins.operands:
            source = buffers.get(ins.operands[0], [])
            buffers[ins.name] = ([source[ins.index]] if 0 <= ins.index < len(source)
                                 else list(source))
        elif ins.opcode in _ALIASES and ins.operands:
            buffers[ins.name] = list(buffers.get(ins.operands[0], ()))
        elif ins.opcode.endswith("-done") and ins.operands:
            # An asynchronous pair's result: the start's second element.
            source = buffers.get(ins.operands[0], [])
            buffers[ins.name] = source[1:2] or list(source)
        elif ins.opcode == "tuple":
            buffers[ins.name] = [b for o in ins.operands for b in buffers.get(o, ())]
        elif ins.opcode in _NOT_ACTIVATIONS:
            buffers[ins.name] = []
        else:
            shapes = tuple_elements(ins.shape)
            buffers[ins.name] = [f"{ins.name}#{k}" for k in range(len(shapes))]
            for k, shape in enumerate(shapes):
                # An asynchronous start's first element is its operands:
                # other buffers, not bytes of its own.
                start = ins.opcode.endswith("-start") and k == 0
                size = 0 if start or shape.startswith("(") else array_bytes(shape)
                made[f"{ins.name}#{k}"] = _Buffer(i, size, op_names[k], i,
                                                  element=k, shape=shape)
        for operand in ins.operands:
            for b in buffers.get(operand, ()):
                made[b].last_read = i
                made[b].readers.update((_phase(n), _scope(n)) for n in op_names)
    for b in buffers.get(resolved[-1][0].name, ()):
        made[b].last_read = len(resolved)
    _share_in_place(computations, resolved, buffers, made, gpu)
    n = len(resolved) + 2
    change, loss_change, grad_change = [0] * n, [0] * n, [0] * n
    kept: dict[Optional[str], int] = {}
    fused: list[tuple[Optional[str], int, frozenset]] = []
    for buffer in made.values():
        change[buffer.made_at] += buffer.size
        change[buffer.end] -= buffer.size
        phase, scope = _phase(buffer.op_name), _scope(buffer.op_name)
        passes = {(p, s) for p, s in buffer.readers if p in ("forward", "backward")}
        if phase == "backward" and is_loss(scope):
            into = grad_change
        elif phase == "forward" and (is_loss(scope) or passes and all(
                is_loss(s) for _, s in passes) or any(
                p == "forward" and is_loss(s) for p, s in passes)):
            # the loss's, what only the loss reads, and the model's outputs
            # the loss takes, though a layer's backward pass reads them too
            # (a GPU fuses the log-softmax's gradient into the logits' matmul)
            into = loss_change
        else:
            if phase == "forward" and any(p == "backward" for p, _ in passes):
                kept[scope] = kept.get(scope, 0) + buffer.size
                work = _forward_work(computations, resolved[buffer.made_at][0],
                                     buffer.element, memo)
                if work - {scope}:
                    fused.append((scope, buffer.size, work))
            continue
        into[buffer.made_at] += buffer.size
        into[buffer.end] -= buffer.size
    # The update: what runs after the backward pass's last instruction.
    last_backward = max(i for i, p in enumerate(phases) if p == "backward")
    live = loss_live = grad_live = peak = peak_at = passes_peak = 0
    loss_kept = loss_grad = 0
    for i in range(len(resolved)):
        live += change[i]
        loss_live += loss_change[i]
        grad_live += grad_change[i]
        if loss_live + grad_live >= loss_kept + loss_grad:  # ties: the later
            loss_kept, loss_grad = loss_live, grad_live
        if live > peak:
            peak, peak_at = live, i
        if i <= last_backward:
            passes_peak = max(passes_peak, live)
    other: dict[str, int] = {}
    for buffer in made.values():
        if (_phase(buffer.op_name) == "other"
                and buffer.made_at <= peak_at < buffer.end):
            key = _outer(buffer.op_name)
            other[key] = other.get(key, 0) + buffer.size
    phase = "update" if peak_at > last_backward else next(
        (p for p in reversed(phases[:peak_at + 1]) if p in ("forward", "backward")),
        "forward")
    return Plan(kept, loss_kept, loss_grad, peak, passes_peak, phase,
                max(peak - passes_peak, 0), other, fused)
