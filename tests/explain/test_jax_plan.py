"""`jax_plan.read_plan` on hand-written schedules: what each layer keeps for
the backward pass does not depend on where the plan's peak falls (in the
optimizer's update, as on a GPU), nor on a forward instruction scheduled
late, and buffers made without metadata (a GPU command buffer's call and
the elements it returns) take their computation's scopes."""

from __future__ import annotations

from keras_memwatch.explain.layers.jax_plan import read_plan, row_of

F, B = "jit(train_step)/jvp(model)", "jit(train_step)/transpose(jvp(model))"
LOSS_F = "jit(train_step)/jvp(compile_loss)/crossentropy"
LOSS_B = "jit(train_step)/transpose(jvp(compile_loss))/crossentropy"


def meta(op_name: str) -> str:
    return f', metadata={{op_name="{op_name}"}}'


def program(update_floats: int) -> str:
    """Two layers (`dense`: 1,000 floats kept, `dense_1`: 2,000 kept, made
    by a command buffer's call, and an asynchronous copy of it), logits of 500 floats, a loss, the backward
    pass, an update whose temporaries are `update_floats` floats, and the
    loss's scalar, a forward instruction, scheduled last."""
    return f"""HloModule jit_train_step, is_scheduled=true

%command_buffer (p: f32[1000]) -> (f32[2000], s8[64]) {{
  %p = f32[1000]{{0}} parameter(0)
  %h1 = f32[2000]{{0}} broadcast(%p), dimensions={{}}{meta(F + "/dense_1/dot_general")}
  %ws = s8[64]{{0}} constant({{...}})
  ROOT %t = (f32[2000]{{0}}, s8[64]{{0}}) tuple(%h1, %ws)
}}

ENTRY %main (w: f32[3000], x: f32[100]) -> (f32[3000], f32[]) {{
  %w = f32[3000]{{0}} parameter(0)
  %x = f32[100]{{0}} parameter(1)
  %h0 = f32[1000]{{0}} broadcast(%x), dimensions={{}}{meta(F + "/dense/dot_general")}
  %call = (f32[2000]{{0}}, s8[64]{{0}}) call(%h0), to_apply=%command_buffer
  %h1 = f32[2000]{{0}} get-tuple-element(%call), index=0
  %cs = (f32[2000]{{0}}, f32[2000]{{0}}, u32[]) copy-start(%h1){meta(F + "/dense_1/copy")}
  %h1c = f32[2000]{{0}} copy-done(%cs)
  %logits = f32[500]{{0}} slice(%h1c), slice={{[0:500]}}{meta(F + "/dense_1/add")}
  %lsm = f32[500]{{0}} exponential(%logits){meta(LOSS_F + "/log_softmax")}
  %glog = f32[500]{{0}} subtract(%lsm, %lsm){meta(LOSS_B + "/sub")}
  %g1 = f32[2000]{{0}} multiply(%h1, %glog){meta(B + "/dense_1/dot_general")}
  %g0 = f32[1000]{{0}} multiply(%h0, %g1){meta(B + "/dense/dot_general")}
  %grads = f32[3000]{{0}} concatenate(%g0, %g1){meta(B + "/dense/concatenate")}
  %tmp = f32[{update_floats}]{{0}} broadcast(%grads), dimensions={{}}{meta("jit(train_step)/adam_w/mul")}
  %new = f32[3000]{{0}} add(%w, %tmp){meta("jit(train_step)/adam_w/add")}
  %scalar = f32[] reduce(%lsm, %lsm), to_apply=%command_buffer{meta(LOSS_F + "/reduce_sum")}
  ROOT %out = (f32[3000]{{0}}, f32[]) tuple(%new, %scalar)
}}
"""


def is_loss(scope):
    return scope is not None and "loss" in scope.split("/", 1)[0]


def test_the_layers_keep_their_activations_where_the_peak_is_in_the_update():
    plan = read_plan(program(update_floats=20_000), is_loss)
    assert plan.peak_phase == "update"
    assert plan.update_bytes == plan.peak_bytes - plan.passes_peak_bytes > 0
    # Each layer keeps what its backward pass reads, though gone at the peak;
    # the forward instruction scheduled last (the loss's scalar) changes nothing.
    assert plan.kept == {"model/dense/dot_general": 4000,
                         "model/dense_1/dot_general": 8000}
    assert row_of("model/dense_1/dot_general", ["dense", "dense_1"],
                  "model") == "dense_1"
    # The loss at its peak: its log-softmax (the logits, which only it reads,
    # are gone by then) and the gradient of the logits.
    assert plan.loss_kept == 2000 and plan.loss_grad == 2000
    assert plan.other_at_peak["adam_w"] >= 80_000


