"""The HTML report of a long record: write time, file size, open time.

Builds a record of `--steps` training steps on two devices (a GPU read
through its allocator, with +-2% noise on each step's working memory and
an oversized batch every 500 steps, and the host), writes its page with
`write_html_report` (best of `--repeats`), and opens it in headless
Chromium (playwright-python driving the system's Chromium): the time from
navigation until every figure is drawn, and the time a zoom takes to
redraw the range in view from the full record. Prints one table:

    python -m benchmarks.html_report            # 100,000 steps
    python -m benchmarks.html_report --steps 2000 --repeats 1   # a smoke run

Targets (issue 49): written in under 3 s on a 2-core machine, under 10 MB,
open in under 2 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from keras_memwatch import columns as C

MIB = 2**20
GIB = 2**30


def long_record(steps: int, seed: int = 0) -> pd.DataFrame:
    """`steps` steps (1,000 per epoch) on GPU:0 and the host, as a
    record's columns."""
    rng = np.random.default_rng(seed)
    step = np.arange(steps + 1)
    batch = np.where(step == 0, -1, (step - 1) % 1000)
    epoch = np.where(step == 0, 0, (step - 1) // 1000)
    oversized = (step % 500 == 499)
    frames = []
    for device, in_use, working, limit in (("GPU:0", 6 * GIB, 900 * MIB, 80 * GIB),
                                           ("host", 3 * GIB, 60 * MIB, None)):
        noise = rng.uniform(-0.02, 0.02, len(step))
        work = (working * (1 + noise) * np.where(oversized, 6, 1)).astype(np.int64)
        current = in_use + (rng.integers(0, 4, len(step)) * MIB)
        peak = current + work
        columns: dict[str, Any] = {name: pd.array([None] * len(step), "Int64")
                                   for name in C.BYTES_COLUMNS}
        columns.update(
            step=step, epoch=epoch, batch=pd.array(np.where(batch < 0, None, batch), "Int64"),
            phase="train", device=device, time_s=step * 0.05,
            timestamp=1.7e9 + step * 0.05,
            peak_bytes=pd.array(peak, "Int64"), current_bytes=pd.array(current, "Int64"),
            baseline_bytes=pd.array(np.where(step < 6, None, in_use + working), "Int64"),
            spike=oversized & (step > 5), process=0, hostname="node-a", call=0)
        if limit is not None:
            columns[C.ALLOCATOR_CURRENT] = columns["current_bytes"]
            columns[C.ALLOCATOR_PEAK] = columns["peak_bytes"]
            columns[C.ALLOCATOR_LIMIT] = pd.array(np.full(len(step), limit), "Int64")
        else:
            columns[C.HOST_RSS] = columns["current_bytes"]
            columns[C.HOST_PEAK_RSS] = columns["peak_bytes"]
        frames.append(pd.DataFrame(columns)[list(C.COLUMNS)])
    return pd.concat(frames).sort_values(["step", "device"], kind="stable").reset_index(drop=True)


def write_seconds(frame: pd.DataFrame, path: Path, repeats: int) -> float:
    """Best time of `write_html_report` over `repeats` writes."""
    from keras_memwatch.explain.html import write_html_report

    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        write_html_report(path, frame, overwrite=True)
        best = min(best, time.perf_counter() - start)
    return best


def plotly_alone(path: Path) -> None:
    """A page of plotly.js alone with one tiny figure, as plotly writes it:
    the floor of any page that embeds plotly.js."""
    import plotly.graph_objects as go

    go.Figure(go.Scatter(x=[0, 1], y=[0, 1])).write_html(path, include_plotlyjs=True)


def browser_seconds(path: Path, floor: Path, repeats: int
                    ) -> Optional[tuple[float, float, int, float]]:
    """`(open, zoom, drawn, floor)`: the median seconds until the page is
    drawn, the median seconds a zoom takes to redraw, the points drawn at
    first, and the median seconds the plotly.js-alone page takes to draw;
    None without playwright or a Chromium."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    executable = os.environ.get("MEMWATCH_CHROMIUM") or shutil.which("chromium") \
        or shutil.which("chromium-browser")
    if executable is None:
        return None
    opens, zooms, floors, drawn = [], [], [], 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        for _ in range(repeats):
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            start = time.perf_counter()
            page.goto(path.resolve().as_uri())
            page.wait_for_function("document.body.dataset.ready", timeout=60_000)
            opens.append(time.perf_counter() - start)
            drawn = int(page.evaluate("document.getElementById('timeline-0').dataset.drawn"))
            start = time.perf_counter()
            page.evaluate("Plotly.relayout('timeline-0', {'xaxis.range': [40000, 42000]})")
            page.wait_for_function(
                f"document.getElementById('timeline-0').dataset.drawn != {drawn}")
            zooms.append(time.perf_counter() - start)
            page.close()
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            start = time.perf_counter()
            page.goto(floor.resolve().as_uri())
            page.wait_for_function("document.querySelector('.main-svg')")
            floors.append(time.perf_counter() - start)
            page.close()
        browser.close()
    return (statistics.median(opens), statistics.median(zooms), drawn,
            statistics.median(floors))


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    frame = long_record(args.steps)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "long.html"
        write = write_seconds(frame, path, args.repeats)
        size = path.stat().st_size
        floor = Path(folder) / "plotly.html"
        plotly_alone(floor)
        opened = browser_seconds(path, floor, args.repeats)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"HTML report of {args.steps:,} steps on 2 devices ({len(frame):,} rows), "
          f"{os.cpu_count()} CPU(s), load average {load}:")
    print(f"  write (best of {args.repeats}):  {write:6.2f} s   (target < 3 s; "
          "the text summary included)")
    print(f"  file size:              {size / 1e6:6.2f} MB  (target < 10 MB)")
    if opened is None:
        print("  open in Chromium:       not measured (needs playwright and chromium)")
    else:
        print(f"  open in Chromium:       {opened[0]:6.2f} s   (target < 2 s; median "
              f"of {args.repeats})")
        print(f"  plotly.js alone:        {opened[3]:6.2f} s   (a page of one tiny "
              "figure, as plotly writes it: the floor)")
        print(f"  zoom redraw:            {opened[1]:6.2f} s   ({opened[2]:,} points "
              "drawn of the first device before the zoom)")


if __name__ == "__main__":
    main()
