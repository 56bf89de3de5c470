"""Shared fixtures and helpers: fake probes, hand-made records, tiny models,
and the GPU marker. Tests import the helpers from here."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator, Sequence
from typing import Optional

# Before Keras, matplotlib or PyTorch is imported: their caches and Keras's
# keras.json go into one folder of this run, removed at its end, so that the
# suite leaves the home folder and /tmp as it found them.
# Child processes that import this file inherit the folder.
_OWN_HOMES = "MEMWATCH_TEST_HOMES" not in os.environ
if _OWN_HOMES:
    os.environ["MEMWATCH_TEST_HOMES"] = tempfile.mkdtemp(prefix="memwatch-tests-")
_HOMES = os.environ["MEMWATCH_TEST_HOMES"]
for _name, _sub in (("KERAS_HOME", "keras"), ("MPLCONFIGDIR", "matplotlib"),
                    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
                    ("XDG_CACHE_HOME", "cache")):
    os.environ.setdefault(_name, os.path.join(_HOMES, _sub))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from keras_memwatch import columns as C  # noqa: E402
from keras_memwatch.record.block import (MISSING, PHASE_CODES, Block,  # noqa: E402
                                  table_columns)
from keras_memwatch.judge.derived import spike_table  # noqa: E402
from keras_memwatch.record.probes.base import Probe  # noqa: E402
from keras_memwatch.record.recorder import Recorder  # noqa: E402
from keras_memwatch.judge.detector import SpikeSettings  # noqa: E402
from keras_memwatch.judge.spikes import SpikeMonitor  # noqa: E402


def _gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


def pytest_sessionfinish(session, exitstatus):
    if _OWN_HOMES:
        shutil.rmtree(_HOMES, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if _gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class FakeProbe(Probe):
    """A probe that replays scripted readings for one GPU device.

    Args:
        values: successive `(current, peak)` pairs; after the last, the last
            repeats. A value that is an exception instance is raised.
    """

    name = "fake"
    columns = (C.ALLOCATOR_CURRENT, C.ALLOCATOR_PEAK, C.ALLOCATOR_LIMIT)
    peak_per_sample = True

    def __init__(self, values: Sequence, device: str = "GPU:0",
                 limit: Optional[int] = 16 * 2**30):
        self.values = list(values)
        self.device = device
        self.limit = limit
        self.calls = 0
        self.closed = 0

    def start(self) -> tuple[str, ...]:
        self.calls = 0
        return (self.device,)

    def read(self):
        value = self.values[min(self.calls, len(self.values) - 1)]
        self.calls += 1
        if isinstance(value, BaseException):
            raise value
        current, peak = value
        return ((current, peak, self.limit),)

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def fake_probe_cls():
    return FakeProbe


@pytest.fixture
def jax_config(monkeypatch):
    """JAX's cache settings as they were, after the test; the cache reset."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    before = {n: getattr(jax.config, n) for n in names}
    from keras_memwatch.configure import compilation_cache as CC

    monkeypatch.setattr(CC, "_ours", None)
    monkeypatch.setattr(CC, "_logged", None)
    yield jax
    for n, v in before.items():
        jax.config.update(n, v)
    compilation_cache.reset_cache()


@pytest.fixture
def memwatch_logs(caplog) -> Iterator[pytest.LogCaptureFixture]:
    """Captures the keras_memwatch logger at INFO and above."""
    caplog.set_level(logging.INFO, logger="keras_memwatch")
    yield caplog


def scripted(working_mib: Sequence[float], static_mib: float = 500) -> FakeProbe:
    """Fake GPU readings: train begin, then one (current, peak) per batch,
    each step needing `working_mib` on top of `static_mib` in use."""
    values = [(static_mib * MIB, static_mib * MIB)]
    values += [(static_mib * MIB, (static_mib + w) * MIB) for w in working_mib]
    return FakeProbe(values)


def tiny_model(inputs: int = 8, outputs: int = 1):
    import keras

    model = keras.Sequential([
        keras.Input((inputs,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(outputs),
    ])
    model.compile(optimizer="adam", loss="mse")
    return model


def tiny_data(n: int = 64, inputs: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, inputs)).astype("float32"),
            rng.normal(size=(n, 1)).astype("float32"))


def tiny_gpt2(vocabulary: int = 500, layers: int = 2, width: int = 32,
              sequence: int = 32, optimizer: str = "adamw"):
    """A keras-hub GPT-2 causal LM (skips where keras-hub is missing), and
    token data for it: `(model, x, y)` with 4 samples of `sequence`
    tokens."""
    import keras

    keras_hub = pytest.importorskip("keras_hub")
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocabulary, num_layers=layers, num_heads=2,
        hidden_dim=width, intermediate_dim=2 * width, max_sequence_length=sequence)
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocabulary, (4, sequence + 1)).astype("int32")
    x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((4, sequence), "bool")}
    return model, x, tokens[:, 1:]


