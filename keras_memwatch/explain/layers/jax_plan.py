"""JAX: the buffers XLA's compiled step keeps from the forward pass for the
backward pass, per layer.

XLA compiles `fit`'s whole step into one scheduled program. Its entry
computation lists the instructions in the order they run, each with the
op metadata JAX gives it: Keras's name scopes, under `jvp(...)` in the
forward pass and `transpose(jvp(...))` in the backward pass
(`jit(train_step)/jvp(conv1)/conv_general_dilated`). A buffer made by the
end of the forward pass (its last instruction) and read after it is live
across the forward/backward boundary: what the step keeps for the backward
pass (gradients that XLA computes early are not counted). Its
bytes go to the layer named in its instruction's metadata (or, for an
instruction without any, such as a layout copy, in the nearest operand's
that has one); aliases (bitcasts, tuple elements) count once, with their
buffer. Parameters (the training state, the batch) are not activations.

`live_at_peak` follows every buffer of the schedule from the instruction
that makes it to its last reader, finds the moment the most bytes are
live (the step's peak, as XLA's plan of the temporaries), and gives the
bytes live then per name scope, forward and backward apart: the loss's
and the optimizer update's buffers at the peak come from there.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import NamedTuple, Optional

__all__ = ["LivePeak", "kept_by_row", "kept_by_scope", "live_at_peak", "row_of"]

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
          "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
          "c128": 16}
_ARRAY = re.compile(r"([a-z]\w*)\[([\d,]*)\]")
_OPERAND = re.compile(r"%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_SCOPE = re.compile(r"(?:transpose\()?jvp\(([^()]*)\)\)?(/.*)?$")
_ALIASES = ("bitcast", "get-tuple-element")
_NOT_ACTIVATIONS = ("parameter", "constant", "tuple", "after-all")


def _closing(text: str, start: int) -> int:
    """Index of the parenthesis closing the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return len(text)


def _bytes(shape: str) -> int:
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        size = _BYTES.get(dtype, 4)
        for d in filter(None, dims.split(",")):
            size *= int(d)
        total += size
    return total


class Instruction(NamedTuple):
    """One instruction of an HLO computation: the buffer name it defines,
    its shape text, its opcode, the names it reads, and the op metadata's
    name (its Keras name scope, where it has one)."""

    name: str
    shape: str
    opcode: str
    operands: list[str]
    op_name: str


def _entry(hlo: str) -> list[Instruction]:
    """Each instruction of the entry computation, in schedule order."""
    lines = hlo.split("\nENTRY ", 1)[-1].split("\n")[1:]
    out = []
    for line in lines:
        if line.startswith("}"):
            break
        if " = " not in line:
            continue
        name, rest = line.strip().removeprefix("ROOT ").split(" = ", 1)
        end = _closing(rest, 0) + 1 if rest.startswith("(") else rest.find(" ")
        shape, rest = rest[:end], rest[end:].strip()
        opcode = rest.split("(", 1)[0]
        open_at = len(opcode)
        operands = _OPERAND.findall(rest[open_at:_closing(rest, open_at)])
        op_name = _OP_NAME.search(rest)
        out.append(Instruction(name.lstrip("%"), shape, opcode, operands,
                               op_name.group(1) if op_name else ""))
    return out


def _scope(op_name: str) -> Optional[str]:
    """`"conv1/conv_general_dilated"` of a forward or backward op's name."""
    for part in op_name.split("/"):
        if part.startswith(("jvp(", "transpose(jvp(")):
            tail = op_name.split(part, 1)[1]
            match = _SCOPE.match(part)
            return None if match is None else match.group(1) + tail
    return None


def kept_by_scope(hlo: str) -> dict[Optional[str], int]:
    """Bytes kept across the forward/backward boundary of a compiled train
    step's optimized HLO text, by name scope (None: no scope found).
    Empty where the program has no backward pass."""
    entry = _entry(hlo)
    if not any("transpose(jvp(" in ins.op_name for ins in entry):
        return {}
    # Where the forward pass ends: after its last instruction (XLA may
    # schedule parts of the backward pass earlier, where their inputs allow).
    boundary = 1 + max((i for i, ins in enumerate(entry)
                        if "jvp(" in ins.op_name and "transpose(jvp(" not in ins.op_name),
                       default=-1)
    by_name = {ins.name: (i, ins) for i, ins in enumerate(entry)}

    def buffer(name: str) -> str:
        seen = 0
        while seen < 64:
            _, ins = by_name[name]
            if ins.opcode not in _ALIASES or not ins.operands:
                return name
            if ins.opcode == "get-tuple-element":
                return name  # an element of a tuple: its own buffer
            name, seen = ins.operands[0], seen + 1
        return name

    def scope(name: str) -> Optional[str]:
        todo, done = [name], set()
        while todo:
            current = todo.pop(0)
            if current in done or current not in by_name:
                continue
            done.add(current)
            ins = by_name[current][1]
            found = _scope(ins.op_name)
            if found is not None:
                return found
            todo.extend(ins.operands)
        return None

    kept: set[str] = set()
    for ins in entry[boundary:]:
        for operand in ins.operands:
            if operand in by_name and by_name[operand][0] < boundary:
                kept.add(buffer(operand))
    out: dict[Optional[str], int] = {}
    for name in kept:
        _, (_, shape, opcode, _, op_name) = by_name[name]
        if (opcode in _NOT_ACTIVATIONS or shape.startswith("(")
                or "transpose(jvp(" in op_name):  # a gradient, made early
            continue
        key = scope(name)
        out[key] = out.get(key, 0) + _bytes(shape)
    return out


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


