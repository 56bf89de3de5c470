"""What is derived from a record: each figure defined once, for every output.

The callback, the summary, the plot, the OOM report and the command line
all take these from here, so they always agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from keras_memwatch import columns as C

#: The sources of a device's limit, best first: what the framework's
#: allocator may use, else the whole device.
LIMIT_SOURCES = (C.ALLOCATOR_LIMIT, C.NVML_TOTAL)


def device_limit(row: Mapping[str, Any]) -> tuple[Optional[int], Optional[str]]:
    """`(bytes, column)` of a device's limit in one row, or `(None, None)`.

    The allocator's limit where the framework has one, else NVML's total.
    """
    for column in LIMIT_SOURCES:
        try:
            value = int(row.get(column))  # None, NaN and NA raise
        except (TypeError, ValueError):
            continue
        if value > 0:
            return value, column
    return None, None
