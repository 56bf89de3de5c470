"""JAX's answer, checked and searched by compiling the step at other sizes."""

from __future__ import annotations

import functools

import pytest

from capacity_helpers import (
    BACKEND,
    GIB,
    MIB,
    assert_same_state,
    conv_data,
    conv_model,
    fake_plans,
    simulate_gpu,
    state_of,
    tiny,
)
from keras_memwatch.capacity import estimate_max_batch_size
from keras_memwatch.capacity.xla_check import MAX_CHECKS


@pytest.fixture
def simulated(monkeypatch):
    """Puts a simulated GPU under a model (see `simulate_gpu`)."""
    return functools.partial(simulate_gpu, monkeypatch)


@pytest.mark.skipif(BACKEND != "jax", reason="the XLA plan is JAX's")
def test_jax_on_a_gpu_uses_the_xla_plan_and_checks_its_answer(simulated, monkeypatch):
    model, x, y = tiny()
    simulated(model, name="jax", per_step=False)
    plans = fake_plans(monkeypatch, lambda size: 100 * MIB + 5 * MIB * size)
    lines = []
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8),
                                       progress=lines.append)
    line = int((16 * GIB * 0.9 - GIB - 100 * MIB) // (5 * MIB))
    ceiling = int((16 * GIB - GIB - 100 * MIB) // (5 * MIB))
    assert estimate.method == "xla"
    assert estimate.measurements == ((2, 110 * MIB), (4, 120 * MIB), (8, 140 * MIB))
    assert estimate.static_bytes == GIB + 100 * MIB
    # Where the line is right, two compilations confirm each answer.
    assert estimate.predicted_batch_size == line
    assert estimate.ceiling_batch_size == ceiling == estimate.batch_size_for(0.0)
    assert plans == [2, 4, 8, line, line + line // 100, ceiling,
                     ceiling + ceiling * 3 // 100]  # the ceiling is told to 3%
    assert [b for b, _ in estimate.checked] == plans[3:]
    assert "checked by compiling the step" in estimate.explanation
    assert f"Without headroom, up to batch {ceiling} fits" in estimate.explanation
    assert "recomputing" not in estimate.explanation
    # progress: the first size, then one line per compilation
    assert len(lines) == 1 + len(plans) - 1
    assert all(line.startswith("estimate_max_batch_size: ") for line in lines)


@pytest.mark.skipif(BACKEND != "jax", reason="the XLA plan is JAX's")
def test_where_xla_recomputes_activations_more_fits_than_the_line_says(
        simulated, monkeypatch):
    model, x, y = tiny()
    simulated(model, name="jax", per_step=False)
    cliff = 4000  # XLA fits every plan in 14.5 GiB by recomputing, up to here

    def working_bytes(size):
        line = 100 * MIB + 5 * MIB * size
        return min(line, int(14.5 * GIB)) if size <= cliff else line

    fake_plans(monkeypatch, working_bytes)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8))
    room, full = 16 * GIB * 0.9 - GIB, 16 * GIB - GIB
    # With headroom, the line's answer stands: its plan is what the line says.
    assert estimate.predicted_batch_size == int((room - 100 * MIB) // (5 * MIB))
    ceiling = estimate.ceiling_batch_size
    assert cliff * 0.97 <= ceiling <= cliff
    need = dict(estimate.checked)
    assert need[ceiling] <= full
    assert all(need[b] > full for b in need if b > ceiling)
    assert len(estimate.checked) <= 2 * MAX_CHECKS
    assert "by recomputing activations" in estimate.explanation
    assert f"up to batch {ceiling} fits" in estimate.explanation
    assert f"ceiling:    batch {ceiling}" in str(estimate)
    assert "compiled:" in str(estimate)


@pytest.mark.skipif(BACKEND != "jax", reason="the XLA plan is JAX's")
def test_a_workspace_at_small_batches_moves_the_line_to_larger_ones(simulated, monkeypatch):
    # As a ResNet's plans on an H200: batches 2-16 hold a workspace that does
    # not grow with the batch, so they are not on one line.
    model, x, y = tiny()
    simulated(model, name="jax", per_step=False)

    def working_bytes(size):
        return 100 * MIB + 5 * MIB * size + (150 * MIB if size <= 3 else 0)

    plans = fake_plans(monkeypatch, working_bytes)
    estimate = estimate_max_batch_size(model, x, y)
    line = int((16 * GIB * 0.9 - GIB - 100 * MIB) // (5 * MIB))
    assert estimate.predicted_batch_size == line
    top = max(b for b, _ in estimate.measurements)
    assert top > 16 and {top // 2, top} <= set(plans)  # 2 and 4 times the first top
    assert estimate.fit_batch_sizes[0] > 3 and estimate.fit_batch_sizes[-1] == top
    assert f"fitted over batch sizes {estimate.fit_batch_sizes[0]}-{top}" in (
        estimate.explanation)


@pytest.mark.skipif(BACKEND != "jax", reason="the XLA plan is JAX's")
def test_a_failed_compilation_check_keeps_the_line_and_says_so(
        simulated, monkeypatch, memwatch_logs):
    model, x, y = tiny()
    simulated(model, name="jax", per_step=False)

    def working_bytes(size):
        if size > 8:
            raise RuntimeError("compilation failed")
        return 100 * MIB + 5 * MIB * size

    fake_plans(monkeypatch, working_bytes)
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(2, 4, 8))
    assert estimate.predicted_batch_size == estimate.batch_size_for(0.1) > 0
    assert estimate.ceiling_batch_size is None
    assert "Not checked by compiling the step (RuntimeError)" in estimate.explanation
    assert "could not be compiled" in memwatch_logs.text


@pytest.mark.skipif(BACKEND != "jax", reason="XLA's memory plan is JAX's")
def test_xla_memory_plan_is_exactly_linear_for_a_convnet():
    model = conv_model()
    x, y = conv_data()
    before = state_of(model) if model.optimizer.built else None
    estimate = estimate_max_batch_size(model, x, y, trial_sizes=(8, 16, 32),
                                       method="xla")
    assert estimate.method == "xla" and estimate.residual < 0.01
    # two conv activations (and their relu/grad buffers) of 32x32x16 floats
    assert estimate.per_sample_bytes > 2 * 32 * 32 * 16 * 4
    assert estimate.predicted_batch_size > 1000
    # checked against real compilations, each within the limit it was held to
    need = dict(estimate.checked)
    assert estimate.ceiling_batch_size >= estimate.predicted_batch_size
    assert need[estimate.ceiling_batch_size] <= (estimate.limit_bytes
                                                 - estimate.in_use_bytes)
    if before is not None:
        assert_same_state(before, state_of(model))
