"""Which layer, on decoder language models (issue 46), on a GPU.

Splits one training step of keras-hub decoders with
`keras_memwatch.memory_by_layer(..., expand_blocks=True)` and prints, per
model: the top rows (the loss, the blocks, the parts of a block), the
rest's share of the step's working memory, the rows' sum against the step
(and, on PyTorch, against a warm `fit` step measured apart with
`torch.cuda.max_memory_allocated`), and the seconds it took. Models:

- `gpt2`: keras-hub GPT-2 base (12 layers, width 768, vocabulary 50,257),
  sequence 512, batch 8;
- `llama`: a Llama shape (8 layers, width 1024, 16 query and 8 key-value
  heads, feed-forward 2816, vocabulary 32,000), sequence 512, batch 8;
- `qwen2`: Qwen2, 4 layers, width 512, vocabulary 32,000, sequence 512,
  batch 8 (held out in the first round; its GPU figures shaped the second);
- `mistral`: held out (not run on a GPU while the code was written;
  Mistral, 4 layers, width 512, 8 query and 4 key-value heads, a sliding
  window of 256 over sequences of 512), batch 8;
- `gemma`: held out from every change before 2026-12-05 (Gemma, 4 layers,
  width 512, 8 query heads on 1 key-value head of 64, tied embeddings
  that make the logits through `ReversibleEmbedding`), sequence 512,
  batch 8;
- `opt` and `phi3`: written after the buffer-sharing rule (2026-12-06), run
  with `--models`: keras-hub OPT (6 layers, width 1024, vocabulary 50,272,
  tied embeddings as GPT-2's) and Phi-3 (6 layers, width 1024, vocabulary
  32,064, untied logits), sequence 512, batch 8.

On PyTorch, before the split, each model takes one `fit` step (`--cold`
skips it; JAX's split compiles the step and runs none), so
the step split is a warm one, as the reference is: what a process's first
step holds that a later one does not is not in it (on the CPU, 9 MiB more
held as the backward pass begins, for the tiny GPT-2).

Each run writes its rows to `--json`; `--compare A.json B.json` (no
backend needed) prints each row's `activation_bytes` on both backends,
their ratio, whether they agree within 25%, and the JAX row's note.

    KERAS_BACKEND=torch python3 -m benchmarks.gpu.by_layer_lm --json torch.json
    KERAS_BACKEND=jax python3 -m benchmarks.gpu.by_layer_lm --json jax.json \
        --against torch.json
    python3 -m benchmarks.gpu.by_layer_lm --compare torch.json jax.json

Each run ends with one `TARGET` line per model: the rest's share (at most
15%), the rows' sum against the reference (within 5%), and, with
`--against`, the blocks whose `activation_bytes` agree within 25% (or
differ with a note on the JAX row).

`--small` runs tiny versions of the same models (width 64, 2 layers,
vocabulary 8,000, sequence 64, batch 8: a CPU check, about a minute per
backend; on PyTorch with `MALLOC_MMAP_THRESHOLD_=131072`, so that the
host's resident memory follows the tensors alive).

`--replay DIR RUNS.json` gives, on any machine, the JAX tables a GPU run
would give with this code: each model's split reads the HLO text that run
kept (`--hlo-dir DIR`) as XLA compiled it for the GPU, and its working
memory from that run's `--json`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Optional

FULL = {
    "gpt2": dict(vocab=50257, layers=12, width=768, heads=12, ffn=3072, seq=512,
                 batch=8),
    "llama": dict(vocab=32000, layers=8, width=1024, heads=16, kv_heads=8,
                  ffn=2816, seq=512, batch=8),
    "qwen2": dict(vocab=32000, layers=4, width=512, heads=8, kv_heads=4, ffn=1536,
                  seq=512, batch=8),
    "mistral": dict(vocab=32000, layers=4, width=512, heads=8, kv_heads=4,
                    ffn=1536, seq=512, batch=8, window=256),
    "gemma": dict(vocab=32000, layers=4, width=512, heads=8, kv_heads=1,
                  head_dim=64, ffn=2048, seq=512, batch=8),
    "opt": dict(vocab=50272, layers=6, width=1024, heads=16, ffn=4096, seq=512,
                batch=8),
    "phi3": dict(vocab=32064, layers=6, width=1024, heads=16, kv_heads=16,
                 ffn=2816, seq=512, batch=8),
}
SMALL = {  # the sizes of tests/explain/test_by_layer_lm.py
    "gpt2": dict(vocab=8000, layers=2, width=64, heads=2, ffn=256, seq=64, batch=8),
    "llama": dict(vocab=8000, layers=2, width=64, heads=4, kv_heads=2, ffn=128,
                  seq=64, batch=8),
    "qwen2": dict(vocab=8000, layers=2, width=64, heads=4, kv_heads=2, ffn=128,
                  seq=64, batch=8),
    "mistral": dict(vocab=8000, layers=2, width=64, heads=4, kv_heads=2, ffn=128,
                    seq=64, batch=8, window=32),
    "gemma": dict(vocab=8000, layers=2, width=64, heads=4, kv_heads=1, head_dim=16,
                  ffn=128, seq=64, batch=8),
    "opt": dict(vocab=8000, layers=2, width=64, heads=4, ffn=256, seq=64, batch=8),
    "phi3": dict(vocab=8000, layers=2, width=64, heads=4, kv_heads=4, ffn=128,
                 seq=64, batch=8),
}
AGREE = 0.25  # within 25%


#: keras-hub's class prefix of each model (`<prefix>Backbone`,
#: `<prefix>CausalLM`)
CLASSES = {"gpt2": "GPT2", "llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral",
           "gemma": "Gemma", "opt": "OPT", "phi3": "Phi3"}
#: the backbones that take the sequence length
TAKE_LENGTH = ("gpt2", "opt", "phi3")


def build(name: str, c: dict[str, int]) -> Any:
    import keras
    import keras_hub

    args = dict(vocabulary_size=c["vocab"], num_layers=c["layers"],
                hidden_dim=c["width"], intermediate_dim=c["ffn"])
    if "kv_heads" in c:  # grouped-query attention
        args.update(num_query_heads=c["heads"], num_key_value_heads=c["kv_heads"])
    else:
        args.update(num_heads=c["heads"])
    if name in TAKE_LENGTH:
        args.update(max_sequence_length=c["seq"])
    if "window" in c:
        args.update(sliding_window=c["window"])
    if "head_dim" in c:
        args.update(head_dim=c["head_dim"])
    prefix = CLASSES[name]
    backbone = getattr(keras_hub.models, f"{prefix}Backbone")(**args)
    model = getattr(keras_hub.models, f"{prefix}CausalLM")(
        backbone=backbone, preprocessor=None)
    model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=["accuracy"])
    return model


def batch(c: dict[str, int]) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (c["batch"], c["seq"])
    x = {"token_ids": rng.integers(0, c["vocab"], shape).astype("int32"),
         "padding_mask": np.ones(shape, "int32")}
    return x, rng.integers(0, c["vocab"], shape).astype("int32")


def reference(model: Any, x: Any, y: Any) -> tuple[Optional[int], str]:
    """A warm `fit` step's peak, measured apart (PyTorch on a CUDA device)."""
    import keras

    if keras.backend.backend() != "torch":
        return None, "none apart from XLA's plan"
    import torch

    if not torch.cuda.is_available():
        return None, "no CUDA device"
    n = keras.tree.flatten(x)[0].shape[0]
    keras.Model.fit(model, x, y, batch_size=n, epochs=1, verbose=0)  # warm
    # A step frees the `.grad` the last one left (Keras's torch step calls
    # `zero_grad` first): drop them before, or the step reads low by them.
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    keras.Model.fit(model, x, y, batch_size=n, epochs=1, verbose=0)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before,
            "torch.cuda.max_memory_allocated during a warm fit step")


