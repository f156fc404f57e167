"""Readable audit reports: Markdown and a self-contained HTML page with SVG bar charts.

Charts are generated here as inline SVG (no plotting library): a chart is a list of
``(label, value)`` bars drawn horizontally, so long action names stay readable.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

_BAR_H, _GAP, _LABEL_W, _PLOT_W = 22, 6, 300, 360
_COLORS = {"SUCCEEDED": "#3b8f4c", "FAILED": "#c0392b", "PENDING": "#e6a117"}

Table = Sequence[Mapping[str, Any]]


def svg_bar_chart(title: str, bars: Sequence[tuple[str, float]]) -> str:
    """A horizontal bar chart as an inline ``<svg>`` element (empty data: a note)."""
    height = 30 + max(1, len(bars)) * (_BAR_H + _GAP)
    width = _LABEL_W + _PLOT_W + 80
    top = max((v for _, v in bars), default=0) or 1
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="{html.escape(title)}" font-family="sans-serif" font-size="12">',
        f'<text x="4" y="16" font-weight="bold">{html.escape(title)}</text>',
    ]
    if not bars:
        parts.append('<text x="4" y="40">(no data)</text>')
    for i, (label, value) in enumerate(bars):
        y = 26 + i * (_BAR_H + _GAP)
        w = max(1.0, _PLOT_W * value / top)
        status = label.rsplit(" ", 1)[-1]
        color = _COLORS.get(status, "#4a78b5")
        parts += [
            f'<text x="{_LABEL_W - 6}" y="{y + 15}" text-anchor="end">{html.escape(label)}</text>',
            f'<rect x="{_LABEL_W}" y="{y}" width="{w:.1f}" height="{_BAR_H}" fill="{color}"/>',
            f'<text x="{_LABEL_W + w + 4:.1f}" y="{y + 15}">{value:g}</text>',
        ]
    parts.append("</svg>")
    return "\n".join(parts)


def markdown_table(rows: Table, columns: Sequence[str], *, limit: int = 20) -> str:
    """Rows as a Markdown table (first ``limit`` rows, then a count of the rest)."""
    if not rows:
        return "_none_\n"
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows[:limit]:
        cells = [_cell(row.get(c)).replace("|", "\\|") for c in columns]
        out.append("| " + " | ".join(cells) + " |")
    if len(rows) > limit:
        out.append(f"\n_... {len(rows) - limit} more rows in the Parquet output_")
    return "\n".join(out) + "\n"


def html_table(rows: Table, columns: Sequence[str], *, limit: int = 20) -> str:
    """Rows as an HTML table (first ``limit`` rows, then a count of the rest)."""
    if not rows:
        return "<p><em>none</em></p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(r.get(c)))}</td>" for c in columns) + "</tr>"
        for r in rows[:limit]
    )
    more = f"<p><em>... {len(rows) - limit} more rows in the Parquet output</em></p>"
    return f"<table><tr>{head}</tr>{body}</table>" + (more if len(rows) > limit else "")


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= 120 else text[:117] + "..."


Section = tuple[str, Table, Sequence[str]]
"""``(title, rows, columns)`` of one report section."""


def render_markdown(
    title: str, summary: Mapping[str, Any], sections: Sequence[Section], chart_file: str
) -> str:
    """The Markdown report; the chart is linked as ``chart_file`` (an SVG beside it)."""
    lines = [f"# {title}", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in summary.items()]
    lines += ["", f"![calls by action and status]({chart_file})", ""]
    for name, rows, columns in sections:
        lines += [f"## {name} ({len(rows)})", "", markdown_table(rows, columns)]
    return "\n".join(lines)


def render_html(
    title: str, summary: Mapping[str, Any], sections: Sequence[Section], charts: Sequence[str]
) -> str:
    """A self-contained HTML report with the charts inlined."""
    metrics = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(_cell(v))}</td></tr>"
        for k, v in summary.items()
    )
    body = [f"<h1>{html.escape(title)}</h1>", f"<table>{metrics}</table>", *charts]
    for name, rows, columns in sections:
        body += [f"<h2>{html.escape(name)} ({len(rows)})</h2>", html_table(rows, columns)]
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>"
    )
