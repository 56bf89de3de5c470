"""Hands a call's spikes to the user, on the training thread.

Each spike gets the layer behind it, where its batch had an unusual input
shape (`SpikeLayers`), then goes to `on_spike`. Keras expects a call's stop
flag (`stop_training`, ...) to be set on the training thread, never from an
asynchronous worker: so delivery happens there, at the next batch begin or
at the epoch's end.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from keras_memwatch.explain.layers.growth import SpikeLayers
from keras_memwatch.judge.events import SpikeEvent

logger = logging.getLogger("keras_memwatch")

#: The model's flag that stops each kind of call, and the call in words.
STOP_FLAGS = {"train": "stop_training", "test": "stop_evaluating",
              "predict": "stop_predicting"}
_CALL_NAMES = {"stop_training": "training", "stop_evaluating": "evaluation",
               "stop_predicting": "prediction"}


class SpikeDelivery:
    """Names each spike's layer, calls `on_spike`, and stops the call when
    it returns `True`.

    Args:
        on_spike: the user's callable, or `None`.
        layers: names the layer behind a spike, or `None`.
        keep_layer: keeps a spike's layer in the record
            (`SpikeMonitor.name_layer`); returns the named event.
        model: gives the model being watched (to set its stop flag).
        phase: the call's phase: `"train"`, `"test"` or `"predict"`.
        alert: log that the call stops.
        fault: reports a fault once (`fault(where, error)`).
    """

    def __init__(self, on_spike: Optional[Callable[[SpikeEvent], Any]],
                 layers: Optional[SpikeLayers],
                 keep_layer: Callable[[SpikeEvent, str], SpikeEvent],
                 model: Callable[[], Any], phase: str, alert: bool,
                 fault: Callable[[str, Exception], None]) -> None:
        self.on_spike, self.layers, self.model = on_spike, layers, model
        self.keep_layer = keep_layer
        self.flag = STOP_FLAGS[phase]
        self.alert, self.fault = alert, fault

    def deliver(self, events: list[SpikeEvent]) -> None:
        """Delivers the events, in order; errors of `on_spike` are logged,
        never raised."""
        if self.layers is not None:
            events = [self._with_layer(event) for event in events]
        if self.on_spike is None:
            return
        for event in events:
            try:
                stop = self.on_spike(event)
            except Exception as e:
                logger.warning("on_spike raised %r; training goes on", e)
                continue
            model = self.model()
            if stop is True and model is not None:
                setattr(model, self.flag, True)
                if self.alert:
                    logger.warning("on_spike returned True at epoch %s batch %s: "
                                   "%s stops", event.epoch, event.batch,
                                   _CALL_NAMES[self.flag])

    def _with_layer(self, event: SpikeEvent) -> SpikeEvent:
        """The event with the layer that grew most, where its batch had an
        unusual input shape."""
        assert self.layers is not None
        try:
            found = self.layers.layer_of(event)
        except Exception as e:
            self.fault("naming a spike's layer", e)
            return event
        return event if found is None else self.keep_layer(event, found.layer)