def _int(value: Any) -> Optional[int]:
    import pandas as pd

    return None if pd.isna(value) else int(value)


def split(name: str, c: dict[str, int], top: int, warm: bool = True
          ) -> dict[str, Any]:
    import keras

    from keras_memwatch import memory_by_layer
    from keras_memwatch.explain.layers import LOSS, REST, UPDATE, format_by_layer

    model = build(name, c)
    x, y = batch(c)
    warm = warm and keras.backend.backend() == "torch"  # JAX runs no step
    if warm:  # a process's first step holds some things a later one does not
        keras.Model.fit(model, x, y, batch_size=c["batch"], epochs=1, verbose=0)
    began = time.perf_counter()
    table = memory_by_layer(model, x, y, expand_blocks=True)
    seconds = time.perf_counter() - began
    print(f"--- {name} on {keras.backend.backend()}", file=sys.stderr)
    print(format_by_layer(table, top=top), file=sys.stderr)
    loss = table.set_index("layer").loc[LOSS]
    print(f"  loss row: activations {loss['activation_bytes']}, gradients "
          f"{loss['grad_bytes']}, measured backward "
          f"{loss['measured_backward_bytes']}: {loss['note']}", file=sys.stderr)
    working = table.attrs["working_bytes"]
    rest = _int(table.set_index("layer").loc[REST, "working_bytes"])
    ref, ref_words = reference(model, x, y)
    root = model.backbone.name + "/"
    rows = [{"layer": r["layer"].removeprefix(root), "class": r["class"],
             "activation_bytes": _int(r["activation_bytes"]),
             "working_bytes": _int(r["working_bytes"]), "note": r["note"]}
            for r in table.to_dict("records")]
    explained = None if working is None or rest is None else working - rest
    return {
        "model": name, "config": c, "backend": keras.backend.backend(),
        "rows": rows, "working_bytes": working,
        "working_source": table.attrs["working_source"],
        "logits_bytes": c["batch"] * c["seq"] * c["vocab"] * 4,
        "loss_bytes": _int(table.set_index("layer").loc[LOSS, "working_bytes"]),
        "rest_bytes": rest,
        "rest_share": None if not working or rest is None else round(rest / working, 3),
        "rows_sum_bytes": explained,
        "reference_bytes": ref, "reference_source": ref_words,
        "rows_sum_over_reference": (None if not ref or explained is None
                                    else round(explained / ref, 3)),
        "update_bytes": _int(table.set_index("layer")["working_bytes"].get(UPDATE)),
        # JAX: the phase of the plan's peak, the forward bytes the backward
        # pass reads and those of no row; PyTorch: every saved tensor and
        # what was in use as the backward pass began.
        **{k: table.attrs.get(k) for k in ("peak_phase", "kept_bytes",
                                           "unowned_kept_bytes", "saved_bytes",
                                           "held_at_backward_bytes")},
        "warm": warm, "seconds": round(seconds, 1),
    }


