"""The PyTorch loss row (`explain/layers/steps.py`): what the autograd hooks
saw, or, on a CUDA device, what the allocator saw where that is more."""

from __future__ import annotations

from keras_memwatch.explain.layers.steps import _torch_loss
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
