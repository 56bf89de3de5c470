"""The plot draws every device with artists a newcomer can read, headless."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest
from conftest import tiny_data, tiny_model

from keras_memwatch import MemWatch
from keras_memwatch import plot as P
from keras_memwatch.plot import plot_memory  # noqa: E402
from conftest import HOST, record, steady  # noqa: E402

WORKING = [40] * 6 + [400] + [40] * 6 + [420] + [40] * 6  # spikes at 6 and 13


@pytest.fixture(autouse=True)
def close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def two_devices():
    """GPU:0 over two epochs of 10 batches, with two spikes; the host."""
    epoch_of = lambda b: 0 if b < 10 else 1  # noqa: E731
    gpu, spikes = record(steady(WORKING), epoch_of=epoch_of)
    host, _ = record(steady([5] * len(WORKING), in_use=900), device="host",
                     sources=HOST, epoch_of=epoch_of)
    frame = pd.concat([gpu, host]).sort_values(["step", "device"], kind="stable")
    return frame.reset_index(drop=True), spikes


def labelled(ax):
    """label -> artist, for the artists the legend shows."""
    artists = ax.get_lines() + ax.collections + ax.patches
    return {a.get_label(): a for a in artists if not a.get_label().startswith("_")}


def find(ax, prefix):
    (artist,) = [a for label, a in labelled(ax).items() if label.startswith(prefix)]
    return artist


def test_one_panel_per_device_with_peak_in_use_and_baseline():
    frame, spikes = two_devices()
    fig = plot_memory(frame, spikes)
    assert [ax.get_title(loc="left").rsplit(": peak", 1)[0] for ax in fig.axes] == [
        "GPU:0", "host"]
    for ax in fig.axes:
        assert ax.get_ylabel() == "MiB"
        peak = find(ax, P.LABEL_PEAK)
        find(ax, P.LABEL_IN_USE)
        assert list(peak.get_xdata()) == list(range(21))
        find(ax, P.LABEL_BASELINE)
        assert ax.get_legend() is not None
    gpu = fig.axes[0]
    assert max(find(gpu, P.LABEL_PEAK).get_ydata()) == 920  # MiB
    assert set(find(gpu, P.LABEL_IN_USE).get_ydata()) == {500}
    assert fig.axes[-1].get_xlabel().startswith("step")


def test_spikes_are_marked_where_they_happened():
    frame, spikes = two_devices()
    fig = plot_memory(frame, spikes)
    gpu, host = fig.axes
    marks = find(gpu, P.LABEL_SPIKE)
    assert marks.get_label() == "spike (2)"
    assert marks.get_offsets().tolist() == [[7, 900], [14, 920]]  # step, MiB
    assert [t.get_text() for t in gpu.texts] == ["e0 b6", "e1 b13"]
    assert not [label for label in labelled(host) if label.startswith(P.LABEL_SPIKE)]


def test_epoch_starts_and_the_device_limit_are_lines():
    frame, spikes = two_devices()
    gpu, host = plot_memory(frame, spikes).axes
    epochs = find(gpu, P.LABEL_EPOCH)
    assert [seg[0][0] for seg in epochs.get_segments()] == [11]  # batch 10
    limit = find(gpu, P.LABEL_LIMIT)
    assert set(limit.get_ydata()) == {16 * 1024}  # MiB
    assert "headroom 15.10 GiB" in limit.get_label()
    assert not [label for label in labelled(host) if label.startswith(P.LABEL_LIMIT)]


def test_a_near_limit_is_inside_the_chart():
    frame, spikes = record(steady(WORKING), limit=1000 * 2**20)
    ax = plot_memory(frame, spikes).axes[0]
    assert find(ax, P.LABEL_LIMIT).get_label() == "device limit 1000 MiB"
    assert ax.get_ylim()[1] > 1000


def test_validation_batches_are_shaded():
    frame, spikes = record(steady([40] * 12),
                           phase_of=lambda b: "test" if b >= 9 else "train")
    ax = plot_memory(frame, spikes).axes[0]
    find(ax, P.LABEL_VALIDATION)


def test_given_axes():
    import matplotlib.pyplot as plt

    frame, spikes = two_devices()
    fig, ax = plt.subplots()
    assert plot_memory(frame, spikes, ax=ax) is fig
    assert ax.get_title(loc="left").startswith("GPU:0")  # the accelerator
    fig, axes = plt.subplots(2, 1)
    plot_memory(frame, spikes, ax=axes)
    assert axes[1].get_title(loc="left").startswith("host")
    with pytest.raises(ValueError, match="one Axes per device"):
        plot_memory(frame, spikes, ax=[axes[0]])


@pytest.mark.parametrize("name, magic", [("m.png", b"\x89PNG"), ("m.svg", b"<?xml")])
def test_saves_png_and_svg(tmp_path, name, magic):
    frame, spikes = two_devices()
    plot_memory(frame, spikes, path=tmp_path / name)
    assert (tmp_path / name).read_bytes()[:5].startswith(magic)


def test_an_empty_record_says_so():
    frame, spikes = record([])
    fig = plot_memory(frame, spikes)
    assert [t.get_text() for t in fig.axes[0].texts] == ["no samples recorded"]


def test_memwatch_plot_draws_its_record(tmp_path):
    watch = MemWatch(probes="host", verbose=0)
    x, y = tiny_data(64)
    tiny_model().fit(x, y, epochs=2, batch_size=16, callbacks=[watch], verbose=0)
    fig = watch.plot(tmp_path / "m.png")
    (ax,) = fig.axes
    assert len(find(ax, P.LABEL_PEAK).get_xdata()) == 9
    assert (tmp_path / "m.png").stat().st_size > 10_000


def test_headless_without_a_display(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MPLBACKEND")}
    code = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "from conftest import record, steady\n"
        "from keras_memwatch.plot import plot_memory\n"
        "import matplotlib\n"
        "frame, spikes = record(steady([40] * 8))\n"
        f"plot_memory(frame, spikes, path={str(tmp_path / 'h.png')!r})\n"
        "print(matplotlib.get_backend())\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().lower() == "agg"
    assert (tmp_path / "h.png").exists()


def test_without_matplotlib_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    frame, spikes = two_devices()
    with pytest.raises(ImportError, match="pip install matplotlib"):
        plot_memory(frame, spikes)
