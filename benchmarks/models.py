"""The one registry of the models that benchmarks, GPU checks and test
scenarios train, with their data.

`WORKLOADS` (`mlp`, `convnet`: a CPU and a GPU size each) are the models of
the speed benchmarks; `spike_scenario` and `conv_stack` the oversized-batch
scenario; `build(name)` the models of the capacity and by-layer checks.

`conv`, `block`, `resnet`, `transformer` and `gpt` are the models of the
earlier capacity work; `resconv` (a residual convnet with batch
normalization, in mixed_float16), `gpt2` (keras-hub's GPT-2 with the base
shape: 12 layers, width 768, vocabulary 50,257, sequence 256, AdamW) and
`bert` (keras-hub's BERT base classifier, sequence 256) were written after
the capacity code, to check it on models it was not tuned on; `opt`
and `phi3` (keras-hub Phi-3, 256 tokens) after the estimate's and
`ways_to_fit`'s GPU tables. Each has a `_tiny` variant for the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.common import import_keras

def build(name: str) -> Any:
    """A compiled model, fresh."""
    import keras
    from keras import layers

    if name.startswith("resconv"):
        return build_resconv(name)
    if name in HUB:
        return build_hub(name)
    if name == "conv":
        inputs = keras.Input((64, 64, 3))
        h = inputs
        for filters in (64, 128, 256):
            h = layers.Conv2D(filters, 3, padding="same", activation="relu")(h)
            h = layers.Conv2D(filters, 3, padding="same", activation="relu")(h)
            h = layers.MaxPooling2D()(h)
        h = layers.GlobalAveragePooling2D()(h)
        outputs = layers.Dense(10)(h)
    elif name == "conv_tiny":  # for a smoke test on a CPU
        inputs = keras.Input((32, 32, 1))
        h = layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
        h = layers.Conv2D(16, 3, padding="same", activation="relu")(h)
        h = layers.GlobalAveragePooling2D()(h)
        outputs = layers.Dense(10)(h)
    elif name in TRANSFORMER:
        return build_transformer(name)
    elif name in ("resnet", "resnet_tiny"):
        return build_resnet(name)
    elif name in ("block", "block_tiny"):
        seq, dim = (256, 256) if name == "block" else (64, 32)
        inputs = keras.Input((seq, dim))
        h = inputs
        for _ in range(2):
            a = layers.LayerNormalization()(h)
            a = layers.MultiHeadAttention(num_heads=8, key_dim=dim // 8)(a, a)
            h = h + a
            m = layers.LayerNormalization()(h)
            m = layers.Dense(4 * dim, activation="gelu")(m)
            h = h + layers.Dense(dim)(m)
        h = layers.GlobalAveragePooling1D()(h)
        outputs = layers.Dense(10)(h)
    else:
        raise ValueError(f"unknown model {name!r}")
    model = keras.Model(inputs, outputs, name=name)
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


#: The transformer of issue 15: 3 blocks, sequence 192, width 384, 6 heads,
#: feed-forward 1536, vocabulary 8000, logits over the vocabulary.
TRANSFORMER = {"transformer": dict(blocks=3, seq=192, dim=384, heads=6, ff=1536,
                                   vocab=8000),
               "transformer_tiny": dict(blocks=2, seq=32, dim=64, heads=4, ff=256,
                                        vocab=1000),
               # written after the JAX search's last changes, to check them on
               # a model they were not tuned on: wider, longer, more tokens
               "gpt": dict(blocks=4, seq=256, dim=512, heads=8, ff=2048,
                           vocab=16000)}


def build_transformer(name: str) -> Any:
    """Token inputs, pre-norm causal blocks, logits over the vocabulary;
    AdamW, sparse categorical cross-entropy from logits."""
    import keras
    from keras import layers

    c = TRANSFORMER[name]
    tokens = keras.Input((c["seq"],), dtype="int32")
    h = layers.Embedding(c["vocab"], c["dim"])(tokens)
    for _ in range(c["blocks"]):
        a = layers.LayerNormalization()(h)
        a = layers.MultiHeadAttention(num_heads=c["heads"],
                                      key_dim=c["dim"] // c["heads"])(
            a, a, use_causal_mask=True)
        h = h + a
        m = layers.LayerNormalization()(h)
        m = layers.Dense(c["ff"], activation="gelu")(m)
        h = h + layers.Dense(c["dim"])(m)
    h = layers.LayerNormalization()(h)
    logits = layers.Dense(c["vocab"])(h)
    model = keras.Model(tokens, logits, name=name)
    model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def build_resnet(name: str) -> Any:
    """A small ResNet (written after `fresh_process`, to test it on a model it
    was not tuned on): a 7x7 stem, three stages of two residual blocks with
    batch normalization (64, 128, 256 filters), SGD with momentum."""
    import keras
    from keras import layers

    inputs = keras.Input(sample_shape(name))
    widths = (64, 128, 256) if name == "resnet" else (8, 16)
    h = layers.Conv2D(widths[0], 7, strides=2, padding="same", use_bias=False)(inputs)
    h = layers.ReLU()(layers.BatchNormalization()(h))
    for stage, width in enumerate(widths):
        for block in range(2):
            strides = 2 if stage and not block else 1
            shortcut = h
            r = layers.Conv2D(width, 3, strides=strides, padding="same",
                              use_bias=False)(h)
            r = layers.ReLU()(layers.BatchNormalization()(r))
            r = layers.Conv2D(width, 3, padding="same", use_bias=False)(r)
            r = layers.BatchNormalization()(r)
            if strides != 1 or shortcut.shape[-1] != width:
                shortcut = layers.Conv2D(width, 1, strides=strides,
                                         use_bias=False)(shortcut)
            h = layers.ReLU()(layers.Add()([shortcut, r]))
    h = layers.GlobalAveragePooling2D()(h)
    model = keras.Model(inputs, layers.Dense(10)(h), name=name)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def sample_shape(name: str) -> tuple[int, ...]:
    return {"resconv": (64, 64, 3), "resconv_tiny": (16, 16, 3), "conv": (64, 64, 3), "block": (256, 256), "conv_tiny": (32, 32, 1),
            "block_tiny": (64, 32), "resnet": (96, 96, 3),
            "resnet_tiny": (32, 32, 1)}[name]


def data(name: str, n: int) -> tuple[Any, Any]:
    import numpy as np

    if name in HUB:
        return hub_data(name, n)
    rng = np.random.default_rng(0)
    if name in TRANSFORMER:
        c = TRANSFORMER[name]
        tokens = rng.integers(0, c["vocab"], size=(64, c["seq"] + 1)).astype("int32")
        index = np.arange(n) % 64
        return tokens[index, :-1], tokens[index, 1:]
    base = rng.standard_normal((64,) + sample_shape(name), dtype=np.float32)
    labels = rng.integers(0, 10, size=64).astype("int32")
    index = np.arange(n) % 64
    return base[index], labels[index]


def build_resconv(name: str) -> Any:
    """Residual stages with batch normalization, in mixed_float16, Adam."""
    import keras
    from keras import layers

    keras.mixed_precision.set_global_policy("mixed_float16")
    widths = (64, 128, 256) if name == "resconv" else (8, 16)
    inputs = keras.Input(sample_shape(name))
    h = layers.Conv2D(widths[0], 3, padding="same")(inputs)
    for stage, width in enumerate(widths):
        if stage:
            h = layers.Conv2D(width, 3, strides=2, padding="same")(h)
        for _ in range(2):
            r = layers.BatchNormalization()(h)
            r = layers.Conv2D(width, 3, padding="same", activation="relu")(r)
            r = layers.BatchNormalization()(r)
            r = layers.Conv2D(width, 3, padding="same")(r)
            h = layers.ReLU()(layers.Add()([h, r]))
    h = layers.GlobalAveragePooling2D()(h)
    outputs = layers.Dense(10, dtype="float32")(h)
    model = keras.Model(inputs, outputs, name=name)
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


#: keras-hub shapes: the base models, and tiny ones for the CPU.
HUB = {"gpt2": dict(vocabulary_size=50257, num_layers=12, num_heads=12,
                    hidden_dim=768, intermediate_dim=3072, max_sequence_length=256),
       "gpt2_tiny": dict(vocabulary_size=500, num_layers=2, num_heads=2,
                         hidden_dim=32, intermediate_dim=64, max_sequence_length=32),
       # small enough for a CPU, large enough that a step's activations
       # dwarf the weights (docs/ways-to-fit.md)
       "gpt2_cpu": dict(vocabulary_size=8000, num_layers=2, num_heads=4,
                        hidden_dim=128, intermediate_dim=512, max_sequence_length=128),
       "bert": dict(vocabulary_size=30522, num_layers=12, num_heads=12,
                    hidden_dim=768, intermediate_dim=3072, max_sequence_length=256),
       "bert_tiny": dict(vocabulary_size=500, num_layers=2, num_heads=2,
                         hidden_dim=32, intermediate_dim=64, max_sequence_length=32),
       # written after the estimate's and ways_to_fit's last changes, to
       # check them on a model they were not tuned on: OPT (learned
       # positions, ReLU), wider and longer than GPT-2 base, with Lion
       "opt": dict(vocabulary_size=50272, num_layers=6, num_heads=16,
                   hidden_dim=1024, intermediate_dim=4096, max_sequence_length=512),
       "opt_tiny": dict(vocabulary_size=500, num_layers=2, num_heads=2,
                        hidden_dim=32, intermediate_dim=64, max_sequence_length=32),
       # written later still, for the CPU: Llama (grouped-query attention,
       # rotary positions, gated feed-forward), AdamW
       "llama_cpu": dict(vocabulary_size=2000, num_layers=2, num_query_heads=4,
                         num_key_value_heads=2, hidden_dim=128, intermediate_dim=256,
                         max_sequence_length=128),
       # written after ways_to_fit's GPU tables (2026-12-06), to check them on
       # a model they were not tuned on: Phi-3 (rotary positions, fused
       # gate and up projection, untied logits, no dropout), AdamW
       "phi3": dict(vocabulary_size=32064, num_layers=6, num_query_heads=16,
                    num_key_value_heads=16, hidden_dim=1024, intermediate_dim=2816,
                    max_sequence_length=256),
       "phi3_tiny": dict(vocabulary_size=500, num_layers=2, num_query_heads=2,
                         num_key_value_heads=2, hidden_dim=32, intermediate_dim=64,
                         max_sequence_length=32)}


def build_hub(name: str) -> Any:
    """keras-hub's GPT2CausalLM (AdamW), OPTCausalLM (Lion), LlamaCausalLM
    (AdamW), Phi3CausalLM (AdamW) or BertTextClassifier (Adam), without
    preprocessors: token ids in, as a trained pipeline feeds them."""
    import keras
    import keras_hub

    c = HUB[name]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if name.startswith("gpt2"):
        model = keras_hub.models.GPT2CausalLM(
            backbone=keras_hub.models.GPT2Backbone(**c), preprocessor=None)
        model.compile(optimizer=keras.optimizers.AdamW(1e-4), loss=loss)
    elif name.startswith("opt"):
        model = keras_hub.models.OPTCausalLM(
            backbone=keras_hub.models.OPTBackbone(**c), preprocessor=None)
        model.compile(optimizer=keras.optimizers.Lion(1e-4), loss=loss)
    elif name.startswith("llama"):
        c = {k: v for k, v in c.items() if k != "max_sequence_length"}
        model = keras_hub.models.LlamaCausalLM(
            backbone=keras_hub.models.LlamaBackbone(**c), preprocessor=None)
        model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss=loss)
    elif name.startswith("phi3"):
        model = keras_hub.models.Phi3CausalLM(
            backbone=keras_hub.models.Phi3Backbone(**c), preprocessor=None)
        model.compile(optimizer=keras.optimizers.AdamW(1e-4), loss=loss)
    else:
        model = keras_hub.models.BertTextClassifier(
            backbone=keras_hub.models.BertBackbone(**c), num_classes=4,
            preprocessor=None)
        model.compile(optimizer="adam", loss=loss)
    return model


def hub_data(name: str, n: int) -> tuple[Any, Any]:
    import numpy as np

    c = HUB[name]
    rng = np.random.default_rng(0)
    seq = c["max_sequence_length"]
    tokens = rng.integers(0, c["vocabulary_size"], size=(n, seq + 1)).astype("int32")
    mask = np.ones((n, seq), bool)
    if name.startswith(("gpt2", "opt", "llama", "phi3")):
        return {"token_ids": tokens[:, :-1], "padding_mask": mask}, tokens[:, 1:]
    return ({"token_ids": tokens[:, :-1], "segment_ids": np.zeros((n, seq), "int32"),
             "padding_mask": mask}, rng.integers(0, 4, size=n).astype("int32"))


def conv_stack(side: int, channels: int, layers: int, classes: int = 10,
               separable: bool = False) -> Any:
    """The plain convnet of the spike scenarios and memory checks: `layers`
    3x3 convolutions of `channels` filters (relu, `same` padding) on
    `side`x`side`x3 images, global average pooling and `Dense(classes)`
    logits; Adam and sparse cross-entropy. Its activations dominate a
    step, so a larger batch shows at once in the step's peak."""
    import keras

    conv = keras.layers.SeparableConv2D if separable else keras.layers.Conv2D
    model = keras.Sequential(
        [keras.Input((side, side, 3))]
        + [conv(channels, 3, padding="same", activation="relu") for _ in range(layers)]
        + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(classes)])
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


# -- the speed benchmarks' workloads and the spike scenario -----------------

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
    import_keras().utils.set_random_seed(0)
    return conv_stack(s.side, s.channels, s.layers)
