"""The public surface is a list: every name in `keras_memwatch.__all__`, and
every member of its classes, is in docs/api.md, and nothing else is; a name
that goes away warns for a release first."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_memwatch
from conftest import tiny_data, tiny_model

ROOT = Path(__file__).resolve().parents[1]
API = (ROOT / "docs" / "api.md").read_text()

#: Members every class has from outside the package (Keras's hooks, ...).
INHERITED = (set(dir(keras.callbacks.Callback)) | set(dir(object)) | set(dir(tuple))
             | set(dir(Exception)))


def documented() -> dict[str, list[str]]:
    """Each `::: path` of docs/api.md, with its `members:` list."""
    found = {}
    for block in re.split(r"^(?=::: )", API, flags=re.M)[1:]:
        path = block.split()[1]
        found[path] = re.findall(r"^        - (\w+)$", block.split("\n\n")[0], re.M)
    return found


def public_members(cls: type) -> set[str]:
    """The public members a class of the package defines or inherits from
    another class of the package (annotated and dataclass fields included)."""
    members: set[str] = set()
    for klass in cls.__mro__:
        if klass.__module__.startswith("keras_memwatch"):
            members |= {m for m in [*vars(klass), *vars(klass).get("__annotations__", ())]
                        if not m.startswith("_")}
            if dataclasses.is_dataclass(klass):
                members |= {f.name for f in dataclasses.fields(klass)}
    return members - (INHERITED - {"name"})


def resolve(path: str):
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def test_every_public_name_is_documented_where_it_lives():
    paths = documented()
    assert sorted(p.rsplit(".", 1)[1] for p in paths) == sorted(keras_memwatch.__all__)
    for path in paths:
        assert resolve(path) is getattr(keras_memwatch, path.rsplit(".", 1)[1]), path


@pytest.mark.parametrize("path", [p for p in documented()
                                  if inspect.isclass(resolve(p))
                                  and not issubclass(resolve(p), Exception)])
def test_each_class_lists_exactly_its_public_members(path):
    assert sorted(documented()[path]) == sorted(public_members(resolve(path)))


def test_the_watch_has_the_attributes_its_docstring_lists():
    doc = keras_memwatch.MemWatch.__doc__
    listed = re.findall(r"^        (\w+): ", doc.split("Attributes:", 1)[1].split(
        "\n\n", 1)[0], re.M)
    watch = keras_memwatch.MemWatch(probes="host", verbose=0)
    assert listed and all(hasattr(watch, name) for name in listed)


def test_a_removed_name_warns_and_still_answers():
    from keras_memwatch.capacity.evidence import STEP, Evidence, Observation
    from keras_memwatch.capacity.result import CapacityEstimate

    evidence = Evidence((Observation(8, 100, STEP), Observation(4, 60, STEP),
                         Observation(16, None, STEP, ran=False)),
                        limit_bytes=1000, in_use_bytes=0)
    estimate = CapacityEstimate(evidence, 0.1, "host", "jax", "host memory")
    with pytest.warns(DeprecationWarning, match="measurements.*evidence"):
        assert estimate.measurements == ((4, 60), (8, 100))
    with pytest.warns(DeprecationWarning, match="method.*measured_by"):
        assert estimate.method == "probes"


class Counter(keras_memwatch.Probe):
    """The custom source of docs/api.md: host memory as a count of calls."""

    name = "counter"
    columns = ("host_rss_bytes",)

    def start(self):
        self.reads = 0
        return ("host",)

    def read(self):
        self.reads += 1
        return [(self.reads * 2**20,)]


def test_a_custom_probe_is_a_public_probe_and_records():
    watch = keras_memwatch.MemWatch(probes=[Counter()], verbose=0)
    x, y = tiny_data(64)
    tiny_model().fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[watch])
    rows = watch.to_dataframe()
    assert rows["host_rss_bytes"].tolist() == [n * 2**20 for n in range(1, 6)]
    assert np.all(rows["device"] == "host")
