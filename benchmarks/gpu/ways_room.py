"""What room a variant meets in the measuring process, beside the user's
model, on PyTorch under a cap (issue 47: the leaner optimizers' rows read
one size low against jobs).

One process: the user's model trains a step (as before `ways_to_fit`),
then for the optimizer variant (`--setting`) it prints the allocator's
bytes at each stage and tries sizes with real steps three ways:

1. `widened`: as `ways_to_fit` measures, the user's replaced optimizer
   slots held on the card and the cap widened by their bytes;
2. `offloaded`: the held slots moved to host memory, the cap as it was;
3. a new process (`ways_check trial`) gives the variant alone.

    KERAS_BACKEND=torch python3 -m benchmarks.gpu.ways_room gpt2 --limit-mb 8192 \\
        --sizes 13,14,15
"""

from __future__ import annotations

import argparse
import gc
import json
from typing import Any

GIB = 2**30


def _state(torch: Any, words: str) -> None:
    torch.cuda.synchronize()
    print(f"  {words}: allocated {torch.cuda.memory_allocated() / GIB:.3f} GiB, "
          f"reserved {torch.cuda.memory_reserved() / GIB:.3f} GiB", flush=True)


def _tries(model: Any, x: Any, y: Any, sizes: list[int], torch: Any) -> dict[int, bool]:
    from keras_memwatch.measure.batches import Batches, fit_steps
    from keras_memwatch.oom_errors import is_oom_error

    ran = {}
    data = Batches(x, y)
    for b in sizes:
        try:
            fit_steps(model, data.take(b), 2)
            ran[b] = True
        except Exception as e:  # noqa: BLE001
            if not is_oom_error(e):
                raise
            ran[b] = False
        gc.collect()
        torch.cuda.empty_cache()
    return ran


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--limit-mb", type=float, default=8192)
    parser.add_argument("--sizes", default="13,14,15")
    parser.add_argument("--setting", default='{"optimizer": "sgd"}')
    args = parser.parse_args()
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
    gc.collect()
    torch.cuda.empty_cache()
    _state(torch, "the user's model after a step")
    result: dict[str, Any] = {}
    setting = Setting.from_dict(json.loads(args.setting))
    before = room.state_variables(model, model.optimizer)  # the user's state
    with realized(model, Batches(x, y), max(sizes), setting) as v:
        _state(torch, f"variant built ({v.held_bytes / GIB:.3f} GiB held)")
        with room.widened("torch", None, v.held_bytes) as widened:
            print(f"  cap widened by {widened / GIB:.3f} GiB", flush=True)
            result["widened"] = _tries(v.model, x, y, sizes, torch)
            _state(torch, "after the widened tries")
        variant_state = {id(u) for u in room.state_variables(v.model, v.model.optimizer)}
        held = [var for var in before if id(var) not in variant_state]
        moved = []
        for var in held:
            tensor = var.value
            moved.append((tensor, tensor.device))
            tensor.data = tensor.data.to("cpu")
        gc.collect()
        torch.cuda.empty_cache()
        _state(torch, f"{len(moved)} held variables moved to the host")
        result["offloaded"] = _tries(v.model, x, y, sizes, torch)
        for tensor, device in moved:
            tensor.data = tensor.data.to(device)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
