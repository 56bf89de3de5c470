"""Checks that a spike at a batch of unusual input shape names its layer.

Each model is fit for two epochs on batches of `--short`-token sequences,
except every `--every`-th batch, which is `--long` tokens long, with
MemWatch's default probes (on a GPU: the allocator or XLA's plan, and
NVML). Models: keras-hub's GPT-2 backbone with tied logits, as
`GPT2CausalLM` has them (4 layers, width 512, vocabulary 8,000) and a token transformer with a variable length (2
blocks, width 256, vocabulary 4,000), both written after the code.

    KERAS_BACKEND=jax python -m benchmarks.gpu.spike_layer_check

Prints a JSON line per model: the spikes (batch, its length, the layer
named), the named lines, and `pass`: every spike of the train phase at a
long batch names a layer, and no spike at a short batch does.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

import numpy as np


def transformer(vocab: int) -> Any:
    import keras
    from keras import layers

    tokens = keras.Input((None,), dtype="int32")
    h = layers.Embedding(vocab, 256)(tokens)
    for _ in range(2):
        a = layers.LayerNormalization()(h)
        h = h + layers.MultiHeadAttention(4, 64)(a, a, use_causal_mask=True)
        m = layers.Dense(1024, activation="gelu")(layers.LayerNormalization()(h))
        h = h + layers.Dense(256)(m)
    model = keras.Model(tokens, layers.Dense(vocab)(h), name="transformer")
    model.compile(optimizer="adamw",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def gpt2(vocab: int, long: int) -> Any:
    import keras
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=vocab, num_layers=4, num_heads=8, hidden_dim=512,
        intermediate_dim=2048, max_sequence_length=long)
    # keras-hub's own `fit` takes tf.data only: its backbone in a plain model
    # (as `GPT2CausalLM` does it), fit on a `PyDataset`.
    inputs = backbone.input
    logits = backbone.token_embedding(backbone(inputs), reverse=True)
    model = keras.Model(inputs, logits, name="gpt2")
    model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def batches(name: str, vocab: int, args: argparse.Namespace) -> Any:
    import keras

    class Batches(keras.utils.PyDataset):
        def __len__(self) -> int:
            return args.steps

        def __getitem__(self, i: int) -> Any:
            steps = args.long if i % args.every == args.every - 1 else args.short
            rng = np.random.default_rng(i)
            tokens = rng.integers(0, vocab, (args.batch, steps + 1)).astype("int32")
            x, y = tokens[:, :-1], tokens[:, 1:]
            if name == "gpt2":
                x = {"token_ids": x, "padding_mask": np.ones_like(x, bool)}
            return x, y

    return Batches()


def check(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import keras

    from keras_memwatch import MemWatch

    vocab = 8000 if name == "gpt2" else 4000
    model = gpt2(vocab, args.long) if name == "gpt2" else transformer(vocab)
    named: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "came with input" in record.getMessage():
                named.append(record.getMessage())

    logger = logging.getLogger("keras_memwatch")
    handler = Lines()
    logger.addHandler(handler)
    events = []
    watch = MemWatch(on_spike=events.append)
    try:
        model.fit(batches(name, vocab, args), epochs=2, shuffle=False,
                  callbacks=[watch], verbose=0)
    finally:
        logger.removeHandler(handler)
    spikes = [{"epoch": e.epoch, "batch": e.batch, "device": e.device,
               "long": e.batch % args.every == args.every - 1, "layer": e.layer,
               "working_mib": round(e.working_bytes / 2**20, 1),
               "usual_mib": round(e.usual_working_bytes / 2**20, 1)}
              for e in events if e.phase == "train"]
    ok = bool(spikes) and all((s["layer"] is not None) == s["long"] for s in spikes)
    return {"model": name, "backend": keras.backend.backend(),
            "devices": sorted({s["device"] for s in spikes}), "spikes": spikes,
            "named": named, "pass": ok}


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["gpt2", "transformer"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--short", type=int, default=128)
    parser.add_argument("--long", type=int, default=1024)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ok = True
    for name in args.models:
        result = check(name, args)
        ok &= result["pass"]
        print(json.dumps(result), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
