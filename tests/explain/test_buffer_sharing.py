"""`buffer_sharing`: where XLA writes a fusion's result into the buffer of
an operand that dies in it, by its GPU rule and by its default rule."""

from __future__ import annotations

from keras_memwatch.explain.layers.buffer_sharing import same_room, writes_in_place
from keras_memwatch.explain.layers.hlo_text import computations

HLO = """HloModule m, is_scheduled=true

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%gradient (l: f32[4,8], y: f32[32]) -> (f32[32], f32[4]) {
  %l = f32[4,8]{1,0} parameter(0)
  %y = f32[32]{0} parameter(1)
  %flat = f32[32]{0} bitcast(%l)
  %e = f32[32]{0} exponential(%flat)
  %g = f32[32]{0} subtract(%e, %y)
  %zero = f32[] constant(0)
  %sum = f32[4]{0} reduce(%l, %zero), dimensions={1}, to_apply=%add
  ROOT %t = (f32[32]{0}, f32[4]{0}) tuple(%g, %sum)
}

%transposed (l: f32[4,8]) -> f32[8,4] {
  %l = f32[4,8]{1,0} parameter(0)
  ROOT %t = f32[8,4]{1,0} transpose(%l), dimensions={1,0}
}

%scaled (l: f32[32]) -> f32[32] {
  %l = f32[32]{0} parameter(0)
  ROOT %m = f32[32]{0} multiply(%l, %l)
}

ENTRY %main (x: f32[4,8], y: f32[32], z: f32[32]) -> f32[32] {
  %x = f32[4,8]{1,0} parameter(0)
  %y = f32[32]{0} parameter(1)
  %z = f32[32]{0} parameter(2)
  %loss = (f32[32]{0}, f32[4]{0}) fusion(%x, %y), kind=kInput, calls=%gradient
  %swap = f32[8,4]{1,0} fusion(%x), kind=kLoop, calls=%transposed
  ROOT %sq = f32[32]{0} fusion(%z), kind=kLoop, calls=%scaled
}
"""


def fusion(name):
    parsed, entry = computations(HLO)
    return parsed, next(i for i in parsed[entry] if i.name == name)


def test_the_parser_reads_parameter_numbers_and_fusion_kinds():
    parsed, loss = fusion("loss")
    assert loss.kind == "kInput" and loss.calls == ("gradient",)
    assert [i.index for i in parsed["gradient"] if i.opcode == "parameter"] == [0, 1]


def test_on_a_gpu_an_operand_reached_elementwise_past_a_reduction_is_shared():
    parsed, loss = fusion("loss")
    assert writes_in_place(parsed, loss, 0, 0, gpu=True)
    # the default rule: the reduction and the bitcast are uses that are
    # not elementwise
    assert not writes_in_place(parsed, loss, 0, 0, gpu=False)
    # the reduction's output is not the operand's, on any device
    assert not writes_in_place(parsed, loss, 0, 1, gpu=True)


def test_an_operand_read_out_of_order_is_never_shared():
    parsed, swap = fusion("swap")
    assert not writes_in_place(parsed, swap, 0, 0, gpu=True)
    assert not writes_in_place(parsed, swap, 0, 0, gpu=False)


def test_an_elementwise_fusion_shares_everywhere():
    parsed, sq = fusion("sq")
    assert writes_in_place(parsed, sq, 0, 0, gpu=True)
    assert writes_in_place(parsed, sq, 0, 0, gpu=False)


def test_one_buffer_needs_the_same_shape_or_on_a_gpu_the_same_bytes():
    assert same_room("f32[4,8]{1,0}", "f32[4,8]{1,0}", gpu=False)
    assert not same_room("f32[4,8]{1,0}", "f32[32]{0}", gpu=False)
    assert same_room("f32[4,8]{1,0}", "f32[32]{0}", gpu=True)
    assert not same_room("f32[16]{0}", "bf16[32]{0}", gpu=True)
