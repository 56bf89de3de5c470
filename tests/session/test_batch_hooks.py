"""The batch hooks a fit installs on MemWatch (the hot path)."""

import keras
import pytest

from conftest import tiny_data, tiny_model
from keras_memwatch import MemWatch
from keras_memwatch.session.batch_hooks import NAMES


def fit(watch, callbacks=(), epochs=1, n=64):
    x, y = tiny_data(n)
    tiny_model().fit(x, y, batch_size=16, epochs=epochs, verbose=0,
                     callbacks=[watch, *callbacks])


class SeeHooks(keras.callbacks.Callback):
    """Notes, at each batch, which of MemWatch's hooks Keras would call."""

    def __init__(self, watch):
        super().__init__()
        self.watch, self.seen = watch, []

    def on_train_batch_begin(self, batch, logs=None):
        self.seen.append({name: name in vars(self.watch) for name in NAMES})


def test_a_fit_installs_its_hooks_and_takes_them_off_at_the_end():
    watch = MemWatch(probes="host", verbose=0)
    see = SeeHooks(watch)
    fit(watch, callbacks=[see])
    assert see.seen and all(all(installed.values()) for installed in see.seen)
    assert not any(name in vars(watch) for name in NAMES)


def test_outside_a_fit_the_hooks_record_nothing():
    watch = MemWatch(probes="host", verbose=0)
    fit(watch)
    rows = len(watch.to_dataframe())
    watch.on_train_batch_begin(0)
    watch.on_train_batch_end(0, {"loss": 1.0})
    watch.on_test_batch_end(0)
    assert len(watch.to_dataframe()) == rows


def test_a_fit_that_raised_takes_the_hooks_off_when_closed():
    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise RuntimeError("data pipeline broke")

    watch = MemWatch(probes="host", verbose=0)
    with pytest.raises(RuntimeError):
        fit(watch, callbacks=[Boom()])
    assert all(name in vars(watch) for name in NAMES)  # Keras skipped on_train_end
    watch.close()
    assert not any(name in vars(watch) for name in NAMES)
    assert len(watch.to_dataframe()) >= 3
