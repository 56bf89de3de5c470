"""The demo: why does training need so much more memory than the model?

A deep convnet trained with Adam on a data pipeline that now and then
yields an oversized batch, watched by `MemWatch`. By default it is a
scaled-down version that runs on a CPU in about a minute; `seed_model=True`
builds the full-size network of the classic question (22 Conv2D layers of
1024 3x3 filters on 16x16x1 inputs: 206.6 M parameters, 826 MB of float32
weights, and 1.65 GB more for Adam's two slots), for a GPU.

This module imports Keras: choose the backend (`KERAS_BACKEND`) before
importing it. `python -m keras_memwatch demo` does that for you.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import keras
import numpy as np

__all__ = ["DemoConfig", "OversizedBatches", "build_model", "run_demo"]


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """The shape of a demo network and of its batches.

    Attributes:
        input_shape: one sample's shape.
        conv_layers: number of Conv2D layers (3x3, `same` padding, relu).
        channels: filters of each Conv2D layer.
        classes: outputs of the final Dense softmax layer.
        batch_size: the usual batch size.
        oversized: the size of an oversized batch.
        every: every `every`-th batch is oversized.
    """

    input_shape: tuple[int, ...]
    conv_layers: int
    channels: int
    classes: int
    batch_size: int
    oversized: int
    every: int

    def describe(self) -> str:
        """The network in words."""
        shape = "x".join(str(d) for d in self.input_shape)
        return (f"{self.conv_layers} Conv2D layers of {self.channels} 3x3 "
                f"filters on {shape} inputs, Flatten, Dense({self.classes})")


#: The scaled-down network: wide inputs and few channels, so a step's
#: activations dominate and an oversized batch shows in host memory.
SMALL = DemoConfig(input_shape=(64, 64, 1), conv_layers=4, channels=32,
                   classes=32, batch_size=8, oversized=96, every=15)

#: The network of the classic question: 206.6 M parameters.
SEED = DemoConfig(input_shape=(16, 16, 1), conv_layers=22, channels=1024,
                  classes=32, batch_size=32, oversized=256, every=15)


def build_model(config: DemoConfig = SMALL) -> keras.Model:
    """Builds and compiles the demo convnet (Adam, sparse cross-entropy).

    Args:
        config: the network's shape. Defaults to the scaled-down `SMALL`.

    Returns:
        A compiled `keras.Sequential`.
    """
    layers: list[Any] = [keras.Input(config.input_shape)]
    layers += [keras.layers.Conv2D(config.channels, 3, padding="same",
                                   activation="relu")
               for _ in range(config.conv_layers)]
    layers += [keras.layers.Flatten(),
               keras.layers.Dense(config.classes, activation="softmax")]
    model = keras.Sequential(layers, name="deep_convnet")
    model.compile(optimizer=keras.optimizers.Adam(1e-4),
                  loss="sparse_categorical_crossentropy")
    return model


class OversizedBatches(keras.utils.PyDataset):
    """Random images and labels in batches of `batch_size`, except every
    `every`-th batch, which has `oversized` samples: a data pipeline that
    now and then yields a much larger batch (variable-length inputs,
    bucketing gone wrong, a last batch concatenated, ...).

    Args:
        batches: batches per epoch. Defaults to `45`.
        batch_size: the usual batch size. Defaults to `8`.
        oversized: the size of an oversized batch. Defaults to `96`.
        every: every `every`-th batch (indices `every - 1`,
            `2 * every - 1`, ...) is oversized. Defaults to `15`.
        input_shape: one sample's shape. Defaults to `(64, 64, 1)`.
        classes: number of label classes. Defaults to `32`.
        seed: the data's seed; batch `i` is the same in every epoch.
            Defaults to `0`.
        **kwargs: passed to `keras.utils.PyDataset` (`workers`, ...).

    Example:

    >>> data = OversizedBatches(batches=30)
    >>> data.oversized_indices
    [14, 29]
    """

    def __init__(
        self,
        batches: int = 45,
        batch_size: int = 8,
        oversized: int = 96,
        every: int = 15,
        input_shape: tuple[int, ...] = (64, 64, 1),
        classes: int = 32,
        seed: int = 0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.batches = batches
        self.batch_size = batch_size
        self.oversized = oversized
        self.every = every
        self.input_shape = tuple(input_shape)
        self.classes = classes
        self.seed = seed

    @classmethod
    def for_config(cls, config: DemoConfig, batches: int = 45,
                   **kwargs: Any) -> "OversizedBatches":
        """The pipeline that fits a `DemoConfig`'s network."""
        return cls(batches, config.batch_size, config.oversized, config.every,
                   config.input_shape, config.classes, **kwargs)

    def __len__(self) -> int:
        return self.batches

    def is_oversized(self, index: int) -> bool:
        """Whether batch `index` is an oversized one."""
        return index % self.every == self.every - 1

    @property
    def oversized_indices(self) -> list[int]:
        """The indices of the oversized batches in an epoch."""
        return [i for i in range(self.batches) if self.is_oversized(i)]

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        n = self.oversized if self.is_oversized(index) else self.batch_size
        rng = np.random.default_rng((self.seed, index))
        x = rng.random((n, *self.input_shape), dtype=np.float32)
        y = rng.integers(0, self.classes, size=(n,)).astype("int32")
        return x, y


def _has_accelerator() -> bool:
    backend = keras.backend.backend()
    try:
        if backend == "tensorflow":
            import tensorflow as tf

            return bool(tf.config.list_physical_devices("GPU"))
        if backend == "jax":
            import jax

            return any(d.platform != "cpu" for d in jax.devices())
        if backend == "torch":
            import torch

            return torch.cuda.is_available()
    except Exception:
        pass
    return False


