"""Where XLA's buffer assignment lets a fusion write its result into the
buffer of an operand that dies in it (an operand and its result in one
buffer), on a GPU and elsewhere."""

from __future__ import annotations

from keras_memwatch.explain.layers.hlo_text import (
    Instruction, array_bytes, element_bytes)

__all__ = ["same_room", "writes_in_place"]

# Elementwise on every operand: a fusion's parameter that reaches an output
# through these and bitcasts alone may share that output's buffer.
_ELEMENTWISE = frozenset({
    "abs", "add", "and", "atan2", "bitcast-convert", "cbrt", "ceil", "clamp",
    "compare", "complex", "convert", "cosine", "divide", "erf", "exponential",
    "exponential-minus-one", "floor", "imag", "is-finite", "log", "log-plus-one",
    "logistic", "maximum", "minimum", "multiply", "negate", "not", "or", "popcnt",
    "power", "real", "reduce-precision", "remainder", "round-nearest-afz",
    "round-nearest-even", "rsqrt", "select", "shift-left", "shift-right-arithmetic",
    "shift-right-logical", "sign", "sine", "sqrt", "subtract", "tan", "tanh", "xor"})


def writes_in_place(computations: dict[str, list[Instruction]],
                    fusion: Instruction, operand: int, element: int,
                    gpu: bool) -> bool:
    """Whether XLA's buffer assignment may write element `element` of a
    fusion's result into the buffer of its operand `operand`, where the
    operand dies. On a GPU (XLA's `FusionCanShareBufferHint`) the fused
    parameter reaches that output through elementwise work and bitcasts
    alone, an input fusion's reduction (computed first) aside; elsewhere
    (`CanShareOperandBufferWithUser`) every use of it is elementwise."""
    if fusion.kind not in ("kLoop", "kInput") and not gpu:
        return False
    body = computations.get(fusion.calls[0]) if fusion.calls else None
    param = next((i for i in body or () if i.opcode == "parameter"
                  and i.index == operand), None)
    if param is None:
        return False
    local = {i.name: i for i in body}
    root = body[-1]
    outputs = root.operands if root.opcode == "tuple" else [root.name]
    output = local.get(outputs[element]) if element < len(outputs) else None
    if output is None:
        return False
    core = (local.get(output.operands[0], output)
            if output.opcode == "bitcast" and output.operands else output)
    single = root.opcode != "tuple"
    if not single and core.opcode not in _ELEMENTWISE:
        return False
    users: dict[str, list[Instruction]] = {}
    for ins in body:
        for name in dict.fromkeys(ins.operands):
            users.setdefault(name, []).append(ins)
    todo, seen, found = [param], {param.name}, False
    while todo:
        current = todo.pop()
        found = found or current is output
        for user in users.get(current.name, ()):
            if gpu and user.opcode == "reduce" and fusion.kind == "kInput":
                continue
            in_place = (single and user is core
                        and user.opcode in ("scatter", "dynamic-update-slice")
                        and user.operands[:1] == [current.name])
            if not (user.opcode in _ELEMENTWISE or user.opcode == "tuple"
                    or gpu and (in_place or user.opcode == "bitcast")):
                return False
            if user.name not in seen:
                seen.add(user.name)
                todo.append(user)
    return found


def same_room(shape: str, other: str, gpu: bool) -> bool:
    """Whether two arrays' shapes allow one buffer for both: the same shape,
    or on a GPU as many elements of as many bytes."""
    if shape == other or not gpu:
        return shape == other
    return (element_bytes(shape) == element_bytes(other) > 0
            and array_bytes(shape) == array_bytes(other))