def tiny_phi3(vocabulary: int = 97, sequence: int = 16):
    """A keras-hub Phi-3 causal LM (skips where keras-hub is missing), whose
    attention cannot run on PyTorch's meta device, and token data for it:
    `(model, x, y)` with 3 samples of `sequence` tokens."""
    import keras

    keras_hub = pytest.importorskip("keras_hub")
    backbone = keras_hub.models.Phi3Backbone(
        vocabulary_size=vocabulary, num_layers=1, hidden_dim=16, intermediate_dim=32,
        num_query_heads=2, num_key_value_heads=2)
    model = keras_hub.models.Phi3CausalLM(backbone=backbone, preprocessor=None)
    model.compile(optimizer="adamw", loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    tokens = np.random.default_rng(0).integers(0, vocabulary, (3, sequence + 1))
    x = {"token_ids": tokens[:, :-1].astype("int32"),
         "padding_mask": np.ones((3, sequence), "int32")}
    return model, x, tokens[:, 1:].astype("int32")


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Collects once, then pauses Python's collector until the block ends
    (as the user had it after), so that what reference cycles hold stays."""
    import gc

    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def arrays_of_shape(shape: tuple) -> int:
    """How many PyTorch tensors of `shape` the collector tracks (alive)."""
    import gc

    import torch

    return sum(1 for t in gc.get_objects()
               if issubclass(type(t), torch.Tensor) and tuple(t.shape) == shape)


def dense_model(optimizer):
    import keras

    # Dense 10 -> 32: 10*32 + 32 = 352; Dense 32 -> 4: 32*4 + 4 = 132.
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(32),
                              keras.layers.Dense(4)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def built(model):
    """Creates the optimizer's state, as the first training step does."""
    model.optimizer.build(model.trainable_variables)
    return model


# -- hand-made records ------------------------------------------------------

MIB = 2**20
GIB = 2**30
GPU = (C.ALLOCATOR_CURRENT, C.ALLOCATOR_PEAK, C.ALLOCATOR_LIMIT)
HOST = (C.HOST_RSS, C.HOST_PEAK_RSS)


def record(readings, device="GPU:0", sources=GPU, limit=16 * GIB,
           per_step_peak=True, epoch_of=None, phase_of=None, monitor=False,
           block=7, **detector):
    """Runs readings through the real spike monitor and recorder.

    Args:
        readings: `(current_mib, peak_mib)` per sample; the first is the
            train-begin sample, then one per batch.
        per_step_peak: False to act like JAX: the source's peak is a
            process-lifetime high-water mark, a step's peak only where it
            rose (missing elsewhere).
        epoch_of, phase_of: functions of the batch number.
        monitor: also return the `SpikeMonitor`.
        block: samples judged and recorded at a time.

    Returns:
        `(frame, spikes)` as `MemWatch.to_dataframe()` and `MemWatch.spikes`
        give them (and the monitor).
    """
    epoch_of = epoch_of or (lambda i: 0)
    phase_of = phase_of or (lambda i: "train")
    options = dict(window=50, threshold=1.5, min_delta_mb=64, warmup=5)
    options.update(detector)
    peak_column = C.ALLOCATOR_PEAK if sources == GPU else C.HOST_PEAK_RSS
    peak_at = table_columns(sources).index(peak_column)
    judge = SpikeMonitor((device,), SpikeSettings.checked(**options), alert=False,
                         per_step_peak=[per_step_peak], peak_at=[peak_at])
    recorder = Recorder()
    recorder.reset({device: sources})
    samples = []
    high_water = last_mark = None
    for step, (current, peak) in enumerate(readings):
        current, peak = current * MIB, peak * MIB
        last_mark, high_water = high_water, max(high_water or 0, peak)
        if sources == GPU:
            row = {C.ALLOCATOR_CURRENT: current, C.ALLOCATOR_LIMIT: limit,
                   C.ALLOCATOR_PEAK: peak if per_step_peak else high_water}
        else:
            row = {C.HOST_RSS: current, C.HOST_PEAK_RSS: peak}
        row["current_bytes"] = current
        # As the sampler does: a high-water mark is a step's peak only
        # where it rose since the previous sample.
        rose = last_mark is not None and high_water > last_mark
        row["peak_bytes"] = peak if per_step_peak or rose else None
        batch = None if step == 0 else step - 1
        epoch = 0 if step == 0 else epoch_of(batch)
        phase = "train" if step == 0 else phase_of(batch)
        samples.append((step, epoch, batch, phase, step * 0.1, [row]))
    for start in range(0, len(samples), block):
        part = block_of(samples[start:start + block], [sources])
        judge.judge(part, (part.phase == 0) & (part.batch >= 0))
        recorder.extend(part)
    spikes = spike_table(judge.events)
    if monitor:
        return recorder.to_dataframe(), spikes, judge
    return recorder.to_dataframe(), spikes


def steady(working_mib, in_use=500):
    """Train begin, then steps with these working memories on `in_use`."""
    return [(in_use, in_use)] + [(in_use, in_use + w) for w in working_mib]


def block_of(samples, sources):
    """A `Block` of samples given as `(step, epoch, batch, phase, time_s,
    rows)`, each row a dict of a device's columns (missing: None); `sources`
    are each device's source columns."""
    tables = [np.array([[MISSING if row.get(name) is None else row[name]
                         for name in table_columns(device_sources)]
                        for *_, rows in samples for row in rows[d:d + 1]],
                       np.int64).reshape(len(samples), -1)
              for d, device_sources in enumerate(sources)]
    steps, epochs, batches, phases, times, _ = zip(*samples)
    return Block(np.array(steps), np.array(epochs),
                 np.array([MISSING if b is None else b for b in batches]),
                 np.array([PHASE_CODES[p] for p in phases], np.int8),
                 np.array(times, float), tables,
                 [np.array([bool(rows[d].get("spike")) for *_, rows in samples])
                  for d in range(len(sources))])


GPU_SOURCES = (C.ALLOCATOR_CURRENT, C.ALLOCATOR_PEAK, C.ALLOCATOR_LIMIT)
HOST_SOURCES = (C.HOST_RSS, C.HOST_PEAK_RSS)


def gpu_row(i, spike=False):
    return {C.ALLOCATOR_CURRENT: 100 + i, C.ALLOCATOR_PEAK: 200 + i,
            C.ALLOCATOR_LIMIT: None, "current_bytes": 100 + i,
            "peak_bytes": 200 + i, "baseline_bytes": None if i < 2 else 150,
            "spike": spike}


def host_row(i):
    return {C.HOST_RSS: 1000 + i, C.HOST_PEAK_RSS: 2000 + i,
            "current_bytes": 1000 + i, "peak_bytes": 2000 + i,
            "baseline_bytes": None, "spike": False}


# -- out-of-memory errors as each framework raises them ---------------------

TORCH_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.06 GiB is free. Of the allocated memory 75.10 GiB is "
    "allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but unallocated. See "
    "documentation for Memory Management")
