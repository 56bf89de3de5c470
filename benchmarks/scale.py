"""Scale: one million samples through the recorder, the streamed CSV log
and the spike detector, outside any fit (pure Python and pandas).

Two devices are recorded, as on a one-GPU machine: the host (2 source
columns) and a GPU with the 6 GPU source columns. Memory per row is the
allocated size of the recorder's typed columns (`sys.getsizeof` of each
`array.array`, which counts its over-allocation), divided by rows; the
bounded ring (`max_rows`) is measured the same way.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
import time
from typing import Any

from benchmarks.common import MIB, spread

HOST_SOURCES = ("host_rss_bytes", "host_peak_rss_bytes")
GPU_SOURCES = ("allocator_current_bytes", "allocator_peak_bytes",
               "allocator_limit_bytes", "nvml_used_bytes", "nvml_total_bytes",
               "process_bytes")


def _rows(i: int) -> list[dict]:
    """One sample's rows (host, GPU:0), as the sampler and monitor fill them."""
    rss = 900 * MIB + (i % 97) * 4096
    gpu = 2000 * MIB + (i % 89) * 65536
    host = {"host_rss_bytes": rss, "host_peak_rss_bytes": rss + 8192,
            "current_bytes": rss, "peak_bytes": rss + 8192,
            "baseline_bytes": rss + 4096, "spike": False}
    dev = {"allocator_current_bytes": gpu, "allocator_peak_bytes": gpu + MIB,
           "allocator_limit_bytes": 100 * 1024 * MIB,
           "nvml_used_bytes": gpu + 600 * MIB, "nvml_total_bytes": 141 * 1024 * MIB,
           "process_bytes": gpu + 500 * MIB, "current_bytes": gpu,
           "peak_bytes": gpu + MIB, "baseline_bytes": gpu, "spike": i % 50 == 0}
    return [host, dev]


def _columns_bytes(recorder: Any) -> list[dict[str, float]]:
    out = []
    for device, store in zip(recorder.devices, recorder._columns):
        rows = min(store.total, store.max_rows or store.total)
        used = sum(len(c) * c.itemsize for c in store.data)
        allocated = sum(sys.getsizeof(c) for c in store.data)
        out.append({"device": device, "rows": rows, "columns": len(store.data),
                    "used_bytes_per_row": used / max(rows, 1),
                    "allocated_bytes_per_row": allocated / max(rows, 1),
                    "allocated_mib": allocated / MIB})
    return out


def _fill(n: int, max_rows=None) -> tuple[Any, float]:
    from keras_memwatch.recorder import Recorder

    recorder = Recorder(max_rows)
    recorder.reset({"host": HOST_SOURCES, "GPU:0": GPU_SOURCES})
    samples = [_rows(i) for i in range(64)]
    append = recorder.append
    gc.collect()
    t = time.perf_counter()
    for i in range(n):
        append(i // 1000, i % 1000, "train", i * 1e-3, samples[i & 63])
    return recorder, (time.perf_counter() - t) / n


def _host_only(n: int) -> Any:
    from keras_memwatch.recorder import Recorder

    recorder = Recorder()
    recorder.reset({"host": HOST_SOURCES})
    rows = [_rows(i)[:1] for i in range(64)]
    append = recorder.append
    for i in range(n):
        append(i // 1000, i % 1000, "train", i * 1e-3, rows[i & 63])
    return recorder


def _time_frame(recorder: Any, repeats: int) -> dict[str, Any]:
    times = []
    frame = None
    for _ in range(repeats):
        frame = None
        gc.collect()
        t = time.perf_counter()
        frame = recorder.to_dataframe()
        times.append(time.perf_counter() - t)
    return {"rows": len(frame), "s": spread(times),
            "frame_bytes_per_row": float(frame.memory_usage(deep=True).sum())
            / max(len(frame), 1)}


def csv_throughput(n: int) -> dict[str, Any]:
    from keras_memwatch.csvlog import CsvLog

    devices = ("host", "GPU:0")
    samples = [_rows(i) for i in range(64)]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "log.csv")
        log = CsvLog(path)
        fmt, block = log.format, []
        t = time.perf_counter()
        for i in range(n):  # as the pipeline streams: 32 samples a write
            block.append(fmt(i, i // 1000, i % 1000, "train", i * 1e-3, devices,
                             samples[i & 63]))
            if len(block) == 32:
                log.write_text("".join(block))
                block = []
        log.write_text("".join(block))
        s = time.perf_counter() - t
        log.close()
        size = os.path.getsize(path)
    return {"samples": n, "rows": 2 * n, "s": s,
            "us_per_sample": s / n * 1e6, "rows_per_s": 2 * n / s,
            "bytes_per_row": size / (2 * n)}


def detector_costs(n: int, repeats: int) -> dict[str, Any]:
    from benchmarks.detector_cost import cost_us

    return {f"window={w}": {"us_per_update": cost_us(w, n, repeats),
                            "updates": n, "repeats": repeats}
            for w in (50, 1000)}


def run_scale(samples: int = 1_000_000, csv_samples: int = 200_000,
              ring: int = 100_000, detector_n: int = 200_000,
              repeats: int = 3) -> dict[str, Any]:
    recorder, append_s = _fill(samples)
    memory = _columns_bytes(recorder)
    frame_two = _time_frame(recorder, repeats)
    del recorder
    gc.collect()
    host = _host_only(samples)
    frame_host = _time_frame(host, repeats)
    del host
    gc.collect()
    ring_recorder, ring_append_s = _fill(samples, max_rows=ring)
    ring_memory = _columns_bytes(ring_recorder)
    frame_ring = _time_frame(ring_recorder, 1)
    del ring_recorder
    gc.collect()
    return {
        "samples": samples,
        "append_us_per_sample": append_s * 1e6,
        "memory": memory,
        "to_dataframe_host_only": frame_host,
        "to_dataframe_host_and_gpu": frame_two,
        "ring": {"max_rows": ring, "memory": ring_memory,
                 "append_us_per_sample": ring_append_s * 1e6,
                 "to_dataframe": frame_ring},
        "csv": csv_throughput(csv_samples),
        "detector": detector_costs(detector_n, repeats),
        "growth": "linear (unbounded record, a constant number of bytes per row) "
                  "by default; bounded with max_rows",
    }
