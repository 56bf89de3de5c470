"""The tour notebook runs on a CPU and shows what it says it shows."""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import ipykernel  # noqa: F401  (the kernel the notebook runs on)
import nbclient
import nbformat
import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "memwatch_tour.ipynb"

# The tour's model (keras_memwatch.cli.demo.SMALL), by hand:
#   Conv2D 1 -> 32, 3x3:   3*3*1*32 + 32   =       320
#   Conv2D 32 -> 32, 3x3:  3*3*32*32 + 32  =     9,248  (x3)
#   Dense 64*64*32 -> 32:  131072*32 + 32  = 4,194,336
TRAINABLE_PARAMS = 320 + 3 * 9_248 + 4_194_336  # 4,222,400
TRAINABLE_BYTES = 4 * TRAINABLE_PARAMS  # float32
# Adam: momentum and velocity per weight, plus its iteration counter (int64
# on TensorFlow, int32 elsewhere) and float32 learning rate.
ITERATION_BYTES = 8 if os.environ.get("KERAS_BACKEND") == "tensorflow" else 4
ADAM_BYTES = 2 * TRAINABLE_BYTES + ITERATION_BYTES + 4


#: Where Jupyter and IPython would write outside the test's folder: the
#: kernel's connection file (with its session key), ipykernel's temporary
#: kernel-spec folder, IPython's profile and history, Jupyter's runtime dir.
JUPYTER_DIRS = ("JUPYTER_RUNTIME_DIR", "JUPYTER_DATA_DIR", "JUPYTER_CONFIG_DIR",
                "IPYTHONDIR")


def _outside_traces() -> set[str]:
    """What a Jupyter kernel run could leave in the temporary folder and the
    home folder: `tmp*_kernels` folders, kernel connection files of our
    kernel, `~/.ipython`, `~/.local/share/jupyter`."""
    found = set()
    tmp = Path(tempfile.gettempdir())
    for entry in tmp.iterdir():
        if entry.name.endswith("_kernels") or re.match(r"kernel-.*\.json$", entry.name):
            found.add(str(entry))
        elif entry.suffix == ".json" and entry.is_file():
            try:
                if json.loads(entry.read_text()).get("kernel_name") == "memwatch-tour":
                    found.add(str(entry))
            except (OSError, ValueError, AttributeError):
                pass
    home = Path.home()
    for place in (home / ".ipython", home / ".local" / "share" / "jupyter" / "runtime"):
        if place.exists():
            found.add(str(place))
    return found


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook, executed in a kernel running this interpreter; every
    file Jupyter and IPython write goes under the test's folder."""
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    tmp = tmp_path_factory.mktemp("tour")
    before = _outside_traces()
    dirs = {name: str(tmp / "jupyter" / name.lower()) for name in JUPYTER_DIRS}
    with pytest.MonkeyPatch.context() as env:
        for name, path in dirs.items():
            env.setenv(name, path)
        # A kernel spec of our own, so the kernel is this interpreter (this
        # venv) whatever other "python3" kernels the machine has; written
        # here, not through ipykernel's install() and its temporary folder.
        kernels = tmp / "jupyter" / "kernels"
        write_kernel_spec(str(kernels / "memwatch-tour"),
                          overrides={"display_name": "memwatch-tour"})
        specs = KernelSpecManager(kernel_dirs=[str(kernels)])
        assert specs.get_kernel_spec("memwatch-tour").argv[0] == sys.executable
        km = KernelManager(kernel_name="memwatch-tour", kernel_spec_manager=specs,
                           connection_file=str(tmp / "jupyter" / "kernel.json"))
        nb = nbformat.read(NOTEBOOK, as_version=4)
        client = nbclient.NotebookClient(
            nb, km=km, timeout=240, resources={"metadata": {"path": str(tmp)}})
        try:
            # The kernel inherits KERAS_BACKEND and the folders above from
            # this process; cleanup_kc shuts it down and removes its
            # connection file (nbclient keeps a kernel it did not start).
            client.execute(cleanup_kc=True)
        finally:
            if km.has_kernel:
                km.shutdown_kernel(now=True)
            km.cleanup_resources()
    return nb, tmp, before


def test_the_kernel_leaves_nothing_outside_its_folder(executed):
    nb, tmp, before = executed
    assert _outside_traces() - before == set()
    assert not (tmp / "jupyter" / "kernel.json").exists()  # the session key


def cell(nb, tag):
    (found,) = [c for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]
    return found


def text(c):
    parts = []
    for out in c.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(out.data.get("text/plain", ""))
    return "".join(parts)


