"""Every public entry point refuses a bad option the same way: `TypeError`
for a value of the wrong type, `ValueError` for one out of range, before
anything runs, with the message "Expected `name` to be ... Received:
name=value". Where an option enters in several places (the callback and
`SpikeDetector`, `configure_memory`, `estimate_max_batch_size` and the
command line, the guard and its method, the writers), each gives the same
message; the command line prints it as a usage error (exit status 2)."""

from __future__ import annotations

import pytest

from conftest import tiny_data, tiny_model
from keras_memwatch import (MemWatch, SpikeDetector, configure_memory,
                            estimate_max_batch_size, memory_by_layer, oom_guard)
from keras_memwatch.cli import main
from keras_memwatch.ways import ways_to_fit

T, V = TypeError, ValueError


@pytest.fixture(scope="module")
def compiled():
    return tiny_model(), *tiny_data(8)


def _watch():
    return MemWatch(probes="host", verbose=0)


#: Where each option enters: a call taking the option's keyword arguments.
ENTRY_POINTS = {
    "MemWatch": lambda kw, tmp, model: MemWatch(**{"probes": "host", **kw}),
    "SpikeDetector": lambda kw, tmp, model: SpikeDetector(**kw),
    "configure_memory": lambda kw, tmp, model: configure_memory(**kw),
    "estimate_max_batch_size": lambda kw, tmp, model: estimate_max_batch_size(
        *model, **kw),
    "memory_by_layer": lambda kw, tmp, model: memory_by_layer(*model, **kw),
    "ways_to_fit": lambda kw, tmp, model: ways_to_fit(*model, **kw),
    "MemWatch.by_layer": lambda kw, tmp, model: _watch().by_layer(**kw),
    "oom_guard": lambda kw, tmp, model: oom_guard(_watch(), **kw),
    "MemWatch.guard": lambda kw, tmp, model: _watch().guard(**kw),
    "MemWatch.summary": lambda kw, tmp, model: _watch().summary(**kw),
    "MemWatch.breakdown": lambda kw, tmp, model: _watch().breakdown(**kw),
    "MemWatch.plot": lambda kw, tmp, model: _watch().plot(**kw),
    "MemWatch.to_csv": lambda kw, tmp, model: _watch().to_csv(
        **{"path": tmp / "out.csv", **kw}),
    "MemWatch.to_parquet": lambda kw, tmp, model: _watch().to_parquet(
        **{"path": tmp / "out.parquet", **kw}),
}

DETECTION = ("MemWatch", "SpikeDetector")
MEMORY = ("MemWatch", "configure_memory")
GUARD = ("oom_guard", "MemWatch.guard")
FILES = ("MemWatch.to_csv", "MemWatch.to_parquet")
WRITERS = ("MemWatch.plot", *FILES)
BY_LAYER = ("memory_by_layer", "MemWatch.by_layer")

