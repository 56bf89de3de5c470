"""A lever's failure in words: the error the step raised, behind Keras's
re-raise of it, the layer whose call raised it, and the lever's hint."""

from __future__ import annotations

from keras_memwatch.ways.failure import failure_words
from keras_memwatch.ways.levers import Remat


def test_keras_reraise_gives_the_errors_own_words_and_the_layer():
    error = ValueError(
        "Exception encountered when calling Functional.call().\n\n"
        "\x1b[1mThe custom_gradient decorator currently supports keywords "
        "arguments only when eager execution is enabled.\x1b[0m\n\n"
        "Arguments received by Functional.call():\n  • training=True")
    words = failure_words(error, Remat(layers=False))
    assert words.startswith(
        "not measured: Functional: ValueError: The custom_gradient decorator "
        "currently supports keywords arguments only when eager execution is "
        "enabled; on TensorFlow")
    assert "Arguments received" not in words and "\x1b" not in words


class NeedsATracer(TypeError):
    """Like JAX's tracer errors: made from a tracer, not from a message."""

    def __init__(self, tracer):
        super().__init__(f"Attempted boolean conversion of {tracer._error_repr()}.")


class Tracer:
    def _error_repr(self):
        return "traced array with shape bool[]"


def test_a_reraise_that_fails_gives_the_error_it_was_handling():
    try:
        try:
            try:
                raise NeedsATracer(Tracer())
            except NeedsATracer as original:
                raise type(original)("Exception encountered when calling Flip.call()")
        except AttributeError as failed:  # the re-raise could not be built
            # and the layer around it re-raises that, as Keras does
            raise AttributeError("Exception encountered when calling "
                                 f"Block.call().\n\n{failed}") from None
    except AttributeError as outer:
        words = failure_words(outer)
    assert words == ("not measured: NeedsATracer: Attempted boolean conversion of "
                     "traced array with shape bool[]")


def test_other_errors_keep_their_first_sentence():
    words = failure_words(RuntimeError("Out of memory. Tried to allocate 2 GiB."))
    assert words == "not measured: RuntimeError: Out of memory"


def test_a_model_built_for_one_length_is_told_how_to_take_any():
    from keras_memwatch.ways.levers import ShorterSequence

    error = ValueError("Input 0 with name 'input_layer' of layer 'functional' is "
                       "incompatible with the layer: expected shape=(None, 64), "
                       "found shape=(1, 32)")
    words = failure_words(error, ShorterSequence())
    assert words.startswith("not measured: ValueError: Input 0 with name")
    assert words.endswith('build them with `keras.Input((None,), dtype="int32")` '
                          "to train on any length")
