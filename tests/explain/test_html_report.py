"""The HTML report, opened in a real browser (headless Chromium driven by
playwright-python): one self-contained page of a real fit with spikes, of a
log alone, and of two processes' logs merged.

The browser tests skip, saying why, where plotly, playwright or a Chromium
cannot be had (`.ci/run` installs Debian's `chromium` where it is missing).
Set MEMWATCH_DOCS_SCREENSHOT=1 to refresh docs/html-report.png.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import GIB, record, scripted, steady, tiny_data, tiny_model

from keras_memwatch import MemWatch
from keras_memwatch.capacity.evidence import PLAN, STEP, Evidence, Observation
from keras_memwatch.capacity.result import CapacityEstimate
from keras_memwatch.explain.html import write_html_report, write_watch_report

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20
# Spikes at the 7th and 14th batches: epoch 0 batch 6, epoch 1 batch 3.
WORKING = [40] * 6 + [400] + [40] * 6 + [420] + [40] * 6
SPIKED = [[0, 6], [1, 3]]

plotly = pytest.importorskip(
    "plotly", reason="the HTML report needs plotly: pip install 'keras-memwatch[html]'")


# -- the browser -------------------------------------------------------------


def chromium_path():
    """Chromium's executable: $MEMWATCH_CHROMIUM, else one on the PATH."""
    named = os.environ.get("MEMWATCH_CHROMIUM")
    if named:
        return named
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        pytest.skip("no browser driver: pip install playwright (in the [test] extra)")
    executable = chromium_path()
    if executable is None:
        pytest.skip("no Chromium on this machine: apt-get install chromium "
                    "(or set MEMWATCH_CHROMIUM to a Chromium executable)")
    manager = sync_playwright().start()
    try:
        try:
            launched = manager.chromium.launch(executable_path=executable,
                                               args=["--no-sandbox"])
        except Error as e:
            pytest.skip(f"Chromium at {executable} does not start: {e}")
        yield launched
        launched.close()
    finally:
        manager.stop()


class Opened:
    """A page opened in the browser, with what it logged and requested."""

    def __init__(self, browser, path, width=1200, height=900):
        self.page = browser.new_page(viewport={"width": width, "height": height})
        self.errors, self.requests = [], []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(Path(path).resolve().as_uri())
        self.page.wait_for_function("document.body.dataset.ready", timeout=30_000)
        assert self.page.evaluate("document.body.dataset.ready") == "1", self.errors

    def panels(self):
        """Per timeline panel: title, rows, drawn points, the peak trace's x
        and the spike marks' x and y."""
        return self.page.evaluate("""() => Array.from(
            document.querySelectorAll('.memwatch-timeline')).map(d => ({
              title: d.dataset.title, rows: +d.dataset.rows, drawn: +d.dataset.drawn,
              x: Array.from(d.data[1].x), spike_x: Array.from(d.data[3].x),
              spike_y: Array.from(d.data[3].y)}))""")

    def close(self):
        self.page.close()


@pytest.fixture
def opened(browser):
    pages = []

    def open_page(path, **size):
        pages.append(Opened(browser, path, **size))
        return pages[-1]

    yield open_page
    for page in pages:
        page.close()


# -- a real fit with spikes ----------------------------------------------------


def estimate():
    """A real `CapacityEstimate` of a made-up record: three ladder steps, a
    plan that fits and one over the limit."""
    observations = (
        Observation(2, 120 * MIB, STEP, ladder=True),
        Observation(4, 200 * MIB, STEP, ladder=True),
        Observation(8, 360 * MIB, STEP, ladder=True),
        Observation(40, 1650 * MIB, PLAN),
        Observation(56, 2400 * MIB, PLAN),
    )
    return CapacityEstimate(Evidence(observations, 3 * GIB, 600 * MIB), 0.1, "GPU:0",
                            "jax", "XLA plans", limit_detail="the allocator's limit")


def ways():
    return pd.DataFrame({
        "lever": ["as it is", "mixed precision"],
        "change": ["", 'keras.mixed_precision.set_dtype_policy("mixed_bfloat16")'],
        "need_bytes": pd.array([2400 * MIB, 1300 * MIB], "Int64"),
        "saved_bytes": pd.array([0, 1100 * MIB], "Int64"),
        "largest_batch": [44, 80], "step_time_ratio": [1.0, 0.8],
        "fits": [False, True], "how": ["plan", "plan"],
        "notes": ["", "bf16 keeps float32 master weights"]})


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A real fit of 2 epochs of 10 batches on a scripted GPU and the host,
    an `evaluate` after it, its by-layer table, and its page."""
    watch = MemWatch(probes=[scripted(WORKING), "host"], verbose=0)
    model = tiny_model()
    x, y = tiny_data(80)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=[watch])
    model.evaluate(x[:32], y[:32], batch_size=8, verbose=0, callbacks=[watch])
    by_layer = watch.by_layer()
    path = tmp_path_factory.mktemp("page") / "memwatch.html"
    write_watch_report(watch, path, by_layer=by_layer, capacity=estimate(), ways=ways())
    return watch, path


@pytest.fixture(scope="module")
def fitted_page(browser, fitted):
    """The fitted run's page, opened once for the tests that read it."""
    page = Opened(browser, fitted[1])
    yield page
    page.close()


