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
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Optional

__all__ = ["kept_by_scope", "kept_by_row"]

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


def _entry(hlo: str) -> list[tuple[str, str, str, list[str], str]]:
    """`(name, shape, opcode, operands, op_name)` of each instruction of the
    entry computation, in schedule order."""
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
        out.append((name.lstrip("%"), shape, opcode, operands,
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
    if not any("transpose(jvp(" in ins[4] for ins in entry):
        return {}
    # Where the forward pass ends: after its last instruction (XLA may
    # schedule parts of the backward pass earlier, where their inputs allow).
    boundary = 1 + max((i for i, ins in enumerate(entry)
                        if "jvp(" in ins[4] and "transpose(jvp(" not in ins[4]),
                       default=-1)
    by_name = {ins[0]: (i, ins) for i, ins in enumerate(entry)}

    def buffer(name: str) -> str:
        seen = 0
        while seen < 64:
            _, ins = by_name[name]
            if ins[2] not in _ALIASES or not ins[3]:
                return name
            if ins[2] == "get-tuple-element":
                return name  # an element of a tuple: its own buffer
            name, seen = ins[3][0], seen + 1
        return name

    def scope(name: str) -> Optional[str]:
        todo, done = [name], set()
        while todo:
            current = todo.pop(0)
            if current in done or current not in by_name:
                continue
            done.add(current)
            found = _scope(by_name[current][1][4])
            if found is not None:
                return found
            todo.extend(by_name[current][1][3])
        return None

    kept: set[str] = set()
    for _, _, _, operands, _ in entry[boundary:]:
        for operand in operands:
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


def kept_by_row(kept: dict[Optional[str], int], paths: Sequence[str],
                root: str) -> tuple[dict[str, int], int]:
    """Charges each scope's bytes to the row whose path starts it (the
    longest; the root model's own scope, where present, left out).

    Returns:
        `(bytes per row path, bytes of no row)`.
    """
    rows: dict[str, int] = {}
    rest = 0
    ordered = sorted(paths, key=len, reverse=True)
    for scope, size in kept.items():
        parts = [] if scope is None else [scope]
        if scope is not None and scope.startswith(root + "/"):
            parts.append(scope[len(root) + 1:])
        row = next((p for s in parts for p in ordered
                    if s == p or s.startswith(p + "/")), None)
        if row is None:
            rest += size
        else:
            rows[row] = rows.get(row, 0) + size
    return rows, rest
