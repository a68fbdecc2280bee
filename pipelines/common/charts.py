"""Bar charts as text (no Dagster): the Dagster UI (1.13) shows markdown inline only under 1,000
characters and drops ``data:`` images, so a chart is block characters in a code block."""

from collections.abc import Sequence
from dataclasses import dataclass

INLINE_MARKDOWN_LIMIT = 1000

MARKS = ("█", "░", "▓", "▒", "#", "=")
"""The character of each stacked part of a bar, in legend order (the first two: a part and the rest)."""


@dataclass(frozen=True)
class Bar:
    """One line of a chart; ``total``: what the bar's length stands for (default: the sum of its parts)."""

    label: str
    parts: Sequence[float]
    note: str = ""
    total: float | None = None


def text_bars(
    bars: Sequence[Bar],
    legend: Sequence[str],
    *,
    width: int = 24,
    label_width: int = 16,
    limit: int = INLINE_MARKDOWN_LIMIT,
    empty: str = "no data",
    more: str = "more",
    visible_parts: bool = False,
) -> str:
    """Stacked bars and a legend, as many as fit under ``limit`` (the rest counted: ``(+3 <more>)``);
    ``visible_parts``: a part above 0 is at least one character (counts, where 1 matters)."""
    if not bars:
        return empty
    if len(legend) > len(MARKS):
        raise ValueError(f"at most {len(MARKS)} parts per bar, not {len(legend)}")
    top = max(float(b.total) if b.total is not None else float(sum(max(0.0, p) for p in b.parts)) for b in bars)
    scale = width / top if top > 0 else 0.0
    label_w = min(label_width, max(len(bar.label) for bar in bars))
    key = "  ".join(f"{mark} {name}" for mark, name in zip(MARKS, legend, strict=False))
    lines: list[str] = []
    for n, bar in enumerate(bars):
        name = bar.label if len(bar.label) <= label_w else bar.label[: label_w - 1] + "~"
        drawn = "".join(mark * _marks(part, scale, visible_parts) for mark, part in zip(MARKS, bar.parts, strict=False))
        line = f"{name.ljust(label_w)} {drawn.ljust(width)} {bar.note}".rstrip()
        left = len(bars) - n - 1
        footer = key + (f"  (+{left} {more})" if left else "")
        if len("```\n" + "\n".join([*lines, line, footer]) + "\n```") >= limit:
            lines.append(f"{key}  (+{len(bars) - n} {more})")
            break
        lines.append(line)
    else:
        lines.append(key)
    return "```\n" + "\n".join(lines) + "\n```"


def _marks(part: float, scale: float, visible: bool) -> int:
    n = round(max(0.0, float(part)) * scale)
    return max(n, 1) if visible and part > 0 and scale > 0 else n
