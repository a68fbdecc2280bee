"""The one text-chart renderer (``pipelines.common.charts``): what every asset page's chart is drawn with."""

import pytest

from pipelines.common.charts import INLINE_MARKDOWN_LIMIT, MARKS, Bar, text_bars
from pipelines.progressor.collector import Clock
from pipelines.progressor.health import BUCKET_LABELS, Health, durations_chart


def test_stacked_parts_are_scaled_to_the_longest_bar_and_named_in_the_legend():
    chart = text_bars([Bar("a", (6, 2), "8 in all"), Bar("bb", (4, 0), "4")], ("busy", "idle"), width=8)
    assert chart.splitlines() == ["```", "a  ██████░░ 8 in all", "bb ████     4", "█ busy  ░ idle", "```"]


def test_bars_that_do_not_fit_inline_are_counted():
    bars = [Bar(f"row-{n:03d}", (100 - n,), f"{100 - n}") for n in range(100)]
    chart = text_bars(bars, ("count",), more="more rows")
    assert len(chart) < INLINE_MARKDOWN_LIMIT
    assert chart.splitlines()[-2].startswith("█ count  (+")
    assert chart.splitlines()[-2].endswith(" more rows)")


def test_a_small_part_shows_when_asked():
    bars = [Bar("big", (100, 0)), Bar("small", (1, 1))]
    assert "small" in text_bars(bars, ("a", "b"), width=10)
    assert "█" not in text_bars(bars, ("a", "b"), width=10).splitlines()[2]
    assert text_bars(bars, ("a", "b"), width=10, visible_parts=True).splitlines()[2].startswith("small █░")


def test_nothing_to_draw_and_too_many_parts():
    assert text_bars([], ("x",), empty="no priced snapshots") == "no priced snapshots"
    with pytest.raises(ValueError, match="at most"):
        text_bars([Bar("a", (1,) * 7)], [str(n) for n in range(len(MARKS) + 1)])


def _health(durations: dict[str, list[int]]) -> Health:
    health = Health("default/default", Clock(()))
    health.durations = durations
    health.duration_max_ms = {t: 10.0 * (n + 1) for n, t in enumerate(sorted(durations))}
    return health


def test_progressor_durations_are_text_bars_per_bucket_with_the_table_when_it_fits():
    chart = durations_chart(_health({"call": [40, 2, 0, 0, 0, 1, 3], "timeout": [5, 0, 0, 0, 0, 0, 9]}))
    assert "data:" not in chart
    assert len(chart) < INLINE_MARKDOWN_LIMIT
    lines = chart.splitlines()
    assert [line.split()[0] for line in lines[1:8]] == list(BUCKET_LABELS)
    assert lines[1].endswith(" 45")
    assert lines[6].startswith("<=1000 █ ")  # 1 of 45 still shows
    assert lines[8] == "█ call (max 10 ms)  ░ timeout (max 20 ms)"
    assert "| call | 40 | 2 | 0 | 0 | 0 | 1 | 3 | 10 |" in chart
    assert durations_chart(_health({})) == "no finished tasks in the last 24 h"


def test_progressor_durations_of_every_task_type_stay_inline():
    types = ["init", "timeout", "call", "notify", "repair", "remove"]
    chart = durations_chart(_health({t: [10**6] * len(BUCKET_LABELS) for t in types}))
    assert len(chart) < INLINE_MARKDOWN_LIMIT
    assert "data:" not in chart