def kept_by_row(kept: dict[Optional[str], int], paths: Sequence[str],
                root: str) -> tuple[dict[str, int], int]:
    """Charges each scope's bytes to its row (`row_of`).

    Returns:
        `(bytes per row path, bytes of no row)`.
    """
    rows: dict[str, int] = {}
    rest = 0
    for scope, size in kept.items():
        row = row_of(scope, paths, root)
        if row is None:
            rest += size
        else:
            rows[row] = rows.get(row, 0) + size
    return rows, rest


@dataclasses.dataclass
class LivePeak:
    """The buffers live at the peak of a compiled step's schedule.

    Attributes:
        peak_bytes: the bytes live then (the training state and the batch,
            which are parameters, not counted).
        forward: name scope -> bytes live then, made by the forward pass
            (`jvp(...)`); None: no scope found.
        backward: the same, made by the backward pass (`transpose(jvp(...))`).
        other: the same, made outside both (the optimizer's update, the
            metrics), by their first name scope.
    """

    peak_bytes: int
    forward: dict[Optional[str], int]
    backward: dict[Optional[str], int]
    other: dict[str, int]


def _outer(op_name: str) -> str:
    """The first name scope under the step's `jit(...)`: `"adam_w"`."""
    parts = [p for p in op_name.split("/") if p and not p.startswith("jit(")]
    return parts[0] if parts else ""


@dataclasses.dataclass
class _Buffer:
    """A buffer of the program: where it is made, its bytes, its maker's
    op name, and the last instruction that reads it."""

    made_at: int
    size: int
    op_name: str
    last_read: int


def live_at_peak(hlo: str) -> Optional[LivePeak]:
    """Follows each buffer of the entry computation from the instruction
    that makes it to its last reader (an alias's readers are its buffer's;
    a tuple's elements live as long as any is read; the outputs to the
    end), and returns what is live where the most bytes are; None where
    the program has no backward pass."""
    entry = _entry(hlo)
    if not any("transpose(jvp(" in ins.op_name for ins in entry):
        return None
    buffers: dict[str, list[str]] = {}  # instruction -> the buffers it names
    made: dict[str, _Buffer] = {}  # by the instruction that makes it
    for i, (name, shape, opcode, operands, op_name) in enumerate(entry):
        if opcode in _ALIASES and operands:
            buffers[name] = list(buffers.get(operands[0], ()))
        elif opcode == "tuple":
            buffers[name] = [b for o in operands for b in buffers.get(o, ())]
        elif opcode in _NOT_ACTIVATIONS:
            buffers[name] = []
        else:
            buffers[name] = [name]
            made[name] = _Buffer(i, _bytes(shape), op_name, i)
        for operand in operands:
            for b in buffers.get(operand, ()):
                made[b].last_read = i
    for b in buffers.get(entry[-1].name, ()) if entry else ():
        made[b].last_read = len(entry)
    change = [0] * (len(entry) + 2)
    for buffer in made.values():
        change[buffer.made_at] += buffer.size
        change[buffer.last_read + 1] -= buffer.size
    live = peak = peak_at = 0
    for i, delta in enumerate(change):
        live += delta
        if live > peak:
            peak, peak_at = live, i
    forward: dict[Optional[str], int] = {}
    backward: dict[Optional[str], int] = {}
    other: dict[str, int] = {}
    for buffer in made.values():
        if not buffer.made_at <= peak_at <= buffer.last_read:
            continue
        size, op_name = buffer.size, buffer.op_name
        scope = _scope(op_name)
        if "transpose(jvp(" in op_name:
            backward[scope] = backward.get(scope, 0) + size
        elif "jvp(" in op_name:
            forward[scope] = forward.get(scope, 0) + size
        else:
            key = _outer(op_name)
            other[key] = other.get(key, 0) + size
    return LivePeak(peak, forward, backward, other)
