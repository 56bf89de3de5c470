"""The sequencer pairs reads, in the order taken, with batches, in the order
announced, whatever order the hooks arrive in."""

import random
import threading
from concurrent.futures import ThreadPoolExecutor

from keras_memwatch.record.sequencer import Sequencer


def announced(*keys):
    seq = Sequencer()
    for k in keys:
        seq.expect(k)
    return seq


def test_in_order_arrivals_are_released_at_once():
    seq = announced(1, 2)
    assert seq.arrive(1, "a") == [(1, "a")]
    assert seq.arrive(2, "b") == [(2, "b")]


def test_an_early_arrival_is_held_back_and_reads_keep_their_order():
    # Batch 2's hook read first: that read is the earlier one, so it is
    # batch 1's; the later reads follow in the order they were taken.
    seq = announced(1, 2, 3)
    assert seq.arrive(2, "first") == []
    assert seq.arrive(3, "second") == []
    assert seq.arrive(1, "third") == [(1, "first"), (2, "second"), (3, "third")]


def test_an_unannounced_key_takes_its_place_after_the_announced_ones():
    assert announced().arrive("x", 1) == [("x", 1)]
    seq = announced(1)
    assert seq.arrive("x", "a") == []  # after 1, which has not come
    assert seq.arrive(1, "b") == [(1, "a"), ("x", "b")]


def test_flush_releases_what_waits_behind_a_key_that_never_came():
    seq = announced(1, 2, 3)
    seq.arrive(3, "c")
    seq.arrive(2, "b")
    assert seq.flush() == [(2, "c"), (3, "b")]
    assert seq.arrive(9, "z") == [(9, "z")]  # nothing left expected


def test_many_threads_arriving_shuffled_come_out_in_order_with_reads_in_order():
    lock = threading.Lock()
    seq = Sequencer()
    released = []
    keys = list(range(10_000))
    for k in keys:
        seq.expect(k)
    reads = iter(range(10_000))

    def hook(k):
        with lock:  # as MemWatch reads: the read and its hand-in together
            released.extend(seq.arrive(k, next(reads)))

    # Out of order only within small windows, as a thread pool would be.
    order = sorted(keys, key=lambda k: k + random.Random(k).random() * 8)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(hook, order))
    assert [k for k, _ in released] == keys
    assert [r for _, r in released] == list(range(10_000))