def test_an_update_under_the_passes_peak_adds_nothing():
    plan = read_plan(program(update_floats=10), is_loss)
    assert plan.peak_phase in ("forward", "backward")
    assert plan.update_bytes == 0
    assert plan.kept == {"model/dense/dot_general": 4000,
                         "model/dense_1/dot_general": 8000}


def test_no_backward_pass_no_plan():
    forward_only = "\n".join(line for line in program(10).split("\n")
                             if "transpose(jvp(" not in line)
    assert read_plan(forward_only, is_loss) is None


def test_the_update_row_says_what_the_update_adds_at_the_peak():
    import keras

    from keras_memwatch.explain.layers.steps import _jax_step_rows
    from keras_memwatch.explain.layers.table import LOSS, UPDATE

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.AdamW(name="adam_w"), loss="mse")
    plan = read_plan(program(update_floats=20_000), is_loss)
    loss, update = _jax_step_rows(model, plan, plan.peak_bytes)
    assert (loss.layer, update.layer) == (LOSS, UPDATE)
    assert update.extra_bytes == plan.update_bytes
    assert "peak is in the update" in update.note
    assert loss.activation_bytes + loss.grad_bytes == 4000



def test_a_plan_whose_peak_is_in_the_update_keeps_the_layers_activations():
    """Wide layers, a small batch, AdamW: XLA's CPU plan peaks in the update
    (2026-12; XLA may schedule otherwise), where the activations are gone."""
    import keras
    import numpy as np
    import pytest

    if keras.backend.backend() != "jax":
        pytest.skip("XLA's plan of the JAX step")
    from keras_memwatch import memory_by_layer
    from keras_memwatch.explain.layers import UPDATE

    model = keras.Sequential([keras.Input((512,)),
                              keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer="adamw", loss="mse")
    x, y = np.ones((4, 512), "float32"), np.ones((4, 10), "float32")
    table = memory_by_layer(model, x, y).set_index("layer")
    for name in model.layers[:2]:  # each keeps at least its outputs
        assert table.loc[name.name, "activation_bytes"] >= 4 * 1024 * 4
    assert table["working_bytes"].sum() == table.attrs["working_bytes"]
    update = table.loc[UPDATE, "working_bytes"]
    assert (update > 0) == (table.attrs["peak_phase"] == "update")


FUSED = f"""HloModule jit_train_step, is_scheduled=true

%fused_computation (a: f32[1000]) -> f32[1000] {{
  %a = f32[1000]{{0}} parameter(0)
  %add = f32[1000]{{0}} add(%a, %a){meta(F + "/block/add")}
  ROOT %n = f32[1000]{{0}} multiply(%add, %add){meta(F + "/block/norm/mul")}
}}

ENTRY %main (w: f32[1000], x: f32[1000]) -> f32[1000] {{
  %w = f32[1000]{{0}} parameter(0)
  %x = f32[1000]{{0}} parameter(1)
  %h = f32[1000]{{0}} broadcast(%x), dimensions={{}}{meta(F + "/block/dense/dot_general")}
  %f = f32[1000]{{0}} fusion(%h), kind=kLoop, calls=%fused_computation{meta(F + "/block/norm/mul")}
  %g = f32[1000]{{0}} multiply(%f, %h){meta(B + "/block/norm/mul")}
  ROOT %u = f32[1000]{{0}} add(%w, %g){meta("jit(train_step)/sgd/add")}
}}
"""


def test_a_kept_fusion_says_whose_work_it_also_holds():
    """XLA charges the fusion's buffer to its root's scope (`block/norm`),
    though the residual add in it is the block's own work."""
    plan = read_plan(FUSED, is_loss)
    assert plan.kept == {"model/block/dense/dot_general": 4000,
                         "model/block/norm/mul": 4000}
    assert plan.fused == [("model/block/norm/mul", 4000,
                           frozenset({"model/block/add", "model/block/norm/mul"}))]


def test_the_logits_are_the_losss_though_a_layers_backward_pass_reads_them():
    """On a GPU, XLA fuses the log-softmax's gradient into the backward
    matmul of the layer that made the logits: that layer's backward pass
    reads the logits, and they still belong to the loss."""
    fused_backward = program(update_floats=10).replace(
        '%g1 = f32[2000]{0} multiply(%h1, %glog)',
        '%g1 = f32[2000]{0} multiply(%h1, %logits)')
    plan = read_plan(fused_backward, is_loss)
    assert plan.kept == {"model/dense/dot_general": 4000,
                         "model/dense_1/dot_general": 8000}  # no logits here
    assert plan.loss_kept >= 2 * 2000  # the logits and their log-softmax


def softmax_gradient(logits_by: str) -> str:
    """A step whose loss's backward pass is one input fusion, as XLA compiles
    it for a GPU: it reads the logits (500 floats) elementwise, reduces them
    and writes the gradient of the logits. `logits_by` makes the logits: a
    fusion, or a library call returning them in a tuple with its workspace."""
    made = {
        "fusion": f"""  %logits = f32[500]{{0}} fusion(%h), kind=kCustom, calls=%matmul{meta(F + "/dense/dot_general")}
""",
        "call": f"""  %gemm = (f32[500]{{0}}, s8[64]{{0}}) custom-call(%h), custom_call_target="__cublas$gemm"{meta(F + "/dense/dot_general")}
  %logits = f32[500]{{0}} get-tuple-element(%gemm), index=0
""",
    }[logits_by]
    return f"""HloModule jit_train_step, is_scheduled=true

%matmul (p: f32[100]) -> f32[500] {{
  %p = f32[100]{{0}} parameter(0)
  ROOT %m = f32[500]{{0}} broadcast(%p), dimensions={{}}
}}

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}}

%softmax_grad (l: f32[500], y: f32[500]) -> (f32[500], f32[]) {{
  %l = f32[500]{{0}} parameter(0)
  %y = f32[500]{{0}} parameter(1)
  %e = f32[500]{{0}} exponential(%l){meta(LOSS_F + "/exp")}
  %g = f32[500]{{0}} subtract(%e, %y){meta(LOSS_B + "/sub")}
  %zero = f32[] constant(0)
  %sum = f32[] reduce(%l, %zero), dimensions={{0}}, to_apply=%add
  ROOT %t = (f32[500]{{0}}, f32[]) tuple(%g, %sum)
}}

ENTRY %main (w: f32[100], x: f32[100], y: f32[500]) -> (f32[100], f32[]) {{
  %w = f32[100]{{0}} parameter(0)
  %x = f32[100]{{0}} parameter(1)
  %y = f32[500]{{0}} parameter(2)
  %h = f32[100]{{0}} multiply(%w, %x){meta(F + "/dense/mul")}
{made}  %loss = (f32[500]{{0}}, f32[]) fusion(%logits, %y), kind=kInput, calls=%softmax_grad{meta(LOSS_B + "/sub")}
  %glog = f32[500]{{0}} get-tuple-element(%loss), index=0
  %scalar = f32[] get-tuple-element(%loss), index=1
  %gw = f32[100]{{0}} slice(%glog), slice={{[0:100]}}{meta(B + "/dense/dot_general")}
  %gh = f32[100]{{0}} multiply(%gw, %h){meta(B + "/dense/mul")}
  %new = f32[100]{{0}} subtract(%w, %gh){meta("jit(train_step)/sgd/sub")}
  ROOT %out = (f32[100]{{0}}, f32[]) tuple(%new, %scalar)
}}
"""


def test_on_a_gpu_the_gradient_of_the_logits_takes_the_logits_place():
    """XLA's GPU buffer assignment writes a fusion's result into an operand
    that dies there when the operand reaches it elementwise (the reduction
    of an input fusion runs first): the loss's peak holds the logits' bytes
    once, not twice. GPT-2 base's step on an H100 is such a plan."""
    gpu = read_plan(softmax_gradient("fusion"), is_loss, gpu=True)
    assert gpu.loss_kept + gpu.loss_grad == 2000 + 4  # and the loss's scalar
    # Elsewhere XLA shares only where every use is elementwise: the
    # reduction of the logits keeps them apart.
    cpu = read_plan(softmax_gradient("fusion"), is_loss)
    assert cpu.loss_kept + cpu.loss_grad == 2 * 2000 + 4
    assert cpu.peak_bytes == 400 + 2 * 2000 + 4  # h, logits, gradient, scalar
    assert gpu.peak_bytes == 400 + 2000 + 4 + 400  # the gradient's slice beside


def test_a_library_calls_result_keeps_its_own_buffer():
    """Logits that a library call (cuBLAS) returns in a tuple reach the
    fusion through an alias: XLA shares no buffer with them (Llama, Mistral
    and Gemma shapes on an H100)."""
    gpu = read_plan(softmax_gradient("call"), is_loss, gpu=True)
    assert gpu.peak_bytes == read_plan(softmax_gradient("call"), is_loss).peak_bytes
    assert gpu.peak_bytes >= 400 + 2 * 2000