def test_the_page_loads_with_no_errors_and_nothing_from_the_network(fitted_page):
    page = fitted_page
    assert page.errors == []
    assert [url for url in page.requests if not url.startswith("file:")] == []
    sections = page.page.evaluate(
        "Array.from(document.querySelectorAll('section h2')).map(h => h.textContent)")
    assert sections == ["Memory per step", "Spikes", "Where the memory went",
                        "By layer", "What fits", "Ways to fit", "The run",
                        "Summary as text"]
    drawn = page.page.evaluate(
        "Array.from(document.querySelectorAll('.figure')).map(d => d.id + ':' + "
        "!!d.querySelector('.main-svg'))")
    assert drawn == ["timeline-0:true", "timeline-1:true", "chart-breakdown-0:true",
                     "chart-by-layer:true", "chart-capacity:true"]


def test_the_timeline_has_a_point_per_row_and_spikes_where_the_record_has_them(
        fitted, fitted_page):
    frame = fitted[0].to_dataframe()
    panels = fitted_page.panels()
    assert [p["title"] for p in panels] == ["GPU:0", "host"]
    for panel in panels:
        rows = frame[frame["device"] == panel["title"]].sort_values(["call", "step"])
        assert panel["rows"] == panel["drawn"] == len(panel["x"]) == len(rows)
        assert panel["x"] == list(range(len(rows)))  # the calls one after another
        spiked = np.flatnonzero(rows["spike"].to_numpy(bool)).tolist()
        assert panel["spike_x"] == spiked
        assert panel["spike_y"] == pytest.approx(
            (rows["peak_bytes"].iloc[spiked].astype(float) / MIB).tolist())
    gpu = frame[frame["device"] == "GPU:0"]
    assert gpu[gpu["spike"]][["epoch", "batch"]].values.tolist() == SPIKED
    assert len(panels[0]["spike_x"]) == 2


def hover_text(page, panel, trace, point):
    """Moves the mouse onto a point of a timeline trace; the hover label."""
    page.page.evaluate(f"document.getElementById('timeline-{panel}').scrollIntoView()")
    x, y = page.page.evaluate(f"""() => {{
        const d = document.getElementById('timeline-{panel}'), l = d._fullLayout;
        const r = d.getBoundingClientRect(), t = d.data[{trace}];
        return [r.left + l._size.l + l.xaxis.d2p(t.x[{point}]),
                r.top + l._size.t + l.yaxis.d2p(t.y[{point}])];}}""")
    page.page.mouse.move(x, y)
    page.page.wait_for_selector(f"#timeline-{panel} .hoverlayer .hovertext", timeout=5000)
    return page.page.evaluate(  # the label's lines, one per line
        f"Array.from(document.querySelectorAll('#timeline-{panel} .hoverlayer "
        ".hovertext tspan.line')).map(t => t.textContent).join('\\n')")


def test_hovering_a_spike_shows_where_it_happened(fitted_page):
    page = fitted_page
    text = hover_text(page, 0, 3, 0)
    assert "epoch 0 batch 6" in text and "train, call 0" in text
    assert "peak 900 MiB" in text
    page.page.mouse.move(1, 1)
    text = hover_text(page, 0, 3, 1)
    assert "epoch 1 batch 3" in text


def test_hovering_a_step_shows_its_row(fitted_page):
    page = fitted_page
    page.page.mouse.move(1, 1)
    text = hover_text(page, 0, 2, 3)  # in use, the 3rd batch of the fit
    assert "epoch 0 batch 2" in text and "(train, call 0)" in text
    assert "in use 500.0 MiB" in text and "peak 540.0 MiB" in text


