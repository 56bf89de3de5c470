"""keras_memwatch: see where the memory of a Keras training run goes.

```python
from keras_memwatch import MemWatch

watch = MemWatch()
model.fit(x, y, callbacks=[watch])
watch.to_dataframe()
print(watch.summary())
```

Importing the package does nothing heavy: each public name is imported on
first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from keras_memwatch.version import __version__

_PUBLIC = {
    "CapacityEstimate": "keras_memwatch.capacity",
    "CollectCycles": "keras_memwatch.cycles",
    "MemWatch": "keras_memwatch.callback",
    "SpikeDetector": "keras_memwatch.judge.detector",
    "SpikeEvent": "keras_memwatch.judge.events",
    "break_tree_cycles": "keras_memwatch.configure.tree_cycles",
    "configure_memory": "keras_memwatch.configure",
    "estimate_max_batch_size": "keras_memwatch.capacity",
    "load_log": "keras_memwatch.record.log_reader",
    "memory_by_layer": "keras_memwatch.explain.layers",
    "oom_guard": "keras_memwatch.explain.guard",
    "plot_by_layer": "keras_memwatch.explain.plot",
    "ways_to_fit": "keras_memwatch.ways",
    "Probe": "keras_memwatch.record.probes.base",
    "ProbeUnavailable": "keras_memwatch.record.probes.base",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from keras_memwatch.capacity import CapacityEstimate, estimate_max_batch_size
    from keras_memwatch.cycles import CollectCycles
    from keras_memwatch.configure.tree_cycles import break_tree_cycles
    from keras_memwatch.explain.guard import oom_guard
    from keras_memwatch.explain.plot import plot_by_layer
    from keras_memwatch.explain.layers import memory_by_layer
    from keras_memwatch.callback import MemWatch
    from keras_memwatch.configure import configure_memory
    from keras_memwatch.record.log_reader import load_log
    from keras_memwatch.record.probes.base import Probe, ProbeUnavailable
    from keras_memwatch.ways import ways_to_fit
    from keras_memwatch.judge.detector import SpikeDetector
    from keras_memwatch.judge.events import SpikeEvent


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'keras_memwatch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
