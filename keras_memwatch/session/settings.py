"""A watch's options, checked once where they enter: one frozen object."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from keras_memwatch import options
from keras_memwatch.judge.detector import SpikeSettings
from keras_memwatch.judge.events import SpikeEvent
from keras_memwatch.record.csvlog import checked_log_path


@dataclasses.dataclass(frozen=True)
class WatchSettings:
    """The options of a `MemWatch`, checked (see its docstring).

    `probes` and the memory settings are not here: they are applied once,
    and a copy of the watch makes its own probes.
    """

    every_n_batches: int = 1
    spikes: SpikeSettings = SpikeSettings(50, 1.5, 64.0, 5)
    log_path: Optional[str] = None
    on_spike: Optional[Callable[[SpikeEvent], Any]] = None
    add_to_logs: bool = True
    verbose: int = 1
    max_rows: Optional[int] = None

    @classmethod
    def checked(cls, every_n_batches: Any = 1, window: Any = 50,
                threshold: Any = 1.5, min_delta_mb: Any = 64, warmup: Any = 5,
                log_path: Any = None, on_spike: Any = None,
                add_to_logs: Any = True, verbose: Any = 1,
                max_rows: Any = None) -> "WatchSettings":
        """The settings, each checked.

        Raises:
            TypeError: for an option of the wrong type.
            ValueError: for an option out of range.
        """
        return cls(
            every_n_batches=options.positive_int("every_n_batches", every_n_batches),
            spikes=SpikeSettings.checked(window, threshold, min_delta_mb, warmup),
            log_path=checked_log_path("log_path", log_path),
            on_spike=options.optional_callable("on_spike", on_spike),
            add_to_logs=options.boolean("add_to_logs", add_to_logs),
            verbose=options.choice("verbose", verbose, (0, 1)),
            max_rows=(None if max_rows is None
                      else options.positive_int("max_rows", max_rows)))

    def option(self, name: str) -> Any:
        """The value of the `MemWatch` option `name`."""
        return self.as_options()[name]

    def replaced(self, name: str, value: Any) -> "WatchSettings":
        """These settings with option `name` set to `value`, checked."""
        changed = self.checked(**dict(self.as_options(), log_path=None,
                                      **{name: value}))
        if name == "log_path":
            return changed
        return dataclasses.replace(changed, log_path=self.log_path)

    def as_options(self) -> dict[str, Any]:
        """The keyword arguments of `MemWatch` that give these settings."""
        return dict(every_n_batches=self.every_n_batches, **self.spikes._asdict(),
                    log_path=self.log_path, on_spike=self.on_spike,
                    add_to_logs=self.add_to_logs, verbose=self.verbose,
                    max_rows=self.max_rows)
