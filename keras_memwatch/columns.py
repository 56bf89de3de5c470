"""The column vocabulary shared by probes, the recorder and the readers.

Units are bytes everywhere in data. A value a source cannot give is missing
(`None` in a row, `<NA>` in a DataFrame), never 0 and never a guess.
"""

from __future__ import annotations

ALLOCATOR_CURRENT = "allocator_current_bytes"
ALLOCATOR_PEAK = "allocator_peak_bytes"
ALLOCATOR_LIMIT = "allocator_limit_bytes"
ALLOCATOR_RESERVED = "allocator_reserved_bytes"
NVML_USED = "nvml_used_bytes"
NVML_TOTAL = "nvml_total_bytes"
PROCESS = "process_bytes"
HOST_RSS = "host_rss_bytes"
HOST_PEAK_RSS = "host_peak_rss_bytes"

#: Columns filled by probes, in DataFrame order.
SOURCE_COLUMNS: tuple[str, ...] = (
    ALLOCATOR_CURRENT,
    ALLOCATOR_PEAK,
    ALLOCATOR_LIMIT,
    ALLOCATOR_RESERVED,
    NVML_USED,
    NVML_TOTAL,
    PROCESS,
    HOST_RSS,
    HOST_PEAK_RSS,
)

PLAN = "plan_bytes"

#: Columns derived per sample from the sources, the detector and (JAX)
#: XLA's compiled plan of the step.
DERIVED_COLUMNS: tuple[str, ...] = (
    "peak_bytes",
    "current_bytes",
    "baseline_bytes",
    PLAN,
)

#: Every bytes column, in DataFrame order but for `spike` between them.
BYTES_COLUMNS: tuple[str, ...] = DERIVED_COLUMNS + SOURCE_COLUMNS

#: Which process of a distributed run wrote a row, and on which machine.
PROCESS_COLUMNS: tuple[str, ...] = ("process", "hostname")

#: Which call of `fit`, `evaluate` or `predict` a row belongs to: 0 for the
#: first of a watch's record, 1 for the next... (`step` counts from 0 in each).
CALL = "call"

#: Columns with one value for all the rows of one call (of one log file).
CALL_COLUMNS: tuple[str, ...] = PROCESS_COLUMNS + (CALL,)

#: Seconds since the call began, and UNIX seconds: one time axis across
#: calls and processes.
TIME_S, TIMESTAMP = "time_s", "timestamp"

#: Every DataFrame column, in order.
COLUMNS: tuple[str, ...] = (
    "step",
    "epoch",
    "batch",
    "phase",
    "device",
    TIME_S,
    TIMESTAMP,
    "peak_bytes",
    "current_bytes",
    "baseline_bytes",
    "spike",
    PLAN,
) + SOURCE_COLUMNS + CALL_COLUMNS

PHASES: tuple[str, ...] = ("train", "test", "predict")

#: Where the bytes columns begin in `COLUMNS`.
FIRST_BYTES = COLUMNS.index(TIMESTAMP) + 1

HOST_DEVICE = "host"
