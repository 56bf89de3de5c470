"""Puts samples taken on Keras's worker threads back in batch order.

With async dispatch (JAX, PyTorch), Keras calls batch-begin hooks in order
on the training thread but runs batch-end hooks on a thread pool, where
they can arrive out of order. The sequencer learns the order from the
begin hooks, makes a late-arriving batch wait (briefly) for its turn, and
releases samples strictly in that order.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Hashable
from typing import Any

Key = Hashable


class Sequencer:
    """Releases items in the order their keys were announced.

    Args:
        lock: the lock guarding the caller's state; `wait_turn`, `arrive`
            and `flush` must be called holding it.
        max_wait_s: how long a key waits for the keys before it. Past that
            it goes on out of turn rather than stall training. Defaults to
            `1.0`.
    """

    def __init__(self, lock: threading.Lock, max_wait_s: float = 1.0):
        self._lock = lock
        self.max_wait_s = max_wait_s
        self._expected: collections.deque = collections.deque()
        self._waiting: dict[Key, Any] = {}
        # One condition per sleeping key, so that an arrival wakes only the
        # thread whose turn has come (Keras runs up to ~20 hook threads).
        self._sleeping: dict[Key, threading.Condition] = {}

    def expect(self, key: Key) -> None:
        """Announces the next key; needs no lock (one atomic append)."""
        self._expected.append(key)

    def take_turn(self, key: Key) -> bool:
        """The fast path: when `key` is next and nothing waits, takes its
        turn (as `arrive` would) and returns True; else False, and nothing
        changes."""
        expected = self._expected
        if expected and expected[0] == key and not self._waiting:
            expected.popleft()
            if self._sleeping:
                self._wake_head()
            return True
        return False

    def wait_turn(self, key: Key) -> None:
        """Blocks until every key announced before `key` has arrived."""
        expected = self._expected
        if not expected or expected[0] == key or key not in expected:
            return  # the usual case: in turn
        turn = self._sleeping[key] = threading.Condition(self._lock)
        try:
            turn.wait_for(lambda: not expected or expected[0] == key, self.max_wait_s)
        finally:
            del self._sleeping[key]

    def arrive(self, key: Key, item: Any) -> list[tuple[Key, Any]]:
        """Hands in the item of `key`; returns the items now due, in order."""
        expected, waiting = self._expected, self._waiting
        if expected and expected[0] == key and not waiting:
            expected.popleft()  # the usual case: in turn, nobody waiting
            due = [(key, item)]
        else:
            waiting[key] = item
            due = []
            if key not in expected:  # never announced: due at once
                due.append((key, waiting.pop(key)))
            while expected and expected[0] in waiting:
                head = expected.popleft()
                due.append((head, waiting.pop(head)))
        if self._sleeping:
            self._wake_head()
        return due

    def _wake_head(self) -> None:
        """Wakes the thread of the key whose turn it is now, if it sleeps."""
        expected = self._expected
        turn = self._sleeping.get(expected[0]) if expected else None
        if turn is not None:
            turn.notify()
        elif not expected:
            for turn in self._sleeping.values():
                turn.notify()

    def flush(self) -> list[tuple[Key, Any]]:
        """Returns every waiting item in announced order and forgets the
        keys that never arrived (their batch ended without a sample)."""
        order = {key: i for i, key in enumerate(self._expected)}
        keys = sorted(self._waiting, key=lambda k: order.get(k, len(order)))
        self._expected.clear()
        for turn in self._sleeping.values():
            turn.notify()
        return [(key, self._waiting.pop(key)) for key in keys]
