"""format_bytes writes sizes for people the same way everywhere."""

from __future__ import annotations

import math

import numpy as np
import pytest

from keras_memwatch.units import MIB, format_bytes

KIB, GIB, TIB = 2**10, 2**30, 2**40


def test_mib_is_two_to_the_twenty():
    assert MIB == 1_048_576


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (100.4, "100 B"),
        (1023.6, "1.0 KiB"),  # rounds up into the next unit
        (KIB, "1.0 KiB"),
        (12 * KIB, "12.0 KiB"),
        (1536, "1.5 KiB"),
        (MIB - 1, "1.0 MiB"),
        (MIB, "1.0 MiB"),
        (12.5 * MIB, "12.5 MiB"),
        (99.94 * MIB, "99.9 MiB"),
        (99.96 * MIB, "100 MiB"),
        (100 * MIB, "100 MiB"),
        (190 * MIB, "190 MiB"),
        (190.6 * MIB, "191 MiB"),
        (1023.4 * MIB, "1023 MiB"),
        (1023.6 * MIB, "1.00 GiB"),
        (GIB, "1.00 GiB"),
        (1.31 * GIB, "1.31 GiB"),
        (141 * GIB, "141.00 GiB"),
        (2 * TIB, "2.00 TiB"),
        (-64 * MIB, "-64.0 MiB"),
        (-512, "-512 B"),
        (np.int64(190 * MIB), "190 MiB"),
        (np.float32(2 * GIB), "2.00 GiB"),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("missing", [None, math.nan, np.nan])
def test_missing_is_not_available(missing):
    assert format_bytes(missing) == "n/a"


def test_infinity():
    assert format_bytes(math.inf) == "inf"
    assert format_bytes(-math.inf) == "-inf"


def test_not_a_number_raises():
    with pytest.raises((TypeError, ValueError)):
        format_bytes("190 MiB")
