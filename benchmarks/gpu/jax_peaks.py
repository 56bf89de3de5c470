"""Whether a JAX fit's peaks count each step once (issue 38), on a GPU.

Trains a stack of separable convolutions on batches of 16 images with one
of 96 every 13th, for 3 epochs with validation, under `MemWatch`, and
checks what MemWatch says against XLA's plans:

- the summary's peak is within 5% of the training state plus the largest
  plan's working part (the largest step's own need);
- no ordinary batch's peak is twice that of its ordinary neighbours (a
  reading that caught a step in flight, counted again, did that);
- every training row's peak is at most its reading plus its plan;
- each batch's `mem_*` figures in Keras's logs are its row's, or a prior
  batch's under the `_prior_batch` names (with `--workers N`, a threaded
  `PyDataset`).

On the GPU (JAX with CUDA; Keras from wheels, no TensorFlow):

    KERAS_BACKEND=jax python3 -m benchmarks.gpu.jax_peaks --gpu --workers 2

On the CPU it runs small sizes, where the host's peak comes from its own
source, not from a plan: the first three checks need a GPU and are
reported as not applicable; the logs check runs. Prints the figures, then
one JSON line; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import Any

import keras
import numpy as np

from benchmarks.models import conv_stack

MIB = 2**20

# (CPU, GPU): image side, channels, layers, usual and large batch, every,
# batches an epoch, validation batches.
SIZES = {False: (32, 16, 2, 4, 24, 13, 26, 4), True: (128, 128, 4, 16, 96, 13, 52, 8)}


class BatchLogs(keras.callbacks.Callback):
    """Keeps each training batch's logs as the callbacks after MemWatch see
    them, by `(epoch, batch)`. Async-safe, so that Keras dispatches hooks as
    with MemWatch alone (a callback with a batch-end hook that is not makes
    Keras run every hook in order)."""

    async_safe = True

    def __init__(self):
        super().__init__()
        self.logs, self.epoch, self._lock = {}, 0, threading.Lock()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        with self._lock:
            self.logs[(self.epoch, batch)] = dict(logs or {})


def run(gpu: bool, epochs: int = 3, workers: int = 0,
        probes: Any = "auto") -> dict[str, Any]:
    """Trains and checks; returns the figures, the checks and the summary
    (`probes` goes to `MemWatch`)."""
    from keras_memwatch import MemWatch
    from keras_memwatch.cli.demo import OversizedBatches
    from keras_memwatch.judge import xla_plan
    from keras_memwatch.judge.derived import main_device, peaks_from_plan

    side, channels, layers, small, large, every, batches, validation = SIZES[gpu]
    keras.utils.set_random_seed(0)
    model = conv_stack(side, channels, layers, separable=True)
    pipeline = dict(workers=workers, use_multiprocessing=False) if workers else {}
    train = OversizedBatches(batches=batches, batch_size=small, oversized=large,
                             every=every, input_shape=(side, side, 3), classes=10,
                             **pipeline)
    valid = OversizedBatches(batches=validation, batch_size=small, oversized=small,
                             every=validation + 1, input_shape=(side, side, 3),
                             classes=10, seed=1)
    watch, seen = MemWatch(probes=probes, verbose=0), BatchLogs()
    model.fit(train, validation_data=valid, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[watch, seen])

    frame = watch.to_dataframe()
    device = main_device(frame["device"].astype(str).unique())
    rows = frame[frame["device"].astype(str) == device]
    steps = rows[(rows["phase"] == "train") & rows["batch"].notna()]
    # What ran at each step: Keras's PyDataset with workers hands the
    # batches over in another order than their indices (a rotation), so the
    # steps that trained an oversized batch are those with its larger plan.
    if peaks_from_plan(rows, device):
        oversized = steps["plan_bytes"] == steps["plan_bytes"].max()
    else:
        oversized = steps["batch"].isin(train.oversized_indices)
    summary_peak = watch.breakdown()["devices"][device]["peak_bytes"]
    out: dict[str, Any] = {
        "device": device, "epochs": epochs, "workers": workers,
        "summary_peak_mib": summary_peak / MIB,
        "flagged": watch.spikes.query("phase == 'train'")[["epoch", "batch"]]
        .values.tolist(),
        "oversized": steps.loc[oversized, ["epoch", "batch"]].astype(int)
        .values.tolist(),
    }
    checks: dict[str, Any] = {}
    if peaks_from_plan(rows, device):
        import jax

        state = sum(xla_plan.device_bytes(leaf) for leaf in
                    jax.tree_util.tree_leaves(xla_plan.training_state(model)))
        largest = int(steps["plan_bytes"].max()) - state
        expected = state + largest
        out.update(state_mib=state / MIB, largest_working_mib=largest / MIB,
                   expected_peak_mib=expected / MIB)
        checks["summary peak within 5% of state + largest plan"] = (
            abs(summary_peak - expected) <= 0.05 * expected)
        ratio = _largest_neighbour_ratio(steps[~oversized])
        out["ordinary_peak_over_neighbours"] = ratio
        checks["no ordinary peak twice its neighbours'"] = ratio < 2
        over = steps["peak_bytes"] > steps["current_bytes"] + steps["plan_bytes"]
        out["rows_above_reading_plus_plan"] = int(over.sum())
        checks["every peak at most reading + plan"] = not over.any()
    own, prior, wrong = logs_against_rows(steps, seen.logs)
    out.update(logs_own=own, logs_prior_batch=prior, logs_wrong=wrong)
    checks["batch logs are their row's or named prior"] = wrong == 0
    out["checks"] = checks
    out["summary"] = watch.summary()
    return out


def _largest_neighbour_ratio(ordinary: Any) -> float:
    """The largest peak of an ordinary batch over the mean of its ordinary
    neighbours' (in step order)."""
    peaks = ordinary["peak_bytes"].astype("float64").to_numpy()
    if len(peaks) < 3:
        return float("nan")
    neighbours = (peaks[:-2] + peaks[2:]) / 2
    return float(np.nanmax(peaks[1:-1] / neighbours))


