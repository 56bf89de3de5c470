"""Puts samples taken on Keras's worker threads back in batch order.

With async dispatch (JAX, PyTorch), Keras calls batch-begin hooks in order
on the training thread but runs batch-end hooks on a thread pool, where
they arrive out of order (on JAX, most of them do). A hook never waits for
its turn: it reads at once, and the sequencer pairs the reads, in the order
they were taken, with the batches, in the order they were announced.

That pairing is the truthful one. A hook runs once its step has finished;
when the hook of batch 6 reads before that of batch 5, both steps are over
at that first read, so it holds what batch 5 left (a peak since the
previous read included), and the second read what came after. Reads are
never reordered, only named. A batch whose hook never runs holds the later
ones back until `flush` (MemWatch flushes at each epoch's end).
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Any

Key = Hashable


class Sequencer:
    """Releases `(key, read)` pairs in announced key order, reads in the
    order they were taken.

    `expect` is called on the training thread without a lock; `arrive` and
    `flush` from one thread at a time, with the reads handed in the order
    they were taken.
    """

    def __init__(self) -> None:
        self._expected: collections.deque = collections.deque()
        self._arrived: set[Key] = set()  # keys whose batch came out of turn
        self._reads: collections.deque = collections.deque()
        #: Announces the next key; needs no lock (one atomic append).
        self.expect = self._expected.append

    def arrive(self, key: Key, read: Any) -> list[tuple[Key, Any]]:
        """Hands in the read taken for `key`; returns the pairs now due.

        A key that was never announced (the short last execution of an
        epoch with `steps_per_execution`) takes its place after the keys
        announced so far.
        """
        reads, expected = self._reads, self._expected
        reads.append(read)
        if expected and expected[0] == key and not self._arrived:
            expected.popleft()  # the usual case: in turn, nothing held back
            return [(key, reads.popleft())]
        if key not in expected:
            expected.append(key)
        arrived = self._arrived
        arrived.add(key)
        due = []
        while expected and expected[0] in arrived:
            head = expected.popleft()
            arrived.discard(head)
            due.append((head, reads.popleft()))
        return due

    def flush(self) -> list[tuple[Key, Any]]:
        """Returns every pair held back, in announced order, and forgets the
        keys that never arrived (their batch ended without a sample)."""
        keys = [key for key in self._expected if key in self._arrived]
        due = [(key, self._reads.popleft()) for key in keys]
        self._expected.clear()
        self._arrived.clear()
        return due
