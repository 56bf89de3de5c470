"""The spike scenario: mostly small batches, an oversized one every 15th.

Run as a script under the chosen KERAS_BACKEND; prints one JSON line with
what MemWatch flagged. A few 64-channel convolutions on 64x64x3 inputs make
activations dominate, so each oversized batch raises the step's peak host
RSS several times above the usual working memory.
"""

import json
import os
import sys

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # oneDNN keeps freed memory

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_memwatch import MemWatch  # noqa: E402

SMALL, LARGE, EVERY, BATCHES = 4, 96, 15, 45


class Oversized(keras.utils.PyDataset):
    def __init__(self):
        super().__init__()
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return BATCHES

    def __getitem__(self, index):
        n = LARGE if (index + 1) % EVERY == 0 else SMALL
        x = self.rng.normal(size=(n, 64, 64, 3)).astype("float32")
        y = self.rng.integers(0, 10, size=(n,))
        return x, y


def main():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((64, 64, 3)),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    watch = MemWatch(verbose=0)
    model.fit(Oversized(), epochs=1, shuffle=False, callbacks=[watch], verbose=0)
    host = watch.spikes[watch.spikes["device"] == "host"]
    frame = watch.to_dataframe()
    rows = frame[(frame["device"] == "host") & frame["batch"].notna()]
    print(json.dumps({
        "flagged": host["batch"].tolist(),
        "oversized": [i for i in range(BATCHES) if (i + 1) % EVERY == 0],
        "working_mib": ((rows["peak_bytes"] - rows["current_bytes"].shift(1))
                        / 2**20).round(1).fillna(-1).tolist(),
    }))


if __name__ == "__main__":
    sys.exit(main())
