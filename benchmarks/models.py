"""The models the GPU benchmarks train, by name, with sample data.

`conv`, `block`, `resnet`, `transformer` and `gpt` are the models of the
earlier capacity work; `resconv` (a residual convnet with batch
normalization, in mixed_float16), `gpt2` (keras-hub's GPT-2 with the base
shape: 12 layers, width 768, vocabulary 50,257, sequence 256, AdamW) and
`bert` (keras-hub's BERT base classifier, sequence 256) were written after
the capacity code, to check it on models it was not tuned on. Each has a
`_tiny` variant for the CPU.
"""

from __future__ import annotations

from typing import Any

def build(name: str) -> Any:
    """A compiled model, fresh."""
    import keras
    from keras import layers

    if name.startswith("resconv"):
        return build_resconv(name)
    if name.startswith(("gpt2", "bert")):
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
                         hidden_dim=32, intermediate_dim=64, max_sequence_length=32)}


def build_hub(name: str) -> Any:
    """keras-hub's GPT2CausalLM (AdamW) or BertTextClassifier (Adam),
    without preprocessors: token ids in, as a trained pipeline feeds them."""
    import keras
    import keras_hub

    c = HUB[name]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if name.startswith("gpt2"):
        model = keras_hub.models.GPT2CausalLM(
            backbone=keras_hub.models.GPT2Backbone(**c), preprocessor=None)
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
    if name.startswith("gpt2"):
        return {"token_ids": tokens[:, :-1], "padding_mask": mask}, tokens[:, 1:]
    return ({"token_ids": tokens[:, :-1], "segment_ids": np.zeros((n, seq), "int32"),
             "padding_mask": mask}, rng.integers(0, 4, size=n).astype("int32"))
