"""What every chart and table of the HTML report shares: plotly.js inlined once, one layout,
one figure wrapper, policy colours and dashes, one table layout."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from radixsched.results.format import policy_color

if TYPE_CHECKING:
    import plotly.graph_objects as go


def policy_dash(index: int) -> str:
    return DASHES[(index // 2) % len(DASHES)] if index >= 2 else "solid"


def policy_swatch(index: int, name: str) -> str:
    """A policy's name after a square of its colour (HTML)."""
    return f'<span class="swatch" style="background:{policy_color(index)}"></span>{escape(name)}'


def html_table(table_id: str, headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A scrolling table: ``headers`` are escaped here, the rows' cells are HTML already."""
    head = "".join(f'<th scope="col">{escape(h)}</th>' for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return (
        f'<div class="scroll"><table id="{table_id}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def plotly_js() -> str:
    """plotly.js as shipped with the plotly package (inlined into every report)."""
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())


def figure_html(fig: go.Figure, div_id: str) -> str:
    """A figure's ``<div>`` and the script drawing it (plotly.js must already be loaded)."""
    return str(
        fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            div_id=div_id,
            config=PLOT_CONFIG,
            default_width="100%",
        )
    )


def no_data(fig: go.Figure, has_data: bool) -> None:
    """Say "no data" across an empty chart."""
    if not has_data:
        fig.add_annotation(
            text="no data", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5
        )


def base_layout(title: str, x_title: str, y_title: str, **kw: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "title": {"text": title, "font": {"size": 14}},
        "xaxis": {"title": {"text": x_title}, "zeroline": False},
        "yaxis": {"title": {"text": y_title}, "zeroline": False},
        "template": "plotly_white",
        "margin": {"l": 70, "r": 20, "t": 40, "b": 50},
        "height": 340,
        "showlegend": False,
        "hovermode": "closest",
        "font": {"family": "system-ui, sans-serif", "size": 12},
    }
    layout.update(kw)
    return layout


# Line dash per policy position, so that series of similar colour still differ.
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")

# Plotly options: no logo, resize with the page.
PLOT_CONFIG = {"displaylogo": False, "responsive": True}
