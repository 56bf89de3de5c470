"""`ways_to_fit`: the arguments, the model as it is, each lever, the best
combinations, the table."""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import time
from typing import Any, Callable, Optional, Union

import pandas as pd

from keras_memwatch import options
from keras_memwatch.capacity.deadline import Deadline
from keras_memwatch.capacity.progress import Progress
from keras_memwatch.configure.compilation_cache import use_compilation_cache
from keras_memwatch.measure.batches import Batches
from keras_memwatch.measure.model_state import state_kept
from keras_memwatch.configure.devices import device_label
from keras_memwatch.units import format_bytes
from keras_memwatch.variables import variable_bytes
from keras_memwatch.ways import table as T
from keras_memwatch.ways.levers import (LEVER_NAMES, Lever, Situation, all_levers,
                                        changes, combined, notes)
from keras_memwatch.ways.recompute import not_recomputable, refused_when_traced
from keras_memwatch.ways.failure import called_layers, failure_words, raised_error
from keras_memwatch.ways.fresh_job import FreshJobs
from keras_memwatch.ways.measure import Measured, measure
from keras_memwatch.ways.variant import Setting, realized

logger = logging.getLogger("keras_memwatch")

__all__ = ["LEVER_NAMES", "ways_to_fit"]


def ways_to_fit(
    model: Any,
    x: Any,
    y: Any = None,
    batch_size: Optional[int] = None,
    *,
    headroom: float = 0.1,
    levers: Any = "all",
    device: Optional[str] = None,
    combinations: bool = True,
    progress: Optional[Callable[[str], None]] = None,
    verbose: Union[str, int] = "auto",
    max_seconds: Optional[float] = None,
    compilation_cache: Union[None, bool, str, "os.PathLike[str]"] = None,
    fresh_process: bool = False,
) -> Any:
    """Measures what each change to a model would save at the batch you want.

    For the model as it is, then for each lever, measures the memory a
    training step needs at the wanted batch the way
    `estimate_max_batch_size` measures it (XLA's plan on JAX with a GPU,
    real steps of `fit` elsewhere: the allocator's peak on a GPU, the
    host's resident memory on a CPU, TensorFlow's CPU allocator's peak where
    it keeps statistics), and reads the largest batch under the
    headroom from that record by the estimate's rule. The levers:

    - `mixed_precision`: the model rebuilt from its config with the
      `mixed_bfloat16` policy (`mixed_float16` on a GPU without fast
      bfloat16);
    - `adafactor`, `sgd_momentum`: an optimizer with less state than
      Adam's two slots a weight;
    - `remat`: `keras.RematScope(mode="full")`; `remat_layers`: the layers
      that keep the most activations (`memory_by_layer`), by name;
    - `gradient_accumulation`: `gradient_accumulation_steps=k` on the
      optimizer, the wanted batch trained as `k` steps of `batch / k`;
    - `shorter_sequence`: token inputs cut to half their length.

    A lever that cannot apply to the model gets a row saying why and what to
    do. Then the two and three levers whose savings add up to the most are
    measured together. Every variable of the model, its optimizer and its
    metrics, its compiled train function and the global dtype policy are as
    they were afterwards.

    Args:
        model: a compiled Keras model.
        x: a sample batch of inputs (arrays, or lists/dicts of arrays),
            repeated along its first axis to make larger batches.
        y: the matching targets. Defaults to `None`.
        batch_size: the batch you want to train. Defaults to `None`: the
            number of samples in `x`.
        headroom: fraction of the limit to keep free. Defaults to `0.1`.
        levers: `"all"` or a list of lever names (`LEVER_NAMES`). Defaults
            to `"all"`.
        device: `"GPU:0"`, ... or `"host"`. Defaults to `None`: the first
            GPU the backend computes on, else the host.
        combinations: measure the best two- and three-lever combinations.
            Defaults to `True`.
        progress: receives a line per size measured. Defaults to `None`:
            the `keras_memwatch` logger at DEBUG.
        verbose: `"auto"`, `0`, `1` or `2`, as `fit`'s: `0` shows
            nothing, any other prints one line per row as it is measured
            (the lever, its need, what it saves, its largest batch, the
            seconds so far). Defaults to `"auto"`.
        max_seconds: stop measuring after this many seconds. The model as
            it is is always measured; a row whose search runs out of time
            keeps what it measured, and its `how` says what is left open;
            the rows not begun say they were not measured. Defaults to
            `None`: no limit.
        compilation_cache: JAX: a directory for JAX's persistent
            compilation cache, or `True` for the default one, as
            `estimate_max_batch_size` takes it; each row's record is kept
            there too, so that a second call compiles nothing and a `fit`
            of a row's setting in a new process finds its compilations.
            PyTorch, TensorFlow: accepted, does nothing. Defaults to
            `None`: none set.
        fresh_process: PyTorch on a GPU under a cap: train each row's
            checks near the limit as jobs of the row's change in new Python
            processes (the model built again from its config, under the
            cap), as you would run it, rather than in this process, which
            holds your model beside each change and can fit a size more or
            less than a job started afresh. A size fits where two jobs of
            it trained. Slower: a process start per job (up to four side
            by side, where the device has room). Elsewhere a warning says
            the checks train in this process. Defaults to `False`.

    Returns:
        A `pandas.DataFrame`, one row per lever: `lever`, `change` (the code
        to write), `need_bytes` (the training state plus a step's working
        memory at the wanted batch), `saved_bytes` (against the model as it
        is), `largest_batch` (under the headroom), `step_time_ratio` (time a
        sample against the model as it is, at the largest batch both
        timed), `fits` (the wanted batch, under the headroom), `how`
        (measured, plan, or why not) and `notes`. The first row is the
        model as it is (`lever="as is"`), then the levers, the most saved
        first, then the combinations. `attrs` holds
        `batch_size`, `headroom`, `device`, `limit_bytes`, `base_bytes`
        (in use apart from the model's state), `held_bytes` (each measured
        row's user state held beside its variant while it was measured,
        and what the allocator's cap was widened by for it, as
        `(held, widened)`), `settings` (each measured
        row's `variant.Setting` as a dict, to rebuild it elsewhere),
        `max_seconds`, `compilation_cache` (the directory JAX's cache
        used, or `None`) and `seconds`.

    Raises:
        ValueError: for a model that is not compiled, or a bad
            `batch_size`, `headroom`, `levers`, `device`, `max_seconds` or
            `compilation_cache`.
        TypeError: for arguments of the wrong type, or `x`/`y` that are not
            arrays.

    Example:

    ```python
    table = keras_memwatch.ways_to_fit(model, x[:16], y[:16], batch_size=64)
    print(table[["lever", "saved_bytes", "largest_batch", "fits"]])
    ```
    """
    began = time.perf_counter()
    if batch_size is not None:
        batch_size = options.positive_int("batch_size", batch_size)
    headroom = options.fraction("headroom", headroom)
    names = options.names_or_all("levers", levers, LEVER_NAMES)
    if device is not None:
        device = device_label(device, "device")
    options.boolean("combinations", combinations)
    options.boolean("fresh_process", fresh_process)
    say = options.optional_callable("progress", progress) or _log
    max_seconds = options.optional_seconds("max_seconds", max_seconds)
    cache = options.cache_directory("compilation_cache", compilation_cache)
    # a line per row, whatever the output: rows are few and long, and a
    # bar would not move between them
    shown = Progress(0 if options.verbosity("verbose", verbose) == 0 else 2,
                     None, began, unit="row")
    options.compiled_model("model", model)
    import keras

    data = Batches(x, y)
    b = batch_size or data.n
    fresh = FreshJobs(model, data) if fresh_process else None
    measuring = Measuring(device, headroom, say, Deadline(max_seconds, began),
                          use_compilation_cache(cache), fresh=fresh)
    try:
        with state_kept(model, data.take(1)):
            rows, combos, account, situation = _measure_all(
                model, data, b, names, combinations, measuring, shown)
    finally:
        if fresh is not None:
            fresh.close()
        gc.collect()
    shown.done()
    as_is = account.as_is
    first = T.measured_row(T.AS_IS, "", T.as_is_notes(as_is), as_is, account)
    return T.frame(first, rows, combos, {
        "batch_size": b, "headroom": headroom, "backend": keras.backend.backend(),
        "device": "GPU" if situation.on_gpu else "host",
        "limit_bytes": account.limit, "base_bytes": account.base,
        "held_bytes": dict(situation.rooms),
        "settings": {lever: dataclasses.asdict(setting)
                     for lever, setting in situation.settings.items()},
        "max_seconds": max_seconds,
        "compilation_cache": measuring.cache_directory,
        "seconds": round(time.perf_counter() - began, 2)})


