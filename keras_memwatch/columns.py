"""The column vocabulary shared by probes, the recorder and the readers.

Units are bytes everywhere in data. A value a source cannot give is missing
(`None` in a row, `<NA>` in a DataFrame), never 0 and never a guess.
"""

from __future__ import annotations

ALLOCATOR_CURRENT = "allocator_current_bytes"
ALLOCATOR_PEAK = "allocator_peak_bytes"
ALLOCATOR_LIMIT = "allocator_limit_bytes"
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
    NVML_USED,
    NVML_TOTAL,
    PROCESS,
    HOST_RSS,
    HOST_PEAK_RSS,
)

#: Columns derived per sample from the sources and the detector.
BYTES_COLUMNS: tuple[str, ...] = (
    "peak_bytes",
    "current_bytes",
    "baseline_bytes",
) + SOURCE_COLUMNS

#: Every DataFrame column, in order.
COLUMNS: tuple[str, ...] = (
    "step",
    "epoch",
    "batch",
    "phase",
    "device",
    "time_s",
    "peak_bytes",
    "current_bytes",
    "baseline_bytes",
    "spike",
) + SOURCE_COLUMNS

PHASES: tuple[str, ...] = ("train", "test", "predict")

HOST_DEVICE = "host"
