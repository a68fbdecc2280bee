"""Markdown tables and the daily cost chart, with no plotting dependency: a self-contained SVG
(stored in the archive bucket) and the same bars as text, which the asset page shows inline."""

from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING

from pipelines.common.charts import INLINE_MARKDOWN_LIMIT, Bar, text_bars

if TYPE_CHECKING:
    import pandas as pd

BUSY_COLOR = "#4c78a8"
IDLE_COLOR = "#e45756"
NOTHING = "no priced snapshots for this day"


def markdown_table(frame: pd.DataFrame, columns: dict[str, str], max_rows: int = 250) -> str:
    """``columns`` maps a column to its header. Floats get 4 decimals; ``|`` in text is escaped."""
    lines = ["| " + " | ".join(columns.values()) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in frame.head(max_rows)[list(columns)].itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    if len(frame) > max_rows:
        lines.append(f"\n{len(frame) - max_rows} more rows are in the CSV.")
    return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:,.4f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def cost_chart_svg(report: pd.DataFrame, title: str, max_pools: int = 40) -> str:
    """Horizontal bars: USD per pool for the day, busy part then the idle part highlighted."""
    rows = report.head(max_pools)
    label_w, bar_w, value_w, row_h, top = 180, 420, 190, 22, 56
    width = label_w + bar_w + value_w
    height = top + max(1, len(rows)) * row_h + 40
    top_cost = float(rows["cost_usd"].max()) if len(rows) else 0.0
    scale = bar_w / top_cost if top_cost > 0 else 0.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="8" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
        f'<rect x="8" y="30" width="12" height="12" fill="{BUSY_COLOR}"/><text x="24" y="40">busy USD</text>',
        f'<rect x="100" y="30" width="12" height="12" fill="{IDLE_COLOR}"/><text x="116" y="40">idle USD</text>',
    ]
    if rows.empty:
        parts.append(f'<text x="8" y="{top + 14}">{NOTHING}</text>')
    for n, row in enumerate(rows.itertuples(index=False)):
        y = top + n * row_h
        busy_w = max(0.0, float(row.busy_cost_usd)) * scale
        idle_w = max(0.0, float(row.idle_cost_usd)) * scale
        name = row.pool if len(row.pool) <= 26 else row.pool[:25] + "…"
        parts += [
            f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end">{escape(name)}</text>',
            f'<rect x="{label_w}" y="{y + 3}" width="{busy_w:.1f}" height="{row_h - 6}" fill="{BUSY_COLOR}"/>',
            f'<rect x="{label_w + busy_w:.1f}" y="{y + 3}" width="{idle_w:.1f}" height="{row_h - 6}" '
            f'fill="{IDLE_COLOR}"/>',
            f'<text x="{label_w + busy_w + idle_w + 6:.1f}" y="{y + 14}">${row.cost_usd:,.2f} '
            f"(idle {row.idle_share_pct:.0f}%)</text>",
        ]
    if len(report) > max_pools:
        parts.append(f'<text x="8" y="{height - 12}">{len(report) - max_pools} smaller pools are in the CSV</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def cost_chart_text(report: pd.DataFrame, width: int = 24, limit: int = INLINE_MARKDOWN_LIMIT) -> str:
    """The cost chart as markdown shown inline (docs/fleet.md, "Charts"): ``█`` busy and ``░`` idle USD per pool."""
    bars = [
        Bar(
            str(row.pool),
            (float(row.busy_cost_usd), float(row.idle_cost_usd)),
            f"${row.cost_usd:,.2f} idle {row.idle_share_pct:.1f}%",
            total=float(row.cost_usd),
        )
        for row in report.itertuples(index=False)
    ]
    return text_bars(bars, ("busy", "idle"), width=width, limit=limit, empty=NOTHING, more="more pools in the CSV")