def _log(message: str) -> None:
    logger.debug("%s", message)


@dataclasses.dataclass(frozen=True)
class Measuring:
    """How every row is measured: on `device`, checked under `headroom`,
    a line per size to `say`, within `deadline`, with JAX's compilation
    cache in `cache_directory` (or `None`), in the account of the model as
    it is once it is measured (`base_bytes`, `measure`'s), the checks as
    jobs in new processes where `fresh` is given."""

    device: Optional[str]
    headroom: float
    say: Callable[[str], None]
    deadline: Deadline
    cache_directory: Optional[str]
    base_bytes: Optional[int] = None
    fresh: Optional[FreshJobs] = None

    def __call__(self, model: Any, data: Batches, b: int, setting: Setting
                 ) -> Measured:
        fresh = self.fresh
        checks = None if fresh is None else (
            lambda steps, widened: fresh.around(steps, setting, widened))
        with realized(model, data, b, setting) as variant:
            return measure(variant, self.device, self.headroom, self.say,
                           self.deadline, self.cache_directory, self.base_bytes,
                           checks)

    def out_of_time(self) -> str:
        """Once the time has run out, since when; else `""`."""
        if not self.deadline.passed:
            return ""
        return (f"out of time (max_seconds={self.deadline.max_seconds:g}) after "
                f"{self.deadline.spent():.1f} s")


