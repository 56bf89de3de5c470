"""Why a lever could not be measured, in words: the error a step raised
(behind Keras's re-raise), the layer whose call raised it, and what the
lever says to do."""

from __future__ import annotations

import re
from typing import Optional

from keras_memwatch.oom_errors import error_text
from keras_memwatch.ways.levers import Lever

__all__ = ["called_layers", "failure_words", "raised_error"]


def failure_words(error: BaseException, lever: Optional[Lever] = None) -> str:
    """A row's `how` where measuring raised: the layer whose call raised,
    the error's first line, and the lever's hint."""
    error = raised_error(error)
    text = error_text(error)  # without Keras's bold
    where = _failing_layer(error)
    # Keras's re-raise: "Exception encountered when calling X.call().",
    # the error's own message, then the arguments the call received
    keras_words = re.match(r"Exception encountered when calling (\S+?)\.call\(\)\.?"
                           r"(.*?)(?:Arguments received by|$)", text, re.S)
    if keras_words:
        where = where or keras_words.group(1)
        text = keras_words.group(2)
    words = " ".join(line.strip() for line in text.splitlines() if line.strip())
    words = re.split(r"(?<=\.)\s", words, maxsplit=1)[0]  # its first sentence
    hint = "" if lever is None else lever.failure_hint(error)
    return (f"not measured: {where + ': ' if where else ''}"
            f"{type(error).__name__}: {words[:200].rstrip('.')}"
            f"{'; ' + hint if hint else ''}")


def raised_error(error: BaseException) -> BaseException:
    """The error a step raised. Keras re-raises a layer's error as a new one
    of its class with the layer's name in the message, once per layer it
    went through; where that class cannot be made from a message (JAX's
    tracer errors take a tracer), the re-raise fails while building it.
    Both are followed back to the error they were handling."""
    seen = set()
    while error.__context__ is not None and id(error) not in seen:
        seen.add(id(error))
        rewrapped = (type(error.__context__) is type(error) and error_text(
            error).startswith("Exception encountered when calling"))
        if not (rewrapped or _building_an_error(error)):
            break
        error = error.__context__
    return error


def _building_an_error(error: BaseException) -> bool:
    """Whether `error` was raised inside another error's `__init__`."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return (tb is not None and tb.tb_frame.f_code.co_name == "__init__"
            and isinstance(tb.tb_frame.f_locals.get("self"), BaseException))


def _failing_layer(error: BaseException) -> str:
    """`"Class 'name'"` of the innermost layer whose `call` the error went
    through, or `""`."""
    layers = called_layers(error, ("call",))
    return f"{type(layers[-1]).__name__} {layers[-1].name!r}" if layers else ""


def called_layers(error: BaseException,
                  methods: tuple[str, ...] = ("call", "__call__")) -> list:
    """The layers whose `methods` the error went through, outermost first
    (`__call__` too: a recomputation can fail before the layer's `call`).
    Keras re-raises at each layer's `__call__`, so the frames of the outer
    calls are in the tracebacks of the re-raised errors, which are read
    down to the error the step raised (`raised_error`)."""
    import keras

    innermost = raised_error(error)
    chain = [error]
    while chain[-1] is not innermost and chain[-1].__context__ is not None:
        chain.append(chain[-1].__context__)
    found: list = []
    for each in chain:
        tb = each.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            layer = frame.f_locals.get("self")
            if frame.f_code.co_name in methods and isinstance(
                    layer, keras.layers.Layer) and all(layer is not seen
                                                       for seen in found):
                found.append(layer)
            tb = tb.tb_next
    return found
