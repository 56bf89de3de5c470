"""`CapacityEstimate`'s words: what a user reads beside the answers."""

from __future__ import annotations

from keras_memwatch.capacity.evidence import PLAN, Evidence, Observation
from keras_memwatch.capacity.result import CapacityEstimate

GIB = 2**30


def estimate(checks: dict[int, float]) -> CapacityEstimate:
    """A JAX estimate under 8 GiB with 1.4 GiB in use: a line through
    the ladder's plans, then plans as `fit` compiles them (GiB by batch)."""
    ladder = [Observation(b, int(0.2 * b * GIB), PLAN, ladder=True)
              for b in (1, 2, 4, 8)]
    plans = [Observation(b, int(gib * GIB), PLAN) for b, gib in checks.items()]
    return CapacityEstimate(Evidence(tuple(ladder + plans), 8 * GIB, int(1.4 * GIB)),
                            headroom=0.1, device="GPU:0", backend="jax",
                            measured_by="XLA's plans")


def test_plans_that_fit_above_one_that_does_not_are_named_with_why():
    # GPT-2 base's `remat` row on an H100: 31 fit where 29 and 30 did not.
    est = estimate({28: 5.91, 29: 6.71, 30: 6.94, 31: 6.15, 32: 7.75})
    assert est.ceiling_batch_size == 28
    assert ("XLA's plans also fit at 31, above 29 and 30, which do not"
            in est.explanation)
    assert "an epoch's smaller last one included" in est.explanation


def test_plans_in_order_say_nothing_more():
    est = estimate({28: 5.91, 29: 6.21, 30: 6.71, 31: 6.94})
    assert est.ceiling_batch_size == 29
    assert "also fit" not in est.explanation
