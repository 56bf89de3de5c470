"""What room a variant meets in the measuring process, beside the user's
model, on PyTorch under a cap (issue 47: the leaner optimizers' rows read
one size low against jobs).

One process: the user's model trains a step (as before `ways_to_fit`),
then for the optimizer variant (`--setting`) it prints the allocator's
bytes at each stage and tries sizes with real steps two ways (the
variant alone, in a new process, is `ways_check trial`'s):

1. `widened`: as `ways_to_fit` measures, the user's replaced optimizer
   slots held on the card and the cap widened by their bytes;
2. `offloaded`: the held slots moved to host memory, the cap as it was.

At each stage it also counts the bytes of the live tensors (each storage
once) on the model's device, so that a tensor kept alive by mistake shows
as bytes the variables do not account for. On the CPU (no cap, so every
size runs) that count is the whole check:

    KERAS_BACKEND=torch python3 -m benchmarks.gpu.ways_room gpt2 --limit-mb 8192 \\
        --sizes 13,14,15 [--steps 30] [--break-cycles]
    KERAS_BACKEND=torch python3 -m benchmarks.gpu.ways_room gpt2_cpu --limit-mb 0 --sizes 8
"""

from __future__ import annotations

import argparse
import gc
import json
from typing import Any

from keras_memwatch.units import format_bytes
from keras_memwatch.variables import variable_bytes


def _live_bytes(torch: Any, device: Any) -> int:
    """Bytes of the live tensors on `device`, each storage once."""
    seen, total = set(), 0
    for o in gc.get_objects():
        if type(o) in (torch.Tensor, torch.nn.Parameter) and o.device == device:
            storage = o.untyped_storage()
            if storage.data_ptr() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def _state(torch: Any, device: Any, words: str, model: Any) -> None:
    gc.collect()
    line = f"  {words}: live tensors {format_bytes(_live_bytes(torch, device))}"
    if device.type == "cuda":
        torch.cuda.synchronize()
        line += (f", allocated {format_bytes(torch.cuda.memory_allocated())}, "
                 f"reserved {format_bytes(torch.cuda.memory_reserved())}")
    print(f"{line} (the model's variables {format_bytes(variable_bytes(model.variables))}"
          f", its optimizer's {format_bytes(variable_bytes(model.optimizer.variables))})",
          flush=True)


def _tries(model: Any, x: Any, y: Any, sizes: list[int], torch: Any,
           steps: int) -> dict[int, bool]:
    from keras_memwatch.measure.batches import Batches, fit_steps
    from keras_memwatch.oom_errors import is_oom_error

    ran = {}
    data = Batches(x, y)
    for b in sizes:
        try:
            fit_steps(model, data.take(b), steps)
            ran[b] = True
        except Exception as e:  # noqa: BLE001
            if not is_oom_error(e):
                raise
            ran[b] = False
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return ran


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--limit-mb", type=float, default=8192)
    parser.add_argument("--sizes", default="13,14,15")
    parser.add_argument("--setting", default='{"optimizer": "sgd"}')
    parser.add_argument("--steps", type=int, default=2, help="steps a size trains")
    parser.add_argument("--break-cycles", action="store_true",
                        help="keras_memwatch.break_tree_cycles() first")
    args = parser.parse_args()
    if args.break_cycles:
        from keras_memwatch import break_tree_cycles

        break_tree_cycles()
    if args.limit_mb:
        from keras_memwatch import configure_memory

        configure_memory(memory_limit_mb=args.limit_mb)
    import torch

    from benchmarks.models import build, data
    from keras_memwatch.measure.batches import Batches, fit_steps
    from keras_memwatch.ways import room
    from keras_memwatch.ways.variant import Setting, realized

    sizes = [int(s) for s in args.sizes.split(",")]
    model = build(args.model)
    x, y = data(args.model, max(sizes))
    fit_steps(model, Batches(x, y).take(1), 1)
    device = model.trainable_variables[0].value.device
    _state(torch, device, "the user's model after a step", model)
    result: dict[str, Any] = {}
    setting = Setting.from_dict(json.loads(args.setting))
    before = room.state_variables(model, model.optimizer)  # the user's state
    with realized(model, Batches(x, y), max(sizes), setting) as v:
        _state(torch, device, f"variant built ({format_bytes(v.held_bytes)} held)",
               v.model)
        with room.widened("torch", None, v.held_bytes) as widened:
            print(f"  cap widened by {format_bytes(widened)}", flush=True)
            result["widened"] = _tries(v.model, x, y, sizes, torch, args.steps)
            _state(torch, device, "after the tries, held slots on the device", v.model)
        if device.type == "cuda":
            variant_state = {id(u) for u in room.state_variables(v.model,
                                                                   v.model.optimizer)}
            moved = [var.value for var in before if id(var) not in variant_state]
            for tensor in moved:
                tensor.data = tensor.data.to("cpu")
            torch.cuda.empty_cache()
            _state(torch, device, f"{len(moved)} held variables moved to the host",
                   v.model)
            result["offloaded"] = _tries(v.model, x, y, sizes, torch, args.steps)
            for tensor in moved:
                tensor.data = tensor.data.to(device)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
