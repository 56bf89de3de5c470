"""The text of an optimized HLO module, as `compiled.as_text()` prints it:
its computations, each instruction's shape, opcode, operands, op metadata,
called computations, index and fusion kind, and the bytes of a shape."""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Instruction", "array_bytes", "computations", "element_bytes",
           "tuple_elements"]

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
          "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
          "c128": 16}
_ARRAY = re.compile(r"([a-z]\w*)\[([\d,]*)\]")
_OPERAND = re.compile(r"%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CALLS = re.compile(r"(?:calls|to_apply|async_execution_thread_calls)=%([\w.\-]+)")
_INDEX = re.compile(r"index=(\d+)")
_KIND = re.compile(r"kind=(\w+)")


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


def array_bytes(shape: str) -> int:
    """The bytes of a shape's arrays (`f32[8,512]{1,0}`: 16,384)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        size = _BYTES.get(dtype, 4)
        for d in filter(None, dims.split(",")):
            size *= int(d)
        total += size
    return total


def element_bytes(shape: str) -> int:
    """The bytes of one element of an array's shape; 0 for no array."""
    match = _ARRAY.match(shape)
    return _BYTES.get(match.group(1), 4) if match else 0


def tuple_elements(shape: str) -> list[str]:
    """The top-level elements of a tuple shape (`(f32[2], s8[8])`)."""
    if not shape.startswith("("):
        return [shape]
    out, depth, begin = [], 0, 1
    for i, ch in enumerate(shape):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if (ch == "," and depth == 1) or (depth == 0 and i == len(shape) - 1):
            out.append(shape[begin:i].strip())
            begin = i + 1
    return [e for e in out if e]


class Instruction(NamedTuple):
    """One instruction of an HLO computation: the buffer name it defines,
    its shape text, its opcode, the names it reads, the op metadata's name
    (its Keras name scope, where it has one), the computations it calls,
    its index (a `get-tuple-element`'s tuple index, a `parameter`'s
    number; else -1) and a fusion's kind (`"kLoop"`, `"kInput"`)."""

    name: str
    shape: str
    opcode: str
    operands: list[str]
    op_name: str
    calls: tuple[str, ...] = ()
    index: int = -1
    kind: str = ""


def computations(hlo: str) -> tuple[dict[str, list[Instruction]], str]:
    """Each computation's instructions, in order (the entry's in schedule
    order; its root last), and the entry's name."""
    out: dict[str, list[Instruction]] = {}
    entry, current = "", None
    for line in hlo.split("\n"):
        if current is None:
            head = line.split(" ", 2)
            if line.endswith("{") and len(head) > 1 and (
                    line.startswith("%") or line.startswith("ENTRY ")):
                name = head[1] if head[0] == "ENTRY" else head[0]
                current = name.lstrip("%")
                out[current] = []
                if head[0] == "ENTRY":
                    entry = current
            continue
        if line.startswith("}"):
            current = None
            continue
        if " = " not in line:
            continue
        name, rest = line.strip().removeprefix("ROOT ").split(" = ", 1)
        end = _closing(rest, 0) + 1 if rest.startswith("(") else rest.find(" ")
        shape, rest = rest[:end], rest[end:].strip()
        opcode = rest.split("(", 1)[0]
        open_at = len(opcode)
        close = _closing(rest, open_at)
        op_name = _OP_NAME.search(rest)
        index = _INDEX.search(rest[close:]) if opcode == "get-tuple-element" else None
        number = rest[open_at + 1:close] if opcode == "parameter" else ""
        kind = _KIND.search(rest[close:]) if opcode == "fusion" else None
        out[current].append(Instruction(
            name.lstrip("%"), shape, opcode, _OPERAND.findall(rest[open_at:close]),
            op_name.group(1) if op_name else "",
            tuple(_CALLS.findall(rest[close:])),
            int(index.group(1)) if index else int(number) if number.isdigit() else -1,
            kind.group(1) if kind else ""))
    return out, entry