def logs_against_rows(steps: Any, logs: dict) -> tuple[int, int, int]:
    """Of the batches in `logs` (`BatchLogs.logs`), how many carry their
    row's figures under `mem_peak_mib` and `mem_current_mib`, how many an
    earlier batch's row's under the `_prior_batch` names, and how many
    anything else (missing, both, or figures of no such row).

    Args:
        steps: one device's training rows (`MemWatch.to_dataframe()`).
        logs: `(epoch, batch)` -> the batch's logs.
    """
    figures = {(int(e), int(b)): (p / MIB, c / MIB) for e, b, p, c in zip(
        steps["epoch"], steps["batch"], steps["peak_bytes"], steps["current_bytes"])}
    own = prior = wrong = 0
    for at, batch_logs in logs.items():
        mine = (batch_logs.get("mem_peak_mib"), batch_logs.get("mem_current_mib"))
        earlier = (batch_logs.get("mem_peak_mib_prior_batch"),
                   batch_logs.get("mem_current_mib_prior_batch"))
        if mine == figures.get(at) and earlier == (None, None):
            own += 1
        elif mine == (None, None) and earlier in [f for k, f in figures.items()
                                                  if k < at]:
            prior += 1
        else:
            wrong += 1
    return own, prior, wrong


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="the GPU's sizes")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0,
                        help="threads of the training PyDataset (0: none)")
    args = parser.parse_args(argv)
    out = run(args.gpu, args.epochs, args.workers)
    print(out.pop("summary"))
    print()
    for key in ("device", "summary_peak_mib", "state_mib", "largest_working_mib",
                "expected_peak_mib", "ordinary_peak_over_neighbours",
                "rows_above_reading_plus_plan", "logs_own", "logs_prior_batch",
                "logs_wrong"):
        if key in out:
            value = out[key]
            shown = f"{value:.2f}" if isinstance(value, float) else value
            print(f"{key}: {shown}")
    print(f"flagged {len(out['flagged'])} of {len(out['oversized'])} oversized "
          f"batches; {sum(f not in out['oversized'] for f in out['flagged'])} others")
    if len(out["checks"]) == 1:
        print("not applicable (no device whose peaks come from XLA's plan: run "
              "on a GPU): the peak checks")
    for name, ok in out["checks"].items():
        print(f"{'PASS' if ok else 'FAIL'}: {name}")
    print(json.dumps(out))
    return 0 if all(out["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
