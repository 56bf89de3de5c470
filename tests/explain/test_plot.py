"""The plot draws every device with artists a newcomer can read, headless."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest
from conftest import tiny_data, tiny_model

from keras_memwatch import MemWatch
from keras_memwatch.explain import plot as P
from keras_memwatch.explain.plot import plot_memory  # noqa: E402
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
        "from keras_memwatch.explain.plot import plot_memory\n"
        "import matplotlib\n"
        "frame, spikes = record(steady([40] * 8))\n"
        f"plot_memory(frame, spikes, path={str(tmp_path / 'h.png')!r})\n"
        "print(matplotlib.get_backend())\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


# -- several processes ------------------------------------------------------------


def two_processes():
    """Process 0 (GPU:0 with two spikes, and the host) and process 1 (GPU:0,
    steady), as `load_log("mem.rank*.csv")` gives them."""
    zero, _ = two_devices()
    one, _ = record(steady([40] * len(WORKING), in_use=700))
    parts = []
    for frame, process, host in ((zero, 0, "node-a"), (one, 1, "node-b")):
        frame = frame.copy()
        frame["process"], frame["hostname"] = process, host
        frame["log"] = f"mem.rank{process}.csv"
        parts.append(frame)
    return pd.concat(parts, ignore_index=True)


def test_one_panel_per_process_and_device():
    fig = plot_memory(two_processes())
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles == [
        "process 0 on node-a (mem.rank0.csv), GPU:0: peak 920 MiB",
        "process 0 on node-a (mem.rank0.csv), host: peak 905 MiB",
        "process 1 on node-b (mem.rank1.csv), GPU:0: peak 740 MiB"]
    # Each process's spikes on its own panel, replayed from its own rows.
    assert find(fig.axes[0], P.LABEL_SPIKE).get_label() == "spike (2)"
    assert not [label for label in labelled(fig.axes[2])
                if label.startswith(P.LABEL_SPIKE)]
    assert list(find(fig.axes[2], P.LABEL_PEAK).get_xdata()) == list(range(21))


def test_one_axes_gets_a_line_per_process():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    plot_memory(two_processes(), ax=ax)
    assert ax.get_title(loc="left") == f"GPU:0: {P.LABEL_PEAK}, per process"
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"process 0 on node-a (mem.rank0.csv)",
                          "process 1 on node-b (mem.rank1.csv)"}
    assert max(lines["process 1 on node-b (mem.rank1.csv)"].get_ydata()) == 740
    assert find(ax, P.LABEL_SPIKE).get_offsets().tolist() == [[7, 900], [14, 920]]


def test_many_panels_become_one_per_device(monkeypatch):
    monkeypatch.setattr(P, "MAX_PANELS", 2)
    fig = plot_memory(two_processes())
    assert [ax.get_title(loc="left") for ax in fig.axes] == [
        f"GPU:0: {P.LABEL_PEAK}, per process", f"host: {P.LABEL_PEAK}, per process"]
    assert len(fig.axes[0].get_lines()) == 2 and len(fig.axes[1].get_lines()) == 1


def test_given_axes_for_several_processes(tmp_path):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1)
    plot_memory(two_processes(), ax=axes, path=tmp_path / "p.png")
    assert axes[2].get_title(loc="left").startswith("process 1 on node-b")
    assert (tmp_path / "p.png").exists()
    with pytest.raises(ValueError, match="one Axes per process and device"):
        plot_memory(two_processes(), ax=axes[:2])


def test_a_jax_gpus_planned_peak_and_an_allocators_reserve_are_named():
    frame, spikes = record(steady(WORKING))
    frame["plan_bytes"] = pd.array([pd.NA] + [600 * 2**20] * (len(frame) - 1),
                                   dtype="Int64")
    frame["allocator_reserved_bytes"] = frame["current_bytes"] + 64 * 2**20
    (ax,) = plot_memory(frame, spikes).axes
    assert find(ax, P.LABEL_PLANNED_PEAK) is not None
    assert set(find(ax, P.LABEL_RESERVED).get_ydata()) == {564}


def test_the_by_layer_split_is_drawn_as_bars_of_the_top_layers_and_the_rest(tmp_path):
    from keras_memwatch import memory_by_layer, plot_by_layer

    model, (x, y) = tiny_model(), tiny_data()
    table = memory_by_layer(model, x, y, batch_size=8)
    layers = table.iloc[:-1]
    fig = plot_by_layer(table, path=tmp_path / "layers.png", top=1)
    ax = fig.axes[0]
    names = [t.get_text() for t in ax.get_yticklabels()]
    top = layers.sort_values("working_bytes", ascending=False).iloc[0]
    assert names[0] == top["layer"]
    assert names[1] == f"{len(layers) - 1} other layers"
    if pd.notna(table.iloc[-1]["working_bytes"]):  # measured where the backend can
        assert names[-1] == "(rest)"
    widths = [p.get_width() for p in ax.containers[0]]
    assert widths[0] == pytest.approx(float(top["activation_bytes"]) / 2**20)
    assert (tmp_path / "layers.png").stat().st_size > 0
    with pytest.raises(FileExistsError, match="overwrite"):
        plot_by_layer(table, path=tmp_path / "layers.png")
    plot_by_layer(table, path=tmp_path / "layers.png", overwrite=True)


def test_plot_by_layer_names_a_wrong_table_and_top():
    from keras_memwatch import plot_by_layer

    with pytest.raises(TypeError, match="table"):
        plot_by_layer({"layer": []})
    with pytest.raises(ValueError, match="top"):
        plot_by_layer(pd.DataFrame({"working_bytes": []}), top=0)
