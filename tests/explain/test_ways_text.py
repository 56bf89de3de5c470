"""The ways-to-fit table for a person: its block of text, in `summary()`
when given; where none was measured, how to measure it, in the summary of
a fit whose peak came near the limit and in oom_guard's report."""

from __future__ import annotations

import pandas as pd

from conftest import record, steady
from keras_memwatch.explain.guard import ways_lines
from keras_memwatch.explain.report import summarize
from keras_memwatch.explain.ways_text import AS_IS, WAYS_COLUMNS, format_ways

MIB = 2**20


def table():
    rows = [
        [AS_IS, "", 900 * MIB, 0, 24, 1.0, False, "measured", "the model as compiled"],
        ["adafactor", "model.compile(optimizer=keras.optimizers.Adafactor(), ...)",
         700 * MIB, 200 * MIB, 40, 1.1, True, "measured", "factored moments"],
        ["shorter_sequence", "", None, None, None, None, None,
         "not applied: the inputs hold no token ids", ""],
    ]
    frame = pd.DataFrame(rows, columns=list(WAYS_COLUMNS))
    for column in ("need_bytes", "saved_bytes", "largest_batch"):
        frame[column] = frame[column].astype("Int64")
    frame["fits"] = frame["fits"].astype("boolean")
    frame.attrs.update(batch_size=32, headroom=0.1)
    return frame


def test_the_block_has_a_line_a_row_then_the_code_to_write():
    text = format_ways(table())
    lines = text.splitlines()
    assert lines[0] == "Ways to fit a batch of 32 (under 10% headroom):"
    assert lines[2].split()[:4] == ["as", "is", "900", "MiB"]
    assert "200 MiB" in lines[3] and "x1.10" in lines[3] and "yes" in lines[3]
    assert lines[4].split()[1:6] == ["-"] * 5  # missing, never 0
    assert "not applied: the inputs hold no token ids" in lines[4]
    assert "  adafactor: model.compile(optimizer=keras.optimizers.Adafactor(), ...)" \
        in lines
    assert "    (factored moments)" in lines


def test_the_summary_shows_the_table_only_when_given():
    frame, spikes = record(steady([40] * 12))
    assert "Ways to fit" not in summarize(frame, spikes)
    text = summarize(frame, spikes, ways=table())
    assert "Ways to fit a batch of 32" in text
    assert text.index("Ways to fit") < text.index("Memory per device")


def test_a_summary_near_the_limit_says_how_to_measure_when_nothing_was():
    near, far = (record(steady([40] * 12), limit=limit * MIB)
                 for limit in (560, 640))  # peaks of 540 MiB: 96% and 84%
    assert "Ways to fit: not measured" not in summarize(*far)
    text = summarize(*near)
    assert "Ways to fit: not measured" in text
    assert "keras_memwatch.ways_to_fit(model" in text
    assert "Ways to fit: not measured" not in summarize(*near, ways=table())


def test_the_oom_report_says_how_to_measure_when_nothing_was():
    class Watch:
        ways = None

    hint = ways_lines(Watch())
    assert "keras_memwatch.ways_to_fit(model" in hint and "--ways" in hint
    Watch.ways = table()
    assert ways_lines(Watch()) == ""  # the summary in the report shows it