def blocks(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Each top-level row's activations, its parts' added (a block whole)."""
    out: dict[str, int] = {}
    for r in rows:
        head = r["layer"].split("/", 1)[0]
        out[head] = out.get(head, 0) + (r["activation_bytes"] or 0)
    return out


def compare(a_path: Any, b_path: Any) -> dict[str, tuple[int, int, int]]:
    """Prints each row's activations on two backends (JSON files, or the
    runs themselves) and their agreement.

    Returns:
        model -> `(blocks within 25%, blocks beyond it with a note, blocks)`.
    """
    def runs(source: Any) -> dict[str, Any]:
        loaded = json.load(open(source)) if isinstance(source, str) else source
        return {r["model"]: r for r in loaded}

    a_runs, b_runs = runs(a_path), runs(b_path)
    from keras_memwatch.units import format_bytes

    counts: dict[str, tuple[int, int, int]] = {}
    for name in sorted(a_runs.keys() & b_runs.keys()):
        a, b = a_runs[name], b_runs[name]
        print(f"\n{name}: {a['backend']} vs {b['backend']} (activation_bytes)")
        notes = {r["layer"]: r["note"] for r in b["rows"]}
        for r in b["rows"]:  # a block's notes: its own and its parts'
            head = r["layer"].split("/", 1)[0]
            if r["note"] and head != r["layer"]:
                notes[head] = "; ".join(filter(None, (notes.get(head), r["note"])))
        for level, (ra, rb) in (("block", (blocks(a["rows"]), blocks(b["rows"]))),
                                ("row", ({r["layer"]: r["activation_bytes"] or 0
                                          for r in a["rows"]},
                                         {r["layer"]: r["activation_bytes"] or 0
                                          for r in b["rows"]}))):
            big = max(max(ra.values(), default=0), 1)
            agree = noted = total = 0
            for layer, va in ra.items():
                vb = rb.get(layer)
                if vb is None or max(va, vb) < 0.01 * big:
                    continue  # rows under 1% of the largest: not compared
                ratio = vb / va if va else float("inf")
                ok = abs(ratio - 1) <= AGREE
                total += 1
                agree += ok
                noted += not ok and bool(notes.get(layer))
                if level == "block" or not ok:
                    print(f"  {level:5} {layer[:58]:58} {format_bytes(va):>10} "
                          f"{format_bytes(vb):>10} {ratio:6.2f} "
                          f"{'ok' if ok else 'NO'} {notes.get(layer, '')[:70]}")
            print(f"  {level}s within {AGREE:.0%}: {agree} of {total}; beyond it "
                  f"with a note on JAX: {noted}")
            if level == "block":
                counts[name] = (agree, noted, total)
    return counts


def targets(run: dict[str, Any], agreement: Optional[tuple[int, int, int]]) -> str:
    """The run's line against issue 46's targets."""
    share, ratio = run["rest_share"], run["rows_sum_over_reference"]
    parts = [f"TARGET {run['model']} {run['backend']}:",
             f"rest {share if share is not None else 'n/a'} "
             f"({'ok' if share is not None and abs(share) <= 0.15 else 'NO'}, "
             f"at most 0.15)"]
    if ratio is not None:
        parts.append(f"sum/reference {ratio} "
                     f"({'ok' if abs(ratio - 1) <= 0.05 else 'NO'}, within 0.05)")
    if agreement is not None:
        agree, noted, total = agreement
        parts.append(f"blocks agree {agree}/{total}, differ with a note {noted}/"
                     f"{total - agree} "
                     f"({'ok' if agree + noted == total else 'NO'})")
    return " ".join(parts)


def _plain_read_plan() -> Any:
    from keras_memwatch.explain.layers import jax_plan

    return getattr(jax_plan.read_plan, "__wrapped__", jax_plan.read_plan)


def _keep_hlo(folder: str, name: str) -> None:
    """Writes the HLO text the JAX split reads to `folder/<name>.hlo.gz`."""
    import gzip
    import os

    from keras_memwatch.explain.layers import jax_plan

    read = _plain_read_plan()
    os.makedirs(folder, exist_ok=True)

    def keeping(hlo: str, is_loss: Any, gpu: bool = False) -> Any:
        with gzip.open(os.path.join(folder, f"{name}.hlo.gz"), "wt") as f:
            f.write(hlo)
        return read(hlo, is_loss, gpu=gpu)

    keeping.__wrapped__ = read  # type: ignore[attr-defined]
    jax_plan.read_plan = keeping


def _replay(folder: str, runs: str, name: str) -> None:
    """Makes the JAX split of `name` read a GPU run's plan: its HLO text in
    `folder/<name>.hlo.gz`, its working memory in the JSON `runs`."""
    import gzip
    import os

    from keras_memwatch.explain.layers import jax_plan
    from keras_memwatch.judge import xla_plan

    with gzip.open(os.path.join(folder, f"{name}.hlo.gz"), "rt") as f:
        hlo = f.read()
    with open(runs) as f:
        working = next(r["working_bytes"] for r in json.load(f) if r["model"] == name)
    read, lower = _plain_read_plan(), getattr(xla_plan.lower_step, "__wrapped__",
                                              xla_plan.lower_step)
    state: list[int] = [0]

    def replaying(_: str, is_loss: Any, gpu: bool = False) -> Any:
        return read(hlo, is_loss, gpu=True)

    def lowering(*args: Any, **kwargs: Any) -> Any:
        lowered, state[0], rest = lower(*args, **kwargs)
        return lowered, state[0], rest

    replaying.__wrapped__, lowering.__wrapped__ = read, lower  # type: ignore
    jax_plan.read_plan, xla_plan.lower_step = replaying, lowering
    xla_plan.planned_bytes = lambda compiled: working + state[0]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny models (CPU)")
    parser.add_argument("--models", default="gpt2,llama,mistral,gemma")
    parser.add_argument("--top", type=int, default=8, help="rows listed")
    parser.add_argument("--json", default=None, help="write the runs here")
    parser.add_argument("--compare", nargs=2, default=None, metavar="JSON")
    parser.add_argument("--against", default=None, metavar="JSON",
                        help="the other backend's runs: print the agreement")
    parser.add_argument("--cold", action="store_true",
                        help="split the model's first step (no fit step before)")
    parser.add_argument("--hlo-dir", default=None, metavar="DIR",
                        help="JAX: keep each model's compiled step, as the split "
                             "read it, in DIR/<model>.hlo.gz (to read it again "
                             "elsewhere with jax_plan.read_plan)")
    parser.add_argument("--replay", nargs=2, default=None, metavar=("DIR", "JSON"),
                        help="JAX: split each model as a GPU run compiled it "
                             "(its --hlo-dir and --json)")
    args = parser.parse_args(argv)
    if args.compare:
        compare(*args.compare)
        return 0
    sizes = SMALL if args.small else FULL
    runs = []
    for name in args.models.split(","):
        if args.hlo_dir:
            _keep_hlo(args.hlo_dir, name)
        if args.replay:
            _replay(*args.replay, name)
        run = split(name, sizes[name], args.top, warm=not args.cold)
        runs.append(run)
        print(json.dumps({k: v for k, v in run.items() if k != "rows"}), flush=True)
        if args.json:  # after each model: a run cut off keeps what it did
            with open(args.json, "w") as f:
                json.dump(runs, f, indent=1)
    agreement = compare(args.against, runs) if args.against else {}
    for run in runs:
        print(targets(run, agreement.get(run["model"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
