"""The page: every section assembled into one HTML document, plotly.js
embedded once, nothing loaded from elsewhere."""

from __future__ import annotations

import html
from collections.abc import Mapping
from importlib import resources
from typing import Any, Optional

import pandas as pd

from keras_memwatch import columns as C
from keras_memwatch.explain.breakdown import format_breakdown, memory_breakdown
from keras_memwatch.explain.html import charts, tables
from keras_memwatch.explain.html.library import figure_json, plotly_js
from keras_memwatch.explain.html.timeline import encode_panels, header_json, timeline_panels
from keras_memwatch.explain.html.timeline_figure import spike_event, timeline_figure
from keras_memwatch.explain.report import process_groups, report_text, summarize
from keras_memwatch.judge.derived import spikes_from_frame

__all__ = ["build_page"]

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;
color:#222;background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:12px 24px 48px}
h1{font-size:1.5em;margin:.6em 0 .2em}h2{font-size:1.2em;margin:1.6em 0 .4em;
border-bottom:1px solid #ddd;padding-bottom:.2em}
.lead{color:#555;margin:0 0 1em}
.cards{display:flex;flex-wrap:wrap;gap:12px}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:10px 14px;
flex:1 1 260px}
.card b{display:block;font-size:1.3em;margin-bottom:.2em}
.figure{background:#fff;border:1px solid #ddd;border-radius:6px;margin:10px 0;
min-height:120px}
table{border-collapse:collapse;background:#fff;font-size:.9em;width:100%}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0}table.keys td:first-child{width:28%;color:#555}
table.keys thead{display:none}
.none{color:#777}.yes{color:#2a7a2a;font-weight:600}.no{color:#b22;font-weight:600}
pre{background:#fff;border:1px solid #ddd;padding:10px;overflow:auto;font-size:.85em}
nav a{margin-right:14px}.memwatch-error{color:#b22;padding:20px}
code{font-size:.9em}
"""


def _script(element_id: str, text: str, kind: str = "application/json") -> str:
    return f'<script type="{kind}" id="{element_id}">{text}</script>'


def _cards(frame: pd.DataFrame, spikes: pd.DataFrame,
           capacity: Optional[Mapping[str, Any]], ways: Optional[pd.DataFrame]) -> str:
    cards = []
    if len(spikes):
        worst = spikes.loc[spikes["working_bytes"].astype("float64").idxmax()]
        event = spike_event(worst)
        layer = (f" Layer: {worst['layer']}." if "layer" in spikes.columns
                 and tables.cell(worst.get("layer")) else "")
        cards.append(f"<b>{len(spikes)} spike(s)</b>The largest: "
                     f"{html.escape(event.message)}.{html.escape(layer)}")
    else:
        cards.append("<b>No spikes</b>No step needed far more memory than usual.")
    if capacity is not None:
        answer = capacity.get("predicted_batch_size")
        text = (f"<b>Largest batch that fits: {answer}</b>under "
                f"{capacity.get('headroom', 0):.0%} headroom on "
                f"{html.escape(str(capacity.get('device', '')))}" if answer is not None
                else f"<b>No batch size answered</b>"
                     f"{html.escape(str(capacity.get('refusal') or ''))}")
        cards.append(text)
    if ways is not None and len(ways):
        fitting = ways[ways["fits"].fillna(False).astype(bool)] if "fits" in ways else ways.iloc[:0]
        if len(fitting):
            best = fitting.sort_values("saved_bytes", ascending=False,
                                       na_position="last").iloc[0]
            cards.append(f"<b>A way to fit: {html.escape(str(best['lever']))}</b>"
                         f"<code>{html.escape(str(best['change']))}</code>")
        else:
            cards.append("<b>No single change fits the wanted batch</b>"
                         "See the ways to fit below.")
    return '<div class="cards">' + "".join(
        f'<div class="card">{c}</div>' for c in cards) + "</div>"


def _breakdown_section(frame: pd.DataFrame, breakdown: Optional[Mapping[str, Any]],
                       charts_out: list) -> str:
    parts = []
    groups = process_groups(frame)
    if breakdown is not None or len(groups) <= 1:
        items = [("", breakdown if breakdown is not None else memory_breakdown(None, frame))]
    else:
        items = [(label, memory_breakdown(None, rows)) for label, rows in groups]
    for n, (label, b) in enumerate(items):
        figure = charts.breakdown_figure(b)
        if figure is not None:
            if label:
                figure.update_layout(title_text=f"{label}: {figure.layout.title.text}")
            charts_out.append({"id": f"chart-breakdown-{n}", "figure": figure})
            parts.append(f'<div class="figure" id="chart-breakdown-{n}"></div>')
        parts.append(f"<pre>{html.escape(format_breakdown(b))}</pre>")
    return "".join(parts)


def build_page(frame: pd.DataFrame, spikes: Optional[pd.DataFrame] = None, *,
               breakdown: Optional[Mapping[str, Any]] = None,
               by_layer: Optional[pd.DataFrame] = None,
               capacity: Optional[Mapping[str, Any]] = None,
               explanation: Optional[str] = None,
               ways: Optional[pd.DataFrame] = None,
               identity: Optional[Mapping[str, Mapping[str, Any]]] = None,
               sources: Optional[Mapping[str, str]] = None,
               summary: Optional[str] = None,
               title: str = "keras_memwatch report") -> str:
    """The report as one HTML document (see `write_html_report`).

    Returns:
        The page's text.
    """
    several = len(process_groups(frame)) > 1
    panels = timeline_panels(frame, spikes)
    if spikes is None or (several and "process" not in spikes.columns):
        listed = (pd.concat([p.spikes.assign(process=p.rows["process"].iloc[0])
                             for p in panels if len(p.spikes)])
                  if any(len(p.spikes) for p in panels) else spikes_from_frame(frame))
    else:
        listed = spikes
    calls = int(frame[C.CALL].nunique()) if len(frame) else 1
    timelines = [{"id": f"timeline-{n}", "figure": timeline_figure(p, calls)}
                 for n, p in enumerate(panels)]
    charts_out: list[dict] = []
    sections = [("timeline", "Memory per step",
                 "".join(f'<div class="figure memwatch-timeline" id="timeline-{n}" '
                         f'data-rows="{len(p.rows)}" data-title="{html.escape(p.title)}">'
                         "</div>" for n, p in enumerate(panels))
                 or '<p class="none">No samples recorded.</p>'),
                ("spikes", "Spikes", tables.spikes_table(listed, several)),
                ("breakdown", "Where the memory went",
                 _breakdown_section(frame, breakdown, charts_out))]
    if by_layer is not None:
        charts_out.append({"id": "chart-by-layer",
                           "figure": charts.by_layer_figure(by_layer)})
        sections.append(("by-layer", "By layer",
                         '<div class="figure" id="chart-by-layer"></div>'))
    if capacity is not None:
        charts_out.append({"id": "chart-capacity",
                           "figure": charts.capacity_figure(capacity)})
        sections.append(("capacity", "What fits",
                         '<div class="figure" id="chart-capacity"></div>'
                         + tables.capacity_answers(capacity, explanation)))
    if ways is not None:
        sections.append(("ways", "Ways to fit", tables.ways_table(ways)))
    sections.append(("run", "The run", "".join(
        f"<h3>{html.escape(name)}</h3>{tables.key_values(items)}"
        for name, items in (identity or {}).items())))
    if len(frame):
        text = summary
        if text is None:
            text = (report_text(frame) if several else
                    summarize(frame, listed, sources=sources, breakdown=breakdown,
                              by_layer=by_layer))
        sections.append(("summary", "Summary as text",
                         f"<details><summary>show</summary><pre>{html.escape(text)}"
                         "</pre></details>"))
    header, block = encode_panels(panels)
    figures = ('{"timelines":['
               + ",".join(f'{{"id":"{t["id"]}","figure":{figure_json(t["figure"])}}}'
                          for t in timelines)
               + '],"charts":['
               + ",".join(f'{{"id":"{c["id"]}","figure":{figure_json(c["figure"])}}}'
                          for c in charts_out) + "]}")
    script = resources.files("keras_memwatch.explain.html").joinpath(
        "timeline.js").read_text(encoding="utf-8")
    nav = "".join(f'<a href="#{key}">{html.escape(name)}</a>' for key, name, _ in sections)
    body = "".join(f'<section id="{key}"><h2>{html.escape(name)}</h2>{content}</section>'
                   for key, name, content in sections)
    lead = html.escape(f"{len(frame):,} rows; {len(panels)} device panel(s); "
                       f"{len(listed)} spike(s)")
    return "".join([
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style>",
        f"<script>{plotly_js()}</script></head><body><main>",
        f"<h1>{html.escape(title)}</h1><p class=\"lead\">{lead}</p>",
        _cards(frame, listed, capacity, ways), f"<nav>{nav}</nav>", body,
        "</main>", _script("memwatch-figures", figures),
        _script("memwatch-header", header_json(header)),
        _script("memwatch-record", block, "application/octet-stream"),
        f"<script>{script}</script></body></html>"])


