"""The HTML report: one self-contained page of a run.

- `library`: plotly, imported on demand;
- `timeline`: the record's rows per panel, packed for the page;
- `timeline_figure`: a panel's figure, its spikes and lines;
- `charts`: the breakdown, by-layer and capacity figures;
- `tables`: the spikes, ways to fit, answers and key-value tables;
- `identity`: backend, devices, versions, options, sources;
- `page`: the document, plotly.js embedded once, `timeline.js` drawing;
- `write`: `write_html_report`, its checks and the file;
- `watch`: the page of a `MemWatch`, from its public methods.

This package imports plotly only when a page is built.
"""

from __future__ import annotations

from keras_memwatch.explain.html.watch import write_watch_report
from keras_memwatch.explain.html.write import html_path_problem, write_html_report

__all__ = ["html_path_problem", "write_html_report", "write_watch_report"]
