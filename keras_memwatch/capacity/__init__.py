"""What fits: the largest training batch under a device's memory limit.

`estimate_max_batch_size` gathers a record of evidence (`evidence`): each
observation a batch size, what a step of it needed, how that was obtained,
and whether it ran. One rule turns the record into every answer
(`CapacityEstimate.batch_size_for`). The modules, in the order a run uses
them:

- `batches`: the sample batch grown to any size, trained as `fit` trains;
- `model_state`: building the model, and putting its state back after;
- `device`: the device's limit, memory in use and peaks;
- `steps`, `xla`, `fresh_process`: the ways of measuring (real steps, XLA's
  plans, jobs in new processes), each answering "what does batch b need,
  and does it run?";
- `search`: which sizes to ask about (the `ladder`, then checks, each
  round's sizes from `proposals`), within a `deadline`, with
  `calibration` of XLA's quick plans, until the `brackets` of every
  answer are closed; `stored_record` keeps a JAX estimate's record beside
  the compilation cache for the next;
- `evidence`: the record and its rule;
- `progress`: what a person sees while it runs;
- `result`: `CapacityEstimate`, the answers and their text;
- `estimate`: `estimate_max_batch_size`.

Figures measured on real models, with the commands that reproduce them,
are in `docs/capacity.md`. This package imports no framework until a
function runs.
"""

from __future__ import annotations

from keras_memwatch.capacity.estimate import METHODS, estimate_max_batch_size
from keras_memwatch.capacity.evidence import (
    AIMED,
    JOB,
    PLAN,
    STEP,
    Evidence,
    Line,
    Observation,
)
from keras_memwatch.capacity.result import CapacityEstimate

__all__ = [
    "AIMED",
    "JOB",
    "METHODS",
    "PLAN",
    "STEP",
    "CapacityEstimate",
    "Evidence",
    "Line",
    "Observation",
    "estimate_max_batch_size",
]
