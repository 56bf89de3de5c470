"""The steps' rows (`explain/layers/steps.py`): PyTorch's loss row, what
the autograd hooks saw or, on a CUDA device, what the allocator saw where
that is more; on JAX, the notes that say where XLA's fusions move bytes
between rows."""

from __future__ import annotations

from keras_memwatch.explain.layers.steps import _fusion_notes, _torch_loss
from keras_memwatch.explain.layers.table import LOSS
from keras_memwatch.explain.layers.torch_saved import SavedBytes

MIB = 2**20


def saved(**kwargs) -> SavedBytes:
    return SavedBytes([], {}, 0, {}, outputs=(((8, 64, 100), "float32"),),
                      outputs_held=16 * MIB, loss_saved=16 * MIB, **kwargs)


def test_the_torch_loss_row_holds_what_the_hooks_saw_without_an_allocator():
    loss = _torch_loss(saved(loss_grad=32 * MIB))
    assert (loss.layer, loss.activation_bytes, loss.grad_bytes) == (
        LOSS, 32 * MIB, 32 * MIB)
    assert "allocated" not in loss.note and loss.measured_backward_bytes is None


def test_the_torch_loss_row_takes_the_allocator_where_it_sees_more():
    loss = _torch_loss(saved(loss_grad=0, loss_backward=32 * MIB,
                             loss_forward=17 * MIB))
    assert loss.activation_bytes == 33 * MIB  # the outputs and its call's bytes
    assert loss.grad_bytes == 32 * MIB == loss.measured_backward_bytes
    assert "left 17.0 MiB allocated" in loss.note
    assert "backward pass's peak" in loss.note
    fewer = _torch_loss(saved(loss_grad=32 * MIB, loss_backward=MIB,
                              loss_forward=MIB))
    assert (fewer.activation_bytes, fewer.grad_bytes) == (32 * MIB, 32 * MIB)


def test_rows_say_where_xla_fusions_move_bytes_between_them():
    """The fusion's buffer is the norm's figure on JAX, and PyTorch would
    charge part of it to the block: both rows say so; a row whose work is
    fused nowhere says nothing."""
    paths = ["block", "block/norm", "block/dense"]

    def row_of(scope):
        return next((p for p in sorted(paths, key=len, reverse=True)
                     if scope.startswith(p + "/")), None)

    notes = _fusion_notes([("block/norm/mul", 4 * MIB,
                            frozenset({"block/add", "block/norm/mul"}))],
                          {"block/norm": 4 * MIB, "block": 0, "block/dense": MIB},
                          row_of)
    assert notes["block/norm"] == [
        "4.0 MiB of it made by XLA fusions that also compute block's work "
        "(charged here, to the fusion's result)"]
    assert notes["block"] == ["part of its work kept in norm's buffers (XLA "
                              "fused it there)"]
    assert "block/dense" not in notes
    # a small share of a row's kept bytes is not worth a note
    assert _fusion_notes([("block/norm/mul", MIB // 8,
                           frozenset({"block/add", "block/norm/mul"}))],
                         {"block/norm": 4 * MIB, "block": 4 * MIB}, row_of) == {}