def test_the_spikes_the_layers_and_the_answers_are_listed(fitted_page):
    page = fitted_page.page
    rows = page.evaluate("Array.from(document.querySelectorAll('table.spikes tbody tr'))"
                         ".map(r => r.innerText)")
    assert len(rows) == 2 and "memory spike at epoch 0 batch 6 on GPU:0" in rows[0]
    layers = page.evaluate("document.getElementById('chart-by-layer').data[0].y")
    assert layers[0].startswith("dense") and "(rest" in page.evaluate(
        "document.getElementById('chart-by-layer').data[2].y[0]")
    text = page.inner_text("#capacity")
    assert "largest batch that fits" in text and "the allocator's limit" in text
    assert "mixed_bfloat16" in page.inner_text("#ways")
    run = page.inner_text("#run")
    assert "every_n_batches" in run and "devices\tGPU:0, host" in run


def test_a_screenshot_of_the_page(fitted_page, tmp_path):
    page = fitted_page.page
    page.mouse.move(1, 1)
    page.evaluate("window.scrollTo(0, 0)")
    shot = tmp_path / "html-report.png"
    page.screenshot(path=str(shot), clip={"x": 0, "y": 0, "width": 1200, "height": 860})
    assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size < 300_000
    if os.environ.get("MEMWATCH_DOCS_SCREENSHOT") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "html-report.png")


# -- logs -----------------------------------------------------------------------


