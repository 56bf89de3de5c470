"""Out of memory is recognised, and what was requested is read, on every framework."""

from __future__ import annotations

import pytest

from conftest import TF_MESSAGE, TORCH_MESSAGE, XLA_MESSAGE, framework_oom
from keras_memwatch.oom_errors import (allocation_lines, device_ran_out, is_oom_error,
                                       requested_bytes)


def test_the_active_frameworks_oom_class_is_recognised():
    assert is_oom_error(framework_oom())


@pytest.mark.parametrize("name, message", [
    ("ResourceExhaustedError", "anything"),
    ("OutOfMemoryError", "anything"),
    ("XlaRuntimeError", XLA_MESSAGE),
    ("JaxRuntimeError", "RESOURCE_EXHAUSTED: Out of memory allocating 1 bytes."),
])
def test_framework_classes_are_recognised_by_name(name, message):
    cls = type(name, (RuntimeError,), {})
    assert is_oom_error(cls(message))


def test_other_errors_are_not_out_of_memory():
    assert not is_oom_error(ValueError("RESOURCE_EXHAUSTED"))
    assert not is_oom_error(RuntimeError("shapes do not match"))
    jax_like = type("JaxRuntimeError", (RuntimeError,), {})
    assert not is_oom_error(jax_like("INVALID_ARGUMENT: bad shape"))
    assert not is_oom_error(KeyboardInterrupt())


def test_plain_runtime_errors_that_say_so_and_causes():
    assert is_oom_error(MemoryError())
    assert is_oom_error(RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 819200000 bytes."))
    try:
        try:
            raise framework_oom()
        except Exception as inner:
            raise RuntimeError("wrapped by a user's helper") from inner
    except RuntimeError as outer:
        assert is_oom_error(outer)


def test_what_each_framework_says_it_tried_to_allocate():
    torch_like = MemoryError(TORCH_MESSAGE)
    assert allocation_lines(torch_like)[:2] == [
        "CUDA out of memory.", "Tried to allocate 2.00 GiB."]
    assert "GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free." in (
        allocation_lines(torch_like))
    assert requested_bytes(torch_like) == 2 * 2**30
    assert requested_bytes(MemoryError(XLA_MESSAGE)) == 4294967296
    assert allocation_lines(MemoryError(XLA_MESSAGE)) == [XLA_MESSAGE]
    assert requested_bytes(MemoryError(TF_MESSAGE)) == 4096 * 262144 * 4
    assert requested_bytes(MemoryError(
        "\x1b[1mDefaultCPUAllocator: can't allocate memory: you tried to allocate "
        "819200000 bytes.\x1b[0m")) == 819200000
    assert requested_bytes(MemoryError("no sizes here")) is None


def test_a_device_that_ran_out_is_told_from_a_cap_that_was_reached():
    """PyTorch says what the device had free: less than it tried to
    allocate means other processes held the device."""
    assert device_ran_out(MemoryError(TORCH_MESSAGE))  # 1.06 GiB free of 2.00
    capped = TORCH_MESSAGE.replace("of which 1.06 GiB", "of which 61.06 GiB")
    assert not device_ran_out(MemoryError(capped))
    before_2_1 = ("CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB "
                  "total capacity; 130.35 MiB already allocated; 20.06 MiB free; "
                  "188.00 MiB reserved in total by PyTorch)")
    assert device_ran_out(MemoryError(before_2_1))
    assert not device_ran_out(MemoryError(XLA_MESSAGE))  # no free size given
    assert not device_ran_out(MemoryError("of which 1.00 GiB is free"))  # nor tried


def test_first_line_is_the_message_s_first_line_cut_to_a_line():
    from keras_memwatch.oom_errors import MAX_LINE, first_line

    assert first_line(RuntimeError("\n  RESOURCE_EXHAUSTED: Out of memory\nmore")) == \
        "RESOURCE_EXHAUSTED: Out of memory"
    assert len(first_line(RuntimeError("x" * (MAX_LINE + 50)))) == MAX_LINE
    assert first_line(RuntimeError("")) == ""
