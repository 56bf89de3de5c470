"""A JAX `fit` whose steps run out of memory, with a `MemWatch` and no guard.

Keras's `fit` on JAX can return over a step that ran out of memory (the
failure surfaces only when the step's results are awaited, and Keras drops
the logs it cannot read). Prints whether `fit` raised, what the watch
logged at ERROR, and whether the weights can still be read:

    KERAS_BACKEND=jax python3 -m benchmarks.gpu.quiet_oom gpt2 --size 48 \
        --limit-mb 8192
"""

from __future__ import annotations

import argparse
import json
import logging


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--limit-mb", type=float, default=8192)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    from keras_memwatch import MemWatch, configure_memory

    configure_memory(memory_limit_mb=args.limit_mb)
    import keras

    from benchmarks.models import build, data
    from keras_memwatch.measure.batches import Batches

    errors: list[str] = []

    class Errors(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                errors.append(record.getMessage()[:300])

    logging.getLogger("keras_memwatch").addHandler(Errors())
    model = build(args.model)
    x, y = Batches(*data(args.model, 8)).take(args.size * args.steps)
    raised = None
    try:
        keras.Model.fit(model, x, y, batch_size=args.size, epochs=1, verbose=0,
                        callbacks=[MemWatch(verbose=0)])
    except Exception as e:  # noqa: BLE001
        raised = f"{type(e).__name__}: {str(e)[:200]}"
    try:
        keras.ops.convert_to_numpy(model.trainable_variables[0])
        weights = "readable"
    except Exception as e:  # noqa: BLE001
        weights = f"{type(e).__name__}: {str(e)[:120]}"
    print(json.dumps({"size": args.size, "fit_raised": raised, "errors": errors,
                      "weights": weights}))


if __name__ == "__main__":
    main()
