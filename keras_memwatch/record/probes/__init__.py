"""Memory probes, one module per source, and their selection by name."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Union

from keras_memwatch import options
from keras_memwatch.record.probes.base import Probe, ProbeUnavailable

# name -> "module:Class"; modules are imported only when a probe is built.
_REGISTRY: dict[str, str] = {
    "host": "keras_memwatch.record.probes.host:HostProbe",
    "nvml": "keras_memwatch.record.probes.nvml:NvmlProbe",
    "tensorflow": "keras_memwatch.record.probes.tensorflow:TensorFlowProbe",
    "jax": "keras_memwatch.record.probes.jax:JaxProbe",
    "torch": "keras_memwatch.record.probes.torch:TorchProbe",
}

ProbeSpec = Union[str, Sequence[Union[str, Probe]]]


def auto_probe_names(backend: str) -> tuple[str, ...]:
    """The probes `probes="auto"` selects for a Keras backend."""
    names = ["host", "nvml"]
    if backend in ("tensorflow", "jax", "torch"):
        names.insert(0, backend)
    return tuple(names)


def make_probe(name: str) -> Probe:
    """Builds the probe registered under `name` (no source is opened)."""
    if name not in _REGISTRY:
        raise ValueError(
            f"Expected `probes` to name probes among {sorted(_REGISTRY)}, "
            f"or 'auto'. Received: probes={name!r}"
        )
    module_name, class_name = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)()


def resolve_probes(spec: ProbeSpec, backend: str) -> list[Probe]:
    """Turns the `probes` option into probe instances.

    Args:
        spec: `"auto"`, one probe name, or a sequence of names and `Probe`
            instances.
        backend: the active Keras backend, used by `"auto"`.

    Raises:
        ValueError: for an unknown name or an empty sequence.
        TypeError: for anything that is neither a name, a sequence nor a
            `Probe`.
    """
    if isinstance(spec, str):
        names = auto_probe_names(backend) if spec == "auto" else (spec,)
        return [make_probe(n) for n in names]
    what = "'auto', a probe name or a non-empty list of names and Probe instances"
    if not isinstance(spec, Sequence):
        raise options.expected("probes", what, spec, TypeError)
    if not spec:
        raise options.expected("probes", what, spec)
    probes = []
    for item in spec:
        if isinstance(item, Probe):
            probes.append(item)
        elif isinstance(item, str):
            probes.append(make_probe(item))
        else:
            raise TypeError(
                "Expected each entry of `probes` to be a probe name or a "
                f"keras_memwatch Probe instance. Received: probes=[..., {item!r}, ...]"
            )
    return probes


__all__ = [
    "Probe",
    "ProbeUnavailable",
    "auto_probe_names",
    "make_probe",
    "resolve_probes",
]