def test_every_code_cell_ran_without_error(executed):
    nb, _, _ = executed
    for c in nb.cells:
        if c.cell_type == "code":
            assert c.execution_count is not None
            assert not [o for o in c.outputs if o.output_type == "error"]


def test_the_dataframe_has_one_row_per_step(executed):
    shown = text(cell(executed[0], "frame"))
    for column in ("peak_bytes", "current_bytes", "baseline_bytes", "spike"):
        assert column in shown
    assert "host" in shown


# On the CPU the tour judges the host's RSS, which for the small steps of
# PyTorch's CPU allocator jitters by up to ~100 MiB (measured: a false flag
# in 2 of 6 runs when this check was written, two in one CI run on
# 2026-12-01, none in 4 runs after): every oversized batch must be flagged,
# and at most two of the 28 others.
OVERSIZED = {14, 29}
MAX_FALSE_FLAGS = 2


def _oversized_and_few_others(flagged):
    flagged = set(flagged)
    return OVERSIZED <= flagged and len(flagged - OVERSIZED) <= MAX_FALSE_FLAGS


def test_flagged_batches_are_the_oversized_ones(executed):
    shown = text(cell(executed[0], "flagged"))
    flagged = re.search(r"flagged batches:\s+\[(.*)\]", shown).group(1)
    oversized = re.search(r"oversized batches:\s*\[(.*)\]", shown).group(1)
    assert oversized == "14, 29"
    assert _oversized_and_few_others([int(b) for b in flagged.split(", ")])


def test_spikes_table_lists_them(executed):
    shown = text(cell(executed[0], "spikes"))
    assert "ratio" in shown and "working_bytes" in shown
    first_block = shown.split("\n\n")[0]  # a wide frame wraps in blocks
    header, *lines = first_block.splitlines()
    assert header.split()[:3] == ["step", "epoch", "batch"]
    rows = [line.split() for line in lines if re.match(r"\d+\s", line)]
    assert {int(r[2]) for r in rows} == {0}
    assert _oversized_and_few_others([int(r[3]) for r in rows])


def test_breakdown_numbers_are_exact(executed):
    shown = text(cell(executed[0], "breakdown"))

    def value(key):
        return int(re.search(rf"^{key}\s+(\d+)\s*$", shown, re.M).group(1))

    assert value("trainable_params") == TRAINABLE_PARAMS
    assert value("trainable_bytes") == TRAINABLE_BYTES
    assert value("non_trainable_bytes") == 0
    assert value("optimizer_bytes") == ADAM_BYTES
    assert value("static_bytes") == TRAINABLE_BYTES + ADAM_BYTES
    assert value("batch_size") == 8
    assert value("transient_per_sample_bytes") == value("transient_bytes") // 8
    assert re.search(r"^optimizer\s+Adam\s*$", shown, re.M)


def test_summary_names_the_device_and_the_spikes(executed):
    shown = text(cell(executed[0], "summary"))
    assert "host: peak" in shown
    spikes = int(re.search(r"(\d+) spike\(s\)", shown).group(1))
    assert len(OVERSIZED) <= spikes <= len(OVERSIZED) + MAX_FALSE_FLAGS
    assert "0/14" in shown and "0/29" in shown


def test_plot_is_shown_and_saved(executed):
    nb, tmp, _ = executed
    images = [o for o in cell(nb, "plot").outputs
              if "data" in o and "image/png" in o.data]
    assert len(images) == 1
    assert base64.b64decode(images[0].data["image/png"])[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp / "memwatch_tour.png").stat().st_size > 10_000


def test_the_layers_table_has_the_steps_own_rows(executed):
    shown = text(cell(executed[0], "layers"))
    assert "(loss" in shown and "activation_bytes" in shown
    assert "conv2d" in shown


def test_the_ways_table_starts_with_the_model_as_it_is(executed):
    (shown,) = [o.data["text/plain"] for o in cell(executed[0], "ways").outputs
                if o.output_type == "execute_result"]
    rows = [line.split()[1] for line in shown.splitlines()[1:] if line.strip()]
    assert rows[:1] == ["as"] and "sgd_momentum" in shown
    assert "gradient_accumulation" in shown and "saved_bytes" in shown
    streams = "".join(o.text for o in cell(executed[0], "ways").outputs
                      if o.output_type == "stream")
    assert "retracing" not in streams  # each size is a new trace, on purpose


def test_the_page_is_written_beside_the_notebook(executed):
    nb, tmp, _ = executed
    page = tmp / "memwatch_tour.html"
    assert text(cell(nb, "page")).strip("'\n") == "memwatch_tour.html"
    assert page.stat().st_size > 1_000_000  # plotly.js is in the page
    assert "sgd_momentum" in page.read_text(encoding="utf-8")
