"""The shape every probe has."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar, Optional

Reading = Sequence[Optional[int]]


class ProbeUnavailable(RuntimeError):
    """Raised by `Probe.start` when the source cannot be read here.

    The message says why, in words for a person ("no CUDA device",
    "nvidia-ml-py is not installed: pip install nvidia-ml-py").
    """


class Probe(abc.ABC):
    """One memory source, read once per sample.

    A probe is started once per fit, then read at every sample. `read`
    returns one reading per device, in the order `start` returned the
    devices; each reading is aligned with `columns`, with `None` for a value
    the source cannot give at that moment. A probe whose peak column is the
    peak since its previous `read` (it resets the peak as it reads) sets
    `peak_per_sample = True`; otherwise its peak is a high-water mark.

    Probes do no work at construction; `start` opens the source and raises
    `ProbeUnavailable` when it cannot. A probe is passed in `MemWatch(probes=
    [...])`, beside or instead of the names of the built-in ones; its values
    go into the columns it names (see `keras_memwatch.columns`).

    Example:

    ```python
    import resource

    class PeakRss(keras_memwatch.Probe):
        # The host's peak resident memory, from getrusage (Linux).
        name = "peak_rss"
        columns = ("host_peak_rss_bytes",)

        def start(self):
            return ("host",)

        def read(self):
            kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return [(kib * 1024,)]

    watch = keras_memwatch.MemWatch(probes=["jax", PeakRss()])
    ```
    """

    name: ClassVar[str]
    columns: ClassVar[tuple[str, ...]]
    peak_per_sample: bool = False
    #: Read at most this often (seconds); samples in between have its
    #: values missing. For slow sources that have no peak to miss.
    min_interval_s: float = 0.0
    #: The probe reports every GPU of the machine, whether this process uses
    #: it or not (NVML); its rows are kept only for the GPUs a framework
    #: probe reports, where one reports any.
    sees_all_gpus: bool = False

    @abc.abstractmethod
    def start(self) -> tuple[str, ...]:
        """Opens the source and returns the devices it reports on."""

    @abc.abstractmethod
    def read(self) -> Sequence[Reading]:
        """Returns one reading per device, aligned with `columns`."""

    def close(self) -> None:
        """Releases what `start` opened. Safe to call more than once."""

    def describe(self) -> str:
        """A short note on what this probe can and cannot see."""
        return self.name