def report(*args):
    return subprocess.run([sys.executable, "-m", "keras_memwatch", "report", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def write_rank(folder, process, host, frame):
    frame = frame.copy()
    frame["process"], frame["hostname"] = process, host
    path = folder / f"mem.rank{process}.csv"
    frame.to_csv(path, index=False)
    return path


def test_a_report_from_a_csv_alone(tmp_path, opened):
    frame, _ = record(steady(WORKING))
    log = tmp_path / "mem.csv"
    frame.to_csv(log, index=False)
    out = tmp_path / "out.html"
    code = ("import sys\n"
            "from keras_memwatch.cli import main\n"
            f"assert main(['report', {str(log)!r}, '--html', {str(out)!r}]) == 0\n"
            "assert 'keras' not in sys.modules\n")  # no framework for a log
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(f"\nWrote {out}.\n")
    page = opened(out)
    assert page.errors == []
    (panel,) = page.panels()
    assert panel["rows"] == len(panel["x"]) == len(frame)
    assert panel["spike_x"] == [7, 14]
    assert "backend\tnot recorded in a log" in page.page.inner_text("#run")


def test_two_ranks_merged(tmp_path, opened):
    zero, _ = record(steady(WORKING))
    one, _ = record(steady([40] * 20, in_use=1500), limit=2 * GIB)
    logs = [write_rank(tmp_path, 0, "node-a", zero), write_rank(tmp_path, 1, "node-b", one)]
    out = tmp_path / "both.html"
    done = report(*map(str, logs), "--html", str(out))
    assert done.returncode == 0, done.stderr
    page = opened(out)
    assert page.errors == []
    panels = page.panels()
    assert [p["title"] for p in panels] == [
        f"process 0 on node-a ({logs[0]}), GPU:0", f"process 1 on node-b ({logs[1]}), GPU:0"]
    assert [len(p["x"]) for p in panels] == [len(zero), len(one)]
    assert [p["spike_x"] for p in panels] == [[7, 14], []]
    rows = page.page.evaluate("Array.from(document.querySelectorAll("
                              "'table.spikes tbody tr td:first-child')).map(c => c.innerText)")
    assert rows == ["0", "0"]


def long_record(steps, spikes_every):
    """One device, `steps` steps, a spike every `spikes_every` steps, peaks
    rising so that every bucket has its own highest row."""
    step = np.arange(steps)
    spike = (step % spikes_every == spikes_every - 1) & (step > 10)
    peak = 500 * MIB + (step % 97) * MIB + spike * 400 * MIB
    return pd.DataFrame({
        "step": step, "epoch": step // 1000, "batch": step % 1000, "phase": "train",
        "device": "GPU:0", "time_s": step * 0.01,
        "peak_bytes": pd.array(peak, "Int64"),
        "current_bytes": pd.array(np.full(steps, 500 * MIB), "Int64"),
        "baseline_bytes": pd.array(np.full(steps, 540 * MIB), "Int64"),
        "spike": spike, "plan_bytes": pd.array([None] * steps, "Int64"),
        **{c: pd.array([None] * steps, "Int64") for c in (
            "allocator_current_bytes", "allocator_peak_bytes", "allocator_limit_bytes",
            "allocator_reserved_bytes", "nvml_used_bytes", "nvml_total_bytes",
            "process_bytes", "host_rss_bytes", "host_peak_rss_bytes")},
        "process": 0, "hostname": "node-a", "call": 0})


def test_a_long_record_is_decimated_for_drawing_only(tmp_path, opened):
    frame = long_record(30_000, 1_000)
    path = write_html_report(tmp_path / "long.html", frame)
    page = opened(path)
    (panel,) = page.panels()
    assert panel["rows"] == 30_000 and panel["drawn"] == len(panel["x"]) < 10_000
    spiked = frame.index[frame["spike"]].tolist()
    assert set(spiked) <= set(panel["x"]) and panel["spike_x"] == spiked
    # Every bucket's highest peak is drawn: the highest of the whole record too.
    peaks = page.page.evaluate("Array.from(document.getElementById('timeline-0').data[1].y)")
    assert max(peaks) == pytest.approx(frame["peak_bytes"].max() / MIB)
    # Zoomed in, every row in view is drawn.
    page.page.evaluate("Plotly.relayout('timeline-0', {'xaxis.range': [12000, 12100]})")
    page.page.wait_for_function(
        "document.getElementById('timeline-0').dataset.drawn < 200")
    x = page.page.evaluate("Array.from(document.getElementById('timeline-0').data[1].x)")
    assert x == list(range(11_999, 12_102))
    assert page.errors == []


# -- bad input -----------------------------------------------------------------


@pytest.fixture(scope="module")
def small():
    frame, spikes = record(steady(WORKING))
    return frame, spikes


def test_an_existing_file_is_replaced_only_with_overwrite(small, tmp_path):
    frame, spikes = small
    path = tmp_path / "r.html"
    path.write_text("mine")
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        write_html_report(path, frame, spikes)
    assert path.read_text() == "mine"
    assert write_html_report(path, frame, spikes, overwrite=True) == str(path)
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("name, words", [
    ("missing/r.html", "the folder missing does not exist"),
    ("r.png", "does not end in .html"),
    (".", "is a folder"),
])
def test_bad_paths_are_refused_before_anything_is_written(small, tmp_path, monkeypatch,
                                                          name, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=words):
        write_html_report(name, small[0])
    assert os.listdir(tmp_path) == []


def test_bad_tables_are_refused(small, tmp_path):
    frame, spikes = small
    with pytest.raises(TypeError, match="Expected `frame` to be a MemWatch record"):
        write_html_report(tmp_path / "r.html", frame.to_dict())
    with pytest.raises(ValueError, match="without peak_bytes"):
        write_html_report(tmp_path / "r.html", frame.drop(columns="peak_bytes"))
    with pytest.raises(ValueError, match="Expected `ways` to be a ways-to-fit table"):
        write_html_report(tmp_path / "r.html", frame, ways=ways().drop(columns="fits"))
    with pytest.raises(TypeError, match="Expected `capacity`"):
        write_html_report(tmp_path / "r.html", frame, capacity=3)
    with pytest.raises(ValueError, match="Expected `identity` to hold"):
        write_html_report(tmp_path / "r.html", frame, identity={"colour": "red"})
    assert os.listdir(tmp_path) == []


def test_without_plotly_the_error_names_the_extra(small, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    with pytest.raises(ImportError, match=r"pip install 'keras-memwatch\[html\]'"):
        write_html_report(tmp_path / "r.html", small[0])
    assert os.listdir(tmp_path) == []


def test_the_command_line_refuses_an_existing_page_unless_overwrite(small, tmp_path):
    log, out = tmp_path / "mem.csv", tmp_path / "out.html"
    small[0].to_csv(log, index=False)
    out.write_text("mine")
    done = report(str(log), "--html", str(out))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"error: --html {out} exists: pass --overwrite to "
                           "replace it, or choose another path\n")
    assert out.read_text() == "mine"
    done = report(str(log), "--html", str(out), "--overwrite")
    assert done.returncode == 0, done.stderr
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    done = report(str(log), "--html", str(tmp_path / "nope" / "out.html"))
    assert done.returncode == 2 and "does not exist: create it first" in done.stderr


def test_a_record_without_samples_gives_a_page_that_says_so(tmp_path):
    from keras_memwatch.record.recorder import empty_frame

    path = write_html_report(tmp_path / "empty.html", empty_frame())
    page = Path(path).read_text(encoding="utf-8")
    assert "No samples recorded." in page and "No spikes" in page


def test_report_html_writes_the_page_of_the_watch(tmp_path):
    import keras

    watch = MemWatch(probes=[scripted(WORKING)], verbose=0)
    model = tiny_model()
    x, y = tiny_data(80)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[watch])
    watch.by_layer()
    path = watch.report_html(tmp_path / "m.html")
    page = Path(path).read_text(encoding="utf-8")
    assert 'id="chart-by-layer"' in page
    assert f"backend</td><td>{keras.backend.backend()}" in page
    with pytest.raises(FileExistsError):
        watch.report_html(tmp_path / "m.html")
    assert watch.report_html(tmp_path / "m.html", overwrite=True) == str(tmp_path / "m.html")