#: (option, bad value, error, entry points, what `fit-check` is given)
CASES = [
    ("every_n_batches", 0, V, ("MemWatch",), None),
    ("every_n_batches", 2.5, T, ("MemWatch",), None),
    ("window", 0, V, DETECTION, None),
    ("window", "50", T, DETECTION, None),
    ("threshold", 1.0, V, DETECTION, None),
    ("threshold", float("nan"), V, DETECTION, None),
    ("threshold", "1.5", T, DETECTION, None),
    ("min_delta_mb", -1, V, DETECTION, None),
    ("min_delta_mb", True, T, DETECTION, None),
    ("warmup", -1, V, DETECTION, None),
    ("warmup", 1.5, T, DETECTION, None),
    ("log_path", "mem.txt", V, ("MemWatch",), None),
    ("log_path", 7, T, ("MemWatch",), None),
    ("on_spike", "print", T, ("MemWatch",), None),
    ("add_to_logs", 1, T, ("MemWatch",), None),
    ("verbose", 2, V, ("MemWatch",), None),
    ("verbose", "1", T, ("MemWatch",), None),
    ("max_rows", 0, V, ("MemWatch",), None),
    ("max_rows", 1.5, T, ("MemWatch",), None),
    ("probes", [], V, ("MemWatch",), None),
    ("probes", 3, T, ("MemWatch",), None),
    ("allow_growth", "yes", T, MEMORY, None),
    ("memory_limit_mb", -5, V, MEMORY, None),
    ("memory_limit_mb", "512", T, MEMORY, None),
    ("devices", [], V, ("configure_memory",), None),
    ("devices", {"GPU:0"}, T, ("configure_memory",), None),
    ("headroom", 1.0, V, ("estimate_max_batch_size", "ways_to_fit"), "1.0"),
    ("headroom", "abc", T, ("estimate_max_batch_size", "ways_to_fit"), "abc"),
    ("trial_sizes", [8], V, ("estimate_max_batch_size",), "8"),
    ("trial_sizes", "a,b", T, ("estimate_max_batch_size",), "a,b"),
    ("method", "fast", V, ("estimate_max_batch_size",), "fast"),
    ("method", 3, T, ("estimate_max_batch_size",), None),
    ("fresh_process", "yes", T, ("estimate_max_batch_size", "ways_to_fit"), None),
    ("progress", "print", T, ("estimate_max_batch_size", "ways_to_fit"), None),
    ("device", "TPU:0", V, ("estimate_max_batch_size", "ways_to_fit"), "TPU:0"),
    ("device", 1.5, T, ("estimate_max_batch_size", "ways_to_fit"), None),
    ("max_seconds", 0.0, V, ("estimate_max_batch_size", "ways_to_fit"), "0.0"),
    ("max_seconds", "60", T, ("estimate_max_batch_size", "ways_to_fit"), None),
    ("compilation_cache", "", V, ("MemWatch", "estimate_max_batch_size",
                                  "ways_to_fit"), ""),
    ("compilation_cache", 3, T, ("MemWatch", "estimate_max_batch_size",
                                 "ways_to_fit"), None),
    ("verbose", 3, V, ("estimate_max_batch_size", "ways_to_fit"), None),
    ("verbose", 1.5, T, ("estimate_max_batch_size", "ways_to_fit"), None),
    ("levers", "warp", V, ("ways_to_fit",), None),
    ("levers", 3, T, ("ways_to_fit",), None),
    ("combinations", "yes", T, ("ways_to_fit",), None),
    ("last_n", 0, V, GUARD, None),
    ("last_n", 2.5, T, GUARD, None),
    ("report_dir", 3, T, GUARD, None),
    ("batch_size", 0, V, ("MemWatch.summary", "MemWatch.breakdown", *BY_LAYER,
                          "ways_to_fit"), None),
    ("batch_size", "8", T, ("MemWatch.summary", "MemWatch.breakdown", *BY_LAYER,
                            "ways_to_fit"), None),
    ("expand_nested", "yes", T, BY_LAYER, None),
    ("expand_blocks", "yes", T, BY_LAYER, None),
    ("path", 3, T, ("MemWatch.plot",), None),  # None: no file
    ("path", 3, T, FILES, None),
    ("overwrite", "yes", T, WRITERS, None),
]


def _refusal(call):
    """The exception `call()` raises."""
    with pytest.raises(Exception) as caught:
        call()
    return caught.value


@pytest.mark.parametrize(
    "option, value, error, entries, cli_text", CASES,
    ids=[f"{c[0]}={c[1]!r}" for c in CASES])
def test_a_bad_option_gets_one_error_wherever_it_enters(
        option, value, error, entries, cli_text, tmp_path, compiled, capsys):
    messages = set()
    for entry in entries:
        raised = _refusal(lambda: ENTRY_POINTS[entry]({option: value}, tmp_path,
                                                      compiled))
        assert type(raised) is error, (entry, raised)
        message = str(raised)
        assert message.startswith(f"Expected `{option}` to be ")
        assert f"Received: {option}={value!r}" in message
        messages.add(message)
    assert len(messages) == 1, messages  # the same words everywhere
    if cli_text is not None:
        flag = "--" + option.replace("_", "-")
        with pytest.raises(SystemExit) as stopped:
            main(["fit-check", "--model", "unused:build", flag, cli_text])
        assert stopped.value.code == 2
        usage_error = capsys.readouterr().err.strip().splitlines()[-1]
        assert usage_error.endswith(f"argument {flag}: {messages.pop()}")
    assert not any(tmp_path.iterdir())  # nothing was written


def test_every_option_of_the_entry_points_is_walked():
    import inspect

    walked = {option for option, *_ in CASES}
    for function in (MemWatch, SpikeDetector, configure_memory,
                     estimate_max_batch_size, memory_by_layer, oom_guard, ways_to_fit,
                     MemWatch.guard, MemWatch.summary, MemWatch.breakdown,
                     MemWatch.by_layer, MemWatch.plot, MemWatch.to_csv):
        names = set(inspect.signature(function).parameters)
        # `ax` is a matplotlib object, checked by matplotlib; `model`, `x`,
        # `y` and `watch` are what the call works on.
        names -= {"self", "ax", "model", "x", "y", "watch"}
        assert names <= walked, (function, names - walked)
