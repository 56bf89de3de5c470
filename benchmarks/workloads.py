"""The models, data and spike scenario the fit-based benchmarks train on.

Sizes are picked per device: on a GPU the MLP is dispatch-bound (a step of
about 1 ms on an H200), on the CPU both models take a few ms a step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.common import import_keras


@dataclass(frozen=True)
class Workload:
    name: str
    input_shape: tuple
    batch_size: int
    classes: int
    description: str


# (cpu, gpu) variants
WORKLOADS = {
    "mlp": (
        Workload("mlp", (128,), 64, 10, "MLP 128-256-256-10, batch 64"),
        Workload("mlp", (512,), 256, 10, "MLP 512-512-512-10, batch 256"),
    ),
    "convnet": (
        Workload("convnet", (32, 32, 3), 32, 10,
                 "convnet 2x conv(16,32)+pool, 32x32x3, batch 32"),
        Workload("convnet", (32, 32, 3), 128, 10,
                 "convnet 2x conv(32,64)+pool, 32x32x3, batch 128"),
    ),
}


def workload(name: str, gpu: bool) -> Workload:
    return WORKLOADS[name][1 if gpu else 0]


def build_model(w: Workload, gpu: bool) -> Any:
    keras = import_keras()
    layers = keras.layers
    keras.utils.set_random_seed(0)
    if w.name == "mlp":
        width = 512 if gpu else 256
        model = keras.Sequential([
            keras.Input(w.input_shape),
            layers.Dense(width, activation="relu"),
            layers.Dense(width, activation="relu"),
            layers.Dense(w.classes),
        ])
    else:
        a, b = (32, 64) if gpu else (16, 32)
        model = keras.Sequential([
            keras.Input(w.input_shape),
            layers.Conv2D(a, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(b, 3, padding="same", activation="relu"),
            layers.GlobalAveragePooling2D(),
            layers.Dense(w.classes),
        ])
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def make_data(w: Workload, steps: int, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    n = steps * w.batch_size
    x = rng.normal(size=(n, *w.input_shape)).astype("float32")
    y = rng.integers(0, w.classes, size=(n,)).astype("int32")
    return x, y


# -- the spike scenario ----------------------------------------------------
# Mostly small batches, an oversized one now and then, as in
# tests/scenarios/oversized_batches.py. On the CPU: 45 batches of 4 images
# 64x64x3 through two 64-channel convolutions, 96 images every 15th, judged
# on host peak RSS. On a GPU: 60 batches of 8 images 128x128x3 through four
# 128-channel convolutions, 128 images every 20th, judged on the allocator.
# Activations dominate, so each oversized batch raises the step's peak
# several times above the usual working memory. Fit with shuffle=False, so
# batch i is item i.


@dataclass(frozen=True)
class SpikeScenario:
    small: int
    large: int
    every: int
    batches: int
    side: int
    channels: int
    layers: int

    def oversized(self) -> list[int]:
        return [i for i in range(self.batches) if (i + 1) % self.every == 0]

    def describe(self) -> str:
        return (f"{self.batches} batches of {self.small} images "
                f"{self.side}x{self.side}x3 through {self.layers} "
                f"{self.channels}-channel convolutions, {self.large} images "
                f"every {self.every}th")


def spike_scenario(gpu: bool, batches: int | None = None) -> SpikeScenario:
    s = (SpikeScenario(8, 128, 20, 60, 128, 128, 4) if gpu
         else SpikeScenario(4, 96, 15, 45, 64, 64, 2))
    if batches is not None:
        s = SpikeScenario(s.small, s.large, s.every, batches, s.side,
                          s.channels, s.layers)
    return s


def spike_dataset(s: SpikeScenario) -> Any:
    keras = import_keras()

    class Oversized(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            self.rng = np.random.default_rng(0)

        def __len__(self):
            return s.batches

        def __getitem__(self, index):
            n = s.large if (index + 1) % s.every == 0 else s.small
            x = self.rng.normal(size=(n, s.side, s.side, 3)).astype("float32")
            y = self.rng.integers(0, 10, size=(n,))
            return x, y

    return Oversized()


def spike_model(s: SpikeScenario) -> Any:
    keras = import_keras()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((s.side, s.side, 3))]
        + [keras.layers.Conv2D(s.channels, 3, padding="same", activation="relu")
           for _ in range(s.layers)]
        + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
