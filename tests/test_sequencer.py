"""The sequencer releases samples in announced order, whatever the arrival."""

import random
import threading
from concurrent.futures import ThreadPoolExecutor

from keras_memwatch.sequencer import Sequencer


def test_in_order_arrivals_are_released_at_once():
    lock = threading.Lock()
    seq = Sequencer(lock)
    with lock:
        seq.expect(1)
        seq.expect(2)
        assert seq.arrive(1, "a") == [(1, "a")]
        assert seq.arrive(2, "b") == [(2, "b")]


def test_an_early_arrival_waits_for_the_one_before():
    lock = threading.Lock()
    seq = Sequencer(lock)
    with lock:
        for k in (1, 2, 3):
            seq.expect(k)
        assert seq.arrive(2, "b") == []
        assert seq.arrive(3, "c") == []
        assert seq.arrive(1, "a") == [(1, "a"), (2, "b"), (3, "c")]


def test_unannounced_keys_are_released_immediately():
    lock = threading.Lock()
    seq = Sequencer(lock)
    with lock:
        assert seq.arrive("x", 1) == [("x", 1)]


def test_flush_releases_what_waits_behind_a_key_that_never_came():
    lock = threading.Lock()
    seq = Sequencer(lock)
    with lock:
        for k in (1, 2, 3):
            seq.expect(k)
        seq.arrive(3, "c")
        seq.arrive(2, "b")
        assert seq.flush() == [(2, "b"), (3, "c")]
        assert seq.arrive(9, "z") == [(9, "z")]  # nothing left expected


def test_wait_turn_gives_up_after_max_wait():
    lock = threading.Lock()
    seq = Sequencer(lock, max_wait_s=0.05)
    with lock:
        seq.expect(1)
        seq.expect(2)
        seq.wait_turn(2)  # 1 never arrives: returns after the timeout
        assert seq.arrive(2, "b") == []


def test_many_threads_arriving_shuffled_come_out_in_order():
    lock = threading.Lock()
    seq = Sequencer(lock, max_wait_s=5.0)
    released = []
    keys = list(range(10_000))
    with lock:
        for k in keys:
            seq.expect(k)

    def hook(k):
        with lock:
            seq.wait_turn(k)
            released.extend(seq.arrive(k, k))

    # Out of order only within small windows, as a thread pool would be.
    order = sorted(keys, key=lambda k: k + random.Random(k).random() * 8)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(hook, order))
    assert [k for k, _ in released] == keys