def run_demo(
    out: str = "memwatch_demo",
    epochs: int = 2,
    steps: int = 45,
    seed_model: bool = False,
    verbose: Any = "auto",
    force: bool = False,
) -> Any:
    """Trains the demo network with MemWatch; prints what it found.

    The spike alerts (as they come) and the summary (at the end) go to the
    `keras_memwatch` logger, which `python -m keras_memwatch demo` prints;
    then it prints which oversized batches were flagged, and writes
    `memwatch.csv` (streamed during training), `memwatch.png` and, where
    plotly is installed, `memwatch.html` (the page of the run) to `out`.
    Files of an earlier run there are replaced only with `force=True`;
    nothing else in `out` is touched.

    Args:
        out: the output folder, created if needed. Defaults to
            `"memwatch_demo"`.
        epochs: epochs to train. Defaults to `2`.
        steps: batches per epoch. Defaults to `45`.
        seed_model: build the full-size network of the classic question
            (206.6 M parameters; for a GPU). Defaults to `False`.
        verbose: Keras's progress display for `fit`. Defaults to `"auto"`.
        force: replace `memwatch.csv`, `memwatch.png` and `memwatch.html`
            of an earlier run in `out`. Defaults to `False`.

    Returns:
        The `MemWatch` of the run.

    Raises:
        FileExistsError: when `out` holds `memwatch.csv`, `memwatch.png`
            or `memwatch.html` and `force` is `False`, before anything is
            trained.
    """
    from keras_memwatch import MemWatch

    config = SEED if seed_model else SMALL
    os.makedirs(out, exist_ok=True)
    csv_path = os.path.join(out, "memwatch.csv")
    png_path = os.path.join(out, "memwatch.png")
    html_path = os.path.join(out, "memwatch.html")
    there = [path for path in (csv_path, png_path, html_path) if os.path.lexists(path)]
    if there and not force:
        raise FileExistsError(
            f"{' and '.join(there)} exist (from an earlier run); pass "
            "force=True to replace them, or choose another `out`")
    if os.path.lexists(csv_path):
        os.remove(csv_path)  # force=True: MemWatch streams only to a new file

    backend = keras.backend.backend()
    accelerator = _has_accelerator()
    if seed_model and not accelerator:
        print("warning: --seed-model on a CPU: each step takes minutes and many "
              "GB of RAM; the full-size network is meant for a GPU.")
    model = build_model(config)
    data = OversizedBatches.for_config(config, batches=steps)
    print(f"keras_memwatch demo on {backend} "
          f"({'accelerator' if accelerator else 'CPU'}): {config.describe()}, "
          f"{model.count_params():,} parameters, Adam.")
    print(f"{epochs} epoch(s) of {steps} batches of {config.batch_size}; batches "
          f"{', '.join(map(str, data.oversized_indices)) or '(none)'} of each "
          f"epoch are oversized ({config.oversized}). Watch for spike alerts.\n")

    watch = MemWatch(log_path=csv_path)
    start = time.perf_counter()
    # shuffle=False: a PyDataset is otherwise served in a shuffled order,
    # and batch indices in the alerts would not match the dataset's.
    model.fit(data, epochs=epochs, callbacks=[watch], verbose=verbose,
              shuffle=False)
    seconds = time.perf_counter() - start

    print()
    print(explain(watch, data, config))
    watch.plot(png_path, overwrite=force)
    _close_figures()
    written = f"{csv_path} (one row per step per device), {png_path}"
    try:
        from keras_memwatch.explain.html import write_watch_report

        write_watch_report(watch, html_path, overwrite=force)
        written += f" and {html_path} (open it in a browser)"
    except ImportError as e:
        print(f"\nNo {html_path}: {e}")
    print(f"\nTrained in {seconds:.0f} s. Wrote {written}.")
    print(f"Read the log again with: python -m keras_memwatch report {csv_path}")
    return watch


def explain(watch: Any, data: OversizedBatches, config: DemoConfig) -> str:
    """What the demo shows: the flagged batches against the oversized ones,
    and how a step's working memory grows with its batch."""
    from keras_memwatch.units import format_bytes

    spikes = watch.spikes
    places = [(int(e), int(b)) for e, b in zip(spikes["epoch"], spikes["batch"])]
    frame = watch.to_dataframe()
    epochs = sorted(frame.loc[frame["phase"] == "train", "epoch"].unique())
    expected = {(int(e), i) for e in epochs for i in data.oversized_indices}
    caught = expected & set(places)
    missed = sorted(expected - caught)
    line = f"Oversized batches flagged: {len(caught)} of {len(expected)}"
    if missed:
        line += f" (missed, epoch/batch: {', '.join(f'{e}/{b}' for e, b in missed)})"
    lines = [line]
    others = sorted(set(places) - expected)
    if others:
        lines.append("Other flagged batches (epoch/batch): "
                     + ", ".join(f"{e}/{b}" for e, b in others))
    breakdown = watch.breakdown(batch_size=config.batch_size)
    oversized = spikes[[p in expected for p in places]]
    if breakdown["transient_bytes"] is not None and len(oversized):
        lines.append(
            f"A usual step of {config.batch_size} samples needed "
            f"{format_bytes(breakdown['transient_bytes'])} of working memory, "
            f"an oversized one of {config.oversized} up to "
            f"{format_bytes(oversized['working_bytes'].max())}: working memory "
            "grows with the batch; weights and optimizer state do not.")
    return "\n".join(lines)


def _close_figures() -> None:
    import matplotlib.pyplot as plt

    plt.close("all")
