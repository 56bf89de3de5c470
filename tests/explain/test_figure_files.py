"""A figure is saved at exactly the path given, never over a file by
surprise, and a path it cannot go to is refused before anything is drawn."""

from __future__ import annotations

import os

import pytest

from keras_memwatch.explain.figure_files import plot_path_problem, save_figure


@pytest.fixture(autouse=True)
def close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def a_figure():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    return fig


def test_save_figure_writes_exactly_there_and_never_replaces(tmp_path):
    fig = a_figure()
    assert save_figure(fig, tmp_path / "m.svg") == str(tmp_path / "m.svg")
    assert (tmp_path / "m.svg").read_bytes()[:5] == b"<?xml"
    with pytest.raises(FileExistsError):
        save_figure(fig, tmp_path / "m.svg")
    save_figure(fig, tmp_path / "m.svg", overwrite=True)
    with pytest.raises(ValueError, match="image format"):
        save_figure(fig, tmp_path / "noext")
    assert sorted(os.listdir(tmp_path)) == ["m.svg"]


@pytest.mark.parametrize("name, words", [
    ("noext", ["has no extension", "e.g. --plot {d}/noext.png"]),
    ("rep.txt", ["matplotlib cannot write .txt files", "e.g. --plot {d}/rep.png"]),
    ("nodir/x.png", ["the folder {d}/nodir does not exist"]),
    ("old.png", ["{d}/old.png exists: pass --force"]),
    (".", ["is a folder"]),
])
def test_plot_path_problems(tmp_path, name, words):
    (tmp_path / "old.png").write_bytes(b"mine")
    problem = plot_path_problem(str(tmp_path / name))
    for word in words:
        assert word.format(d=tmp_path) in problem
    assert (tmp_path / "old.png").read_bytes() == b"mine"


def test_plot_path_fine():
    assert plot_path_problem("new.png") is None
    assert plot_path_problem(__file__.replace(".py", ".png")) is None
    assert plot_path_problem(__file__ + ".pdf") is None
