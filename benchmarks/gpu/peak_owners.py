"""What is alive at a PyTorch job's peak on a GPU, and who allocated it.

Runs one job as `ways_check trial` runs it (a model of `benchmarks.models`
under a cap, a row's setting, one `fit`; `--collect N`: with
`CollectCycles(every=N)`) with PyTorch's allocator history recorded,
replays the record to the peak of the live bytes (or to the allocation
that ran out of memory), and prints the bytes live there by the
innermost Keras frame that allocated them, and the largest blocks.

    KERAS_BACKEND=torch python3 -m benchmarks.gpu.peak_owners resconv --size 170 \\
        --setting '{"optimizer": "sgd"}' --limit-mb 6144
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any, Optional

#: Where a frame's file says who allocated, first match wins.
_OWNERS = (("/optimizers/", "optimizer"), ("/layers/", "layer"),
           ("/trainers/", "trainer"), ("/backend/torch/", "backend"))


def owner(frames: list[dict[str, Any]]) -> str:
    """A label for an allocation from its Python frames (innermost first):
    the innermost Keras frame's role, file and function."""
    if frames and frames[0].get("name") == "<module>":  # outermost first
        frames = frames[::-1]
    for frame in frames:
        name = frame.get("filename", "")
        if "keras/src/" not in name:
            continue
        role = next((r for part, r in _OWNERS if part in name), "keras")
        return f"{role}: {name.rsplit('/', 1)[-1]}:{frame.get('name', '?')}"
    return "no Keras frame (autograd's backward runs in its own thread)"


def replay(trace: list[dict[str, Any]], before: int = 0) -> dict[str, Any]:
    """The live bytes at the trace's peak (or at its first `oom`).

    Args:
        trace: one device's events from `torch.cuda.memory._snapshot()`.
        before: the bytes allocated when the record began.

    Returns:
        `peak` (bytes, `before` included), `owners` (bytes live at the peak
        by `owner`), `largest` (the largest live blocks, `(bytes, owner)`)
        and `oom` (whether the peak is the moment an allocation failed,
        the asked bytes counted).
    """
    live: dict[int, tuple[int, str]] = {}
    held = before
    best: Optional[dict[str, Any]] = None

    def moment(extra: int = 0) -> dict[str, Any]:
        owners = Counter({"allocated before the record": held})
        for size, label in live.values():
            owners[label] += size
        blocks = sorted(live.values(), reverse=True)[:8]
        return {"peak": held + sum(s for s, _ in live.values()) + extra,
                "owners": owners, "largest": blocks, "oom": extra > 0}

    total = held
    for event in trace:
        action, size = event.get("action"), int(event.get("size", 0))
        if action == "alloc":
            live[event["addr"]] = (size, owner(event.get("frames", [])))
            total += size
            if best is None or total > best["peak"]:
                best = moment()
        elif action == "free_completed":
            if live.pop(event["addr"], None) is None:
                held -= size
            total -= size
        elif action == "oom":
            best = moment(size)
            break
    return best if best is not None else moment()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--setting", default="{}", help="a ways_to_fit row's setting")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--limit-mb", type=float, default=None)
    parser.add_argument("--collect", type=int, default=0,
                        help="CollectCycles(every=N) in the fit; 0: none")
    args = parser.parse_args(argv)
    if args.limit_mb:
        from keras_memwatch import configure_memory

        configure_memory(memory_limit_mb=args.limit_mb)
    import torch

    from benchmarks.models import build, data
    from keras_memwatch import CollectCycles
    from keras_memwatch.measure.batches import Batches, fit_steps
    from keras_memwatch.oom_errors import first_line, is_oom_error
    from keras_memwatch.ways.variant import Setting, realized

    model = build(args.model)
    sample = Batches(*data(args.model, min(args.size, 64)))
    ended = "ran"
    setting = Setting.from_dict(json.loads(args.setting))
    with realized(model, sample, args.size, setting) as v:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=2_000_000)
        try:
            fit_steps(v.model, v.data.take(v.batch_size), args.steps,
                      [CollectCycles(every=args.collect)] if args.collect else [])
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            if not is_oom_error(e):
                raise
            ended = f"out of memory: {first_line(e)}"
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    found = replay(trace, before)
    mib = 2**20
    print(f"{args.model} at {args.size}, {args.setting}: {ended}; "
          f"{len(trace)} events; allocator's peak "
          f"{torch.cuda.max_memory_allocated() / mib:.0f} MiB")
    print(f"live at the {'failed allocation' if found['oom'] else 'peak'}: "
          f"{found['peak'] / mib:.0f} MiB")
    for label, size in found["owners"].most_common(12):
        print(f"  {size / mib:9.1f} MiB  {label}")
    print("largest blocks:")
    for size, label in found["largest"]:
        print(f"  {size / mib:9.1f} MiB  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
