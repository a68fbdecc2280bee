"""Run summaries: ``run_summary`` tags each run with its counters; ``operations_summary`` adds
them up per capability over 24 hours and 7 days."""

import datetime as dt

import dagster as dg
import pytest

from pipelines.common.defs.summary import operations_summary_asset, run_summary
from pipelines.common.summary import COUNT_TAG_PREFIX, add_up, run_counts, totals

NOW = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)


def test_add_up_sums_per_capability_over_24_hours_and_7_days():
    tags = {"groundskeeper/capability": "reclaim", f"{COUNT_TAG_PREFIX}reclaimed": "3", f"{COUNT_TAG_PREFIX}held": "9"}
    runs = [
        run_counts("reclaim_job", NOW - dt.timedelta(hours=1), tags),
        run_counts("reclaim_job", NOW - dt.timedelta(days=2), {**tags, f"{COUNT_TAG_PREFIX}reclaimed": "4"}),
        run_counts("reclaim_job", NOW - dt.timedelta(days=8), tags),  # too old
        run_counts("collect", NOW - dt.timedelta(hours=2), {f"{COUNT_TAG_PREFIX}zombies_collected": "2"}),
    ]
    rows = add_up(runs, NOW)
    assert rows == [
        {"capability": "collect", "counter": "zombies_collected", "last_24h": 2, "last_7d": 2, "runs_7d": 1},
        {"capability": "reclaim", "counter": "reclaimed", "last_24h": 3, "last_7d": 7, "runs_7d": 2},
    ], "counters outside the summary's list (held) stay on the run"
    assert totals(rows)["reclaimed"] == 3


@dg.op
def reclaims(context: dg.OpExecutionContext) -> None:
    run_summary(context, "reclaim demo", {"reclaimed": 2, "retried": 1})
    run_summary(context, "reclaim demo", {"reclaimed": 3, "retried": 0})  # a second partition: adds up


@dg.job(tags={"groundskeeper/capability": "reclaim"})
def reclaim_like():
    reclaims()


@dg.op
def redrives(context: dg.OpExecutionContext) -> None:
    run_summary(context, "redrive demo", {"redriven": 4})


@dg.job(tags={"groundskeeper/capability": "fleet"})
def redrive_like():
    redrives()


@pytest.mark.slow
def test_runs_are_tagged_and_the_asset_reads_them_back():
    with dg.instance_for_test() as instance:
        first = reclaim_like.execute_in_process(instance=instance)
        reclaim_like.execute_in_process(instance=instance)
        redrive_like.execute_in_process(instance=instance)
        tags = instance.get_run_by_id(first.run_id).tags
        assert tags[f"{COUNT_TAG_PREFIX}reclaimed"] == "5" and tags[f"{COUNT_TAG_PREFIX}retried"] == "1"
        messages = [r.user_message for r in instance.all_logs(first.run_id)]
        assert "summary: reclaim demo: reclaimed=2, retried=1" in messages

        result = dg.materialize([operations_summary_asset()], instance=instance)
        meta = result.asset_materializations_for_node("operations_summary")[0].metadata
        assert meta["reclaimed_24h"].value == 10
        assert meta["redriven_24h"].value == 4
        assert list(meta)[0] == "reclaimed_24h"
        table = meta["per_capability"].value
        assert len(table.schema.columns) <= 4
        rows = {(r.data["capability"], r.data["counter"]): r.data for r in table.records}
        assert rows[("reclaim", "reclaimed")]["24 h"] == 10 and rows[("reclaim", "reclaimed")]["7 days"] == 10
        assert rows[("reclaim", "retried")]["24 h"] == 2
        assert rows[("fleet", "redriven")]["7 days"] == 4