def _measure_all(model: Any, data: Batches, b: int, names: list[str],
                 combinations: bool, measuring: Measuring, shown: Progress
                 ) -> tuple[list, list, T.Account, Situation]:
    import keras

    as_is = measuring(model, data, b, Setting())
    if not as_is.on_gpu:
        # The host's first steps in a process touch memory that later ones
        # reuse, and run slower: measured again, the model as it is
        # compares with the levers.
        as_is = measuring(model, data, b, Setting())
    account = T.Account(as_is, measuring.headroom)
    measuring = dataclasses.replace(measuring, base_bytes=account.base)
    _show(shown, T.measured_row(T.AS_IS, "", "", as_is, account))
    on_gpu = as_is.on_gpu
    levers = [lever for lever in all_levers() if lever.name in names]
    situation = Situation(model, data, b, on_gpu=on_gpu,
                          bf16_slow=on_gpu and _bf16_slow(measuring.device),
                          accumulation=_accumulation(model, b, as_is, account))
    if "remat_layers" in names:
        late = measuring.out_of_time()
        situation.layers_by_activation = (
            f"the by-layer table was not made: {late}" if late
            else _layers_by_activation(model, data, b))
    if "remat" in names or "remat_layers" in names:
        situation.left_out = not_recomputable(model, keras.backend.backend())
    rows, saved = [], []
    situation.settings = {T.AS_IS: Setting()}
    situation.rooms = {T.AS_IS: (as_is.held_bytes, as_is.widened_bytes)}
    for lever in levers:
        row, m = _lever_row(lever, situation, model, data, b, measuring, account)
        _show(shown, row)
        rows.append(row)
        if m is not None:
            saved.append((lever, row["saved_bytes"]))
    combos = []
    if combinations:
        for group in T.best_combinations(saved):
            combos.append(_group_row(group, situation, model, data, b, measuring,
                                     account))
            _show(shown, combos[-1])
    return rows, combos, account, situation


def _show(shown: Progress, row: dict) -> None:
    """A row measured (or not), on the bar or as a line."""
    need, saved = row.get("need_bytes"), row.get("saved_bytes")
    if need is None or pd.isna(need):
        what = row.get("how") or "not measured"
        shown.step(f"ways_to_fit: {row['lever']}: {what}", [])
        return
    largest = row.get("largest_batch")
    words = (f"needs {format_bytes(need)}, saves {format_bytes(saved or 0)}, "
             f"largest batch {'-' if largest is None or pd.isna(largest) else largest}")
    shown.step(f"ways_to_fit: {row['lever']}: {words}", [])


