"""Byte sizes in words for people.

Data is in bytes everywhere; these helpers are only for text (log lines,
`summary()`, event messages), so that every module writes sizes the same way.
"""

from __future__ import annotations

import math
from typing import Optional

KIB = 2**10
MIB = 2**20
GIB = 2**30
TIB = 2**40


def format_bytes(n: Optional[float]) -> str:
    """Formats a byte count in binary units, for people.

    Below 1 KiB the count is whole bytes ("512 B"); KiB have one decimal
    ("12.0 KiB"); MiB have one decimal below 100 MiB ("37.5 MiB") and none
    from there ("190 MiB"); GiB and TiB have two decimals ("1.31 GiB"). The
    unit is chosen after rounding, so a value never reads "1024 MiB".
    Negative counts (differences) keep their sign. A missing value (`None`
    or NaN) reads "n/a".

    Args:
        n: The number of bytes, an int or a float.

    Returns:
        The size as a short string.

    Example:

    >>> format_bytes(190 * MIB)
    '190 MiB'
    >>> format_bytes(1.31 * GIB)
    '1.31 GiB'
    """
    if n is None:
        return "n/a"
    value = float(n)
    if math.isnan(value):
        return "n/a"
    sign = "-" if value < 0 else ""
    value = abs(value)
    if math.isinf(value):
        return f"{sign}inf"
    if round(value) < KIB:
        return f"{sign}{round(value)} B"
    kib = value / KIB
    if round(kib, 1) < 1024:
        return f"{sign}{kib:.1f} KiB"
    mib = value / MIB
    if round(mib) < 1024:
        if round(mib, 1) >= 100:
            return f"{sign}{mib:.0f} MiB"
        return f"{sign}{mib:.1f} MiB"
    gib = value / GIB
    if round(gib, 2) < 1024:
        return f"{sign}{gib:.2f} GiB"
    return f"{sign}{value / TIB:.2f} TiB"