XLA_MESSAGE = ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
               "4294967296 bytes.")
TF_MESSAGE = ("OOM when allocating tensor with shape[4096,262144] and type float on "
              "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc")


def framework_oom():
    """A real out-of-memory exception of the active backend's framework."""
    import keras

    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        return torch.OutOfMemoryError(TORCH_MESSAGE)
    if backend == "jax":
        import jax

        return jax.errors.JaxRuntimeError(XLA_MESSAGE)
    import tensorflow as tf

    return tf.errors.ResourceExhaustedError(None, None, TF_MESSAGE)


def hidden_framework(folder, framework: str) -> str:
    """A folder to put first on PYTHONPATH so that `import framework` fails
    in a subprocess as it does where the framework is not installed."""
    from pathlib import Path

    package = Path(folder) / "hidden" / framework
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{framework}'\", "
        f"name={framework!r})\n")
    return str(package.parent)


#: The start of a child script that runs a step out of memory for real:
#: a small convnet, `vm()` (the address space mapped now), and `big`, a
#: batch whose step needs about 5 GiB of activations. The script then caps
#: its address space a little above `vm()` and trains `big`.
OUT_OF_MEMORY_CHILD = textwrap.dedent("""
    import json, logging, resource
    import numpy as np
    import keras

    model = keras.Sequential([
        keras.Input((64, 64, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer="adam", loss="mse")
    small = (np.ones((8, 64, 64, 1), "float32"), np.ones((8, 1), "float32"))
    big = (np.ones((2000, 64, 64, 1), "float32"), np.ones((2000, 1), "float32"))

    def vm():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize"):
                    return int(line.split()[1]) * 1024

    def cap_address_space():
        resource.setrlimit(resource.RLIMIT_AS,
                           (vm() + 768 * 2**20, resource.RLIM_INFINITY))
""")


def run_out_of_memory_child(tmp_path, body: str, backend: str = "jax") -> dict:
    """Runs `OUT_OF_MEMORY_CHILD` then `body` under `backend` in a new
    process, in `tmp_path`; returns the JSON object its last line prints."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (tmp_path / "child.py").write_text(OUT_OF_MEMORY_CHILD + textwrap.dedent(body))
    env = dict(os.environ, KERAS_BACKEND=backend,
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, str(tmp_path / "child.py")], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def tensors_left_by(callbacks, steps=23):
    """Torch tensors left alive after `steps` steps of `fit`, with Python's
    automatic collector off (what a job holds between its collections)."""
    import gc

    import keras
    import torch

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss="mse")
    x, y = np.zeros((steps * 4, 8), "float32"), np.zeros((steps * 4, 4), "float32")
    model.fit(x[:4], y[:4], batch_size=4, verbose=0)  # built, compiled

    def count():
        return sum(issubclass(type(o), torch.Tensor) for o in gc.get_objects())

    with collector_paused():
        before = count()
        model.fit(x, y, batch_size=4, verbose=0, callbacks=callbacks)
        return count() - before


@pytest.fixture
def tree_functions_restored(monkeypatch):
    """Keras's PyTorch tree functions are put back after the test (where a
    test calls `break_tree_cycles`)."""
    from keras.src.tree import torchtree_impl

    from keras_memwatch.configure.tree_cycles import REPLACED

    for name in REPLACED:
        monkeypatch.setattr(torchtree_impl, name, getattr(torchtree_impl, name))