def _lever_row(lever: Lever, s: Situation, model: Any, data: Batches, b: int,
               measuring: Measuring, account: T.Account
               ) -> tuple[dict, Optional[Measured]]:
    why = lever.why_not(s)
    if why:
        return T.unmeasured_row(lever.name, "", "not applied: " + why, lever.note(s)
                                if lever.name != "shorter_sequence" else ""), None
    late = measuring.out_of_time()
    if late:
        return T.unmeasured_row(lever.name, lever.change(s), f"not measured: {late}",
                                lever.note(s)), None
    try:
        setting, m = _measured([lever], s, model, data, b, measuring)
    except Exception as e:  # noqa: BLE001 - the lever's failure is its row
        logger.info("ways_to_fit: %s could not be measured: %r", lever.name, e)
        return T.unmeasured_row(lever.name, lever.change(s), failure_words(e, lever),
                                lever.note(s)), None
    s.settings[lever.name] = setting
    s.rooms[lever.name] = (m.held_bytes, m.widened_bytes)
    return T.measured_row(lever.name, lever.change(s), lever.note(s), m, account,
                          setting.accumulation), m


def _group_row(group: list[Lever], s: Situation, model: Any, data: Batches, b: int,
               measuring: Measuring, account: T.Account) -> dict:
    name = " + ".join(lever.name for lever in group)
    late = measuring.out_of_time()
    if late:
        return T.unmeasured_row(name, changes(group, s), f"not measured: {late}",
                                notes(group, s))
    try:
        setting, m = _measured(group, s, model, data, b, measuring)
    except Exception as e:  # noqa: BLE001
        return T.unmeasured_row(name, changes(group, s), failure_words(e),
                                notes(group, s))
    s.settings[name] = setting
    s.rooms[name] = (m.held_bytes, m.widened_bytes)
    return T.measured_row(name, changes(group, s), notes(group, s), m, account,
                          setting.accumulation)


def _accumulation(model: Any, b: int, as_is: Measured, account: T.Account) -> int:
    """The fewest accumulation steps (a power of two) whose device batch the
    model as it is fits, with one more slot a weight for the sums; 2 where
    the wanted batch fits already, the most where none fits."""
    if b < 2:
        return 1
    slot = variable_bytes(model.trainable_variables)
    evidence = as_is.evidence(account.base, account.limit, slot)
    largest = evidence.batch_size_for(account.headroom) if account.limit else None
    k = 2
    while largest is not None and k * 2 <= b and b // k > largest:
        k *= 2
    return k


def _layers_by_activation(model: Any, data: Batches, b: int) -> Any:
    """`(path, activation_bytes)` of each layer, blocks expanded
    (`memory_by_layer` at a small batch), or why none are known."""
    from keras_memwatch.explain.layers import STEP_ROWS, memory_by_layer

    try:
        x, y = data.take(max(1, min(b, data.n) // 2))
        layers = memory_by_layer(model, x, y, expand_nested=True, expand_blocks=True)
    except Exception as e:  # noqa: BLE001
        return f"the by-layer table could not be made ({type(e).__name__}: {e})"
    # the loss and the update are the step's, not layers a scope can name
    rows = layers[~layers["layer"].isin(STEP_ROWS)].dropna(subset=["activation_bytes"])
    return [(str(path), float(size))
            for path, size in zip(rows["layer"], rows["activation_bytes"])]


def _measured(levers: list[Lever], s: Situation, model: Any, data: Batches, b: int,
              measuring: Measuring) -> tuple[Setting, Measured]:
    """The levers' setting, measured. Where JAX refused a traced value in
    the call of a layer a lever may do without (a recomputed layer that
    branches on an argument), the lever leaves it out and the setting is
    measured again."""
    while True:
        setting = combined(levers, s)
        try:
            return setting, measuring(model, data, b, setting)
        except Exception as e:  # noqa: BLE001 - raised again unless left out
            raised = raised_error(e)
            if not refused_when_traced(raised):
                raise
            why = f"its recomputed call raised {type(raised).__name__}"
            layers = called_layers(e)
            if not any(lever.leave_out(s, layers, why) for lever in levers):
                raise


def _bf16_slow(device: Optional[str]) -> bool:
    """Whether the GPU computes bfloat16 slowly (compute capability below 8)."""
    import keras

    index = int(device.split(":")[1]) if device and ":" in device else 0
    backend = keras.backend.backend()
    try:
        if backend == "torch":
            import torch

            return torch.cuda.get_device_capability(index)[0] < 8
        if backend == "jax":
            import jax

            return float(jax.devices("gpu")[index].compute_capability) < 8
        import tensorflow as tf

        details = tf.config.experimental.get_device_details(
            tf.config.list_physical_devices("GPU")[index])
        return details.get("compute_capability", (8, 0))[0] < 8
    except Exception:  # noqa: BLE001 - unknown: bfloat16, the default
        return False
