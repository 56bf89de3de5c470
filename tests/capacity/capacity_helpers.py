"""Shared by the capacity tests: small models, their state, and a fake way
of measuring for the search.

Not a conftest.py: tests import these helpers by name (`from capacity_helpers
import ...`), which a second conftest module would shadow.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_memwatch.capacity.evidence import AIMED, PLAN, STEP, Observation

MIB = 2**20
GIB = 2**30
BACKEND = keras.backend.backend()


class FakeStrategy:
    """A device whose step at batch b needs `need(b)` bytes (what it reports
    is `reported(b)`, default the same) and runs out of memory where the
    true need exceeds the room. `how` is `STEP` (real steps) or `PLAN`
    (XLA's plans: the ladder aimed)."""

    def __init__(self, need, limit=10 * GIB, in_use=GIB, how=STEP,
                 above_limit=True, reported=None, ladder_width=1, seconds=0.01,
                 aimed=None, check_width=1, checks_in_turn=False):
        self.need, self.limit, self.in_use, self.how = need, limit, in_use, how
        self.aimed = aimed  # quick plans, where `aim` is offered: bytes at b
        self.aims = aimed is not None
        self.deadline = None  # set by the search where it has one
        self.reported = reported or need
        self.above_limit, self.ladder_width = above_limit, ladder_width
        self.check_width, self.checks_in_turn = check_width, checks_in_turn
        self.rounds: list[tuple[str, list[int]]] = []  # each call, as asked
        self.seconds = seconds
        self.words, self.limit_words = "a fake", "a fake limit"
        self.asked: list[tuple[str, int]] = []

    def _observe(self, b, ladder):
        self.asked.append(("ladder" if ladder else "check", b))
        fits = self.need(b) <= self.limit - self.in_use
        how = AIMED if ladder and self.how == PLAN else self.how
        if self.how == PLAN:  # a plan is read whether or not it fits
            quick = self.aimed if how == AIMED and self.aimed else self.reported
            return Observation(b, int(quick(b)), how, ladder=ladder,
                               seconds=self.seconds)
        return Observation(b, int(self.reported(b)) if fits else None, how,
                           ran=fits, ladder=ladder, seconds=self.seconds)

    def ladder(self, sizes, beyond=()):
        self.rounds.append(("ladder", list(sizes) + list(beyond)))
        self.asked += [("aim", b) for b in beyond]
        return ([self._observe(b, True) for b in sizes]
                + [Observation(b, int(self.aimed(b)), AIMED) for b in beyond])

    def aim(self, sizes):
        self.rounds.append(("aim", list(sizes)))
        self.asked += [("aim", b) for b in sizes]
        return [Observation(b, int(self.aimed(b)), AIMED) for b in sizes]

    def check(self, sizes):
        self.rounds.append(("check", list(sizes)))
        return [self._observe(b, False) for b in sizes]


def conv_model():
    model = keras.Sequential([
        keras.Input((32, 32, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def conv_data(n=16):
    rng = np.random.default_rng(0)
    return (rng.normal(size=(n, 32, 32, 1)).astype("float32"),
            rng.integers(0, 10, size=(n,)).astype("int32"))


def state_of(model):
    variables = (list(model.variables) + list(model.optimizer.variables)
                 + list(model.metrics_variables))
    return [(v.path, np.array(keras.ops.convert_to_numpy(v.value)).copy())
            for v in variables]


def assert_same_state(before, after, paths=True):
    assert len(before) == len(after)
    if paths:
        assert [p for p, _ in before] == [p for p, _ in after]
    for (path, a), (_, b) in zip(before, after):
        assert a.dtype == b.dtype, path
        assert a.tobytes() == b.tobytes(), path
