"""Scale: one million samples through the recorder, the streamed CSV log
and the spike detector, outside any fit, a block of 128 samples at a time
as the pipeline hands them over; and the pipeline's whole cost a sample.

Two devices are recorded, as on a one-GPU machine: the host (2 source
columns) and a GPU with the 6 GPU source columns. Memory per row is the
size of the recorder's arrays (numpy allocates them exactly) divided by
rows, each device counting its table and half of the samples' shared
columns; the bounded ring (`max_rows`) is measured the same way.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.common import MIB, spread

HOST_SOURCES = ("host_rss_bytes", "host_peak_rss_bytes")
GPU_SOURCES = ("allocator_current_bytes", "allocator_peak_bytes",
               "allocator_limit_bytes", "nvml_used_bytes", "nvml_total_bytes",
               "process_bytes")
DEVICES = ("host", "GPU:0")
BLOCK = 128  # the pipeline's block


def _block(start: int, n: int) -> Any:
    """Samples `start` to `start + n` of both devices, as the pipeline fills
    them (baselines, an occasional spike)."""
    from keras_memwatch.record.block import MISSING, Block

    i = np.arange(start, start + n)
    rss = 900 * MIB + (i % 97) * 4096
    gpu = 2000 * MIB + (i % 89) * 65536
    host = np.column_stack([rss + 8192, rss, rss + 4096, np.full(n, MISSING),
                            rss, rss + 8192])
    dev = np.column_stack([gpu + MIB, gpu, gpu, np.full(n, MISSING), gpu,
                           gpu + MIB, np.full(n, 100 * 1024 * MIB), gpu + 600 * MIB,
                           np.full(n, 141 * 1024 * MIB), gpu + 500 * MIB])
    return Block(i, i // 1000, i % 1000, np.zeros(n, np.int8), i * 1e-3,
                 [host, dev], [np.zeros(n, bool), i % 50 == 0])


def _memory(recorder: Any) -> list[dict[str, float]]:
    blocks = recorder._blocks
    rows = min(blocks.kept, recorder.max_rows or blocks.kept)
    arrays = [list(parts) for parts in zip(*(blocks.joined + blocks.waiting))]
    nbytes = [sum(a.nbytes for a in parts) for parts in arrays]
    meta, d = sum(nbytes[:4]), len(recorder.devices)
    out = []
    for k, device in enumerate(recorder.devices):
        own = nbytes[4 + k] + nbytes[4 + d + k] + meta / d
        out.append({"device": device, "rows": rows,
                    "used_bytes_per_row": own / max(rows, 1),
                    "allocated_bytes_per_row": own / max(blocks.kept, 1),
                    "allocated_mib": own / MIB})
    return out


def _fill(n: int, max_rows=None, devices=DEVICES) -> tuple[Any, float]:
    from keras_memwatch.record.recorder import Recorder

    recorder = Recorder(max_rows)
    recorder.reset({d: {"host": HOST_SOURCES, "GPU:0": GPU_SOURCES}[d]
                    for d in devices})
    blocks = [_block(k * BLOCK, BLOCK) for k in range(8)] + [_block(0, n % BLOCK)]
    if devices != DEVICES:
        for b in blocks:
            b.tables, b.spikes = b.tables[:1], b.spikes[:1]
    gc.collect()
    t = time.perf_counter()
    for k in range(n // BLOCK):
        recorder.extend(blocks[k & 7])
    recorder.extend(blocks[-1])
    return recorder, (time.perf_counter() - t) / n


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
    from keras_memwatch.record.block import table_columns
    from keras_memwatch.record.csvlog import CsvLog

    layout = [table_columns(HOST_SOURCES), table_columns(GPU_SOURCES)]
    blocks = [_block(k * BLOCK, BLOCK) for k in range(8)]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "log.csv")
        log = CsvLog(path)
        t = time.perf_counter()
        for k in range(n // BLOCK):  # as the pipeline streams: a write a block
            log.write_text(log.format(blocks[k & 7], DEVICES, layout))
        s = time.perf_counter() - t
        log.close()
        size = os.path.getsize(path)
    n = n // BLOCK * BLOCK
    return {"samples": n, "rows": 2 * n, "s": s,
            "us_per_sample": s / n * 1e6, "rows_per_s": 2 * n / s,
            "bytes_per_row": size / (2 * n)}


def pipeline_cost(n: int, repeats: int) -> dict[str, Any]:
    """Thread CPU time a sample of the pipeline's whole work (pairing,
    tables, judging, recording, with and without the streamed log), with a
    JAX-like GPU (a high-water mark and XLA's plan), the host and NVML,
    drained a block of 128 at a time."""
    from keras_memwatch import columns as C
    from keras_memwatch.judge.block_judge import BlockJudge
    from keras_memwatch.record.csvlog import CsvLog
    from keras_memwatch.record.log_stream import LogStream
    from keras_memwatch.record.pipeline import Pipeline
    from keras_memwatch.record.probes.base import Probe
    from keras_memwatch.record.probes.host import HostProbe
    from keras_memwatch.record.recorder import Recorder
    from keras_memwatch.record.sampler import Sampler
    from keras_memwatch.judge.detector import SpikeSettings
    from keras_memwatch.judge.spikes import SpikeMonitor
    from keras_memwatch.judge.step_plan import StepPlan

    class Gpu(Probe):
        name, sees_all_gpus = "gpu", False
        columns = (C.ALLOCATOR_CURRENT, C.ALLOCATOR_PEAK, C.ALLOCATOR_LIMIT,
                   C.ALLOCATOR_RESERVED)
        i = 0

        def start(self):
            return ("GPU:0",)

        def read(self):
            self.i += 1
            return ((500 * MIB + self.i % 7 * MIB, 900 * MIB, 16 << 30, 1 << 30),)

    class Nvml(Probe):
        name, sees_all_gpus, min_interval_s = "nvml", True, 1.0
        columns = (C.NVML_USED, C.NVML_TOTAL, C.PROCESS)

        def start(self):
            return ("GPU:0",)

        def read(self):
            return ((2 << 30, 140 << 30, 1 << 30),)

    class Planner:
        compilations: list = []
        plan = StepPlan(600 * MIB, 100 * MIB)

        def take(self, key):
            return self.plan

    def once(streamed: bool, folder: str) -> float:
        sampler = Sampler([Gpu(), HostProbe(), Nvml()])
        devices = sampler.start()
        recorder = Recorder()
        recorder.reset(sampler.device_columns)
        monitor = SpikeMonitor(devices, SpikeSettings(50, 1.5, 64, 5), alert=False,
                               planned=("GPU:0",), per_step_peak=sampler.per_step_peak,
                               peak_at=sampler.peak_at)
        log = CsvLog(os.path.join(folder, f"{time.perf_counter_ns()}.csv")) if streamed else None
        consumers = [("judge", BlockJudge(monitor, Planner())),
                     ("record", recorder.extend)]
        if log is not None:
            consumers.append(("stream", LogStream(log, sampler)))
        pipe = Pipeline(sampler, consumers)
        spent = 0
        for b in range(n // BLOCK * BLOCK):
            key = ("train", 0, b)
            pipe.expect(key)
            pipe.pending.append((key, time.perf_counter(), sampler.read()))
            if len(pipe.pending) == BLOCK:
                t = time.thread_time_ns()
                pipe.drain()
                spent += time.thread_time_ns() - t
        if log is not None:
            log.close()
        sampler.close()
        return spent / 1e3 / (n // BLOCK * BLOCK)

    with tempfile.TemporaryDirectory() as folder:
        return {"samples": n // BLOCK * BLOCK, "block": BLOCK,
                "us_per_sample": min(once(False, folder) for _ in range(repeats)),
                "streamed_us_per_sample": min(once(True, folder)
                                              for _ in range(repeats))}


def detector_costs(n: int, repeats: int) -> dict[str, Any]:
    from benchmarks.detector_cost import cost_us

    return {f"window={w}": {"us_per_update": cost_us(w, n, repeats),
                            "updates": n, "repeats": repeats}
            for w in (50, 1000)}


def run_scale(samples: int = 1_000_000, csv_samples: int = 200_000,
              ring: int = 100_000, detector_n: int = 200_000,
              repeats: int = 3) -> dict[str, Any]:
    recorder, append_s = _fill(samples)
    memory = _memory(recorder)
    frame_two = _time_frame(recorder, repeats)
    del recorder
    gc.collect()
    host, _ = _fill(samples, devices=DEVICES[:1])
    frame_host = _time_frame(host, repeats)
    del host
    gc.collect()
    ring_recorder, ring_append_s = _fill(samples, max_rows=ring)
    ring_memory = _memory(ring_recorder)
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
        "pipeline": pipeline_cost(max(csv_samples // 4, BLOCK), repeats),
        "detector": detector_costs(detector_n, repeats),
        "growth": "linear (unbounded record, a constant number of bytes per row) "
                  "by default; bounded with max_rows",
    }
