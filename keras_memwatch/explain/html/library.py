"""Plotly, the page's plotting library: imported on demand, named in the
error when it is missing."""

from __future__ import annotations

from typing import Any

#: What to install for the HTML report.
INSTALL = "pip install 'keras-memwatch[html]' (or pip install plotly)"


def plotly_objects() -> Any:
    """`plotly.graph_objects`.

    Raises:
        ImportError: without plotly, naming the extra to install.
    """
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise ImportError(f"The HTML report needs plotly: {INSTALL}") from None
    return go


def plotly_js() -> str:
    """The minified plotly.js that the installed plotly ships, to embed.

    Raises:
        ImportError: without plotly, naming the extra to install.
    """
    plotly_objects()
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def figure_json(figure: Any) -> str:
    """A figure's data and layout as JSON (plotly's encoder: numpy arrays
    as typed arrays), safe to embed inside a `<script>` element."""
    import plotly.io

    return plotly.io.to_json(figure, validate=False).replace("</", "<\\/")
