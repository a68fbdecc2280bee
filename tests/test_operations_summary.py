"""Run summaries: ``run_summary`` tags each run with its counters; ``operations_summary`` adds
them up per capability over 24 hours and 7 days."""

import datetime as dt

import dagster as dg
import pytest

from pipelines.common.defs.summary import operations_summary_asset, run_summary
from pipelines.common.summary import (
    COUNT_TAG_PREFIX,
    COUNTS_TAG,
    FIGURES,
    add_up,
    counts_tag,
    run_counters,
    run_counts,
    totals,
)

NOW = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)


def test_add_up_sums_per_capability_over_24_hours_and_7_days():
    tags = {"groundskeeper/capability": "reclaim", **counts_tag({"reclaimed": 3, "held": 9})}
    runs = [
        run_counts("reclaim_job", NOW - dt.timedelta(hours=1), tags),
        run_counts("reclaim_job", NOW - dt.timedelta(days=2), {**tags, **counts_tag({"reclaimed": 4})}),
        run_counts("reclaim_job", NOW - dt.timedelta(days=8), tags),  # too old
        run_counts("collect", NOW - dt.timedelta(hours=2), counts_tag({"zombies_collected": 2})),
    ]
    rows = add_up(runs, NOW)
    assert rows == [
        {"capability": "collect", "counter": "zombies_collected", "last_24h": 2, "last_7d": 2, "runs_7d": 1},
        {"capability": "reclaim", "counter": "reclaimed", "last_24h": 3, "last_7d": 7, "runs_7d": 2},
    ], "counters outside the summary's list (held) stay on the run"
    assert totals(rows)["reclaimed"] == 3


def test_the_counters_are_one_compact_tag_and_runs_tagged_one_counter_a_tag_still_count():
    assert counts_tag({"reclaimed": 3, "retried": 0}) == {COUNTS_TAG: '{"reclaimed":3,"retried":0}'}
    older = {f"{COUNT_TAG_PREFIX}reclaimed": "2", f"{COUNT_TAG_PREFIX}held": "x"}
    assert run_counters(older) == {"reclaimed": 2}
    assert run_counters({**older, COUNTS_TAG: '{"retried": 1}'}) == {"reclaimed": 2, "retried": 1}
    assert run_counters({COUNTS_TAG: "not json"}) == {}


def test_a_run_without_a_capability_tag_counts_under_its_assets_and_retries_stay_apart():
    runs = [
        run_counts("__ASSET_JOB", NOW, counts_tag({"batches_sent": 3}), ["batching"]),  # a backfill
        run_counts("__ASSET_JOB", NOW, counts_tag({"batches_sent": 1}), ["batching", None]),
        run_counts("__ASSET_JOB", NOW, counts_tag({"redriven": 1}), []),  # nothing to tell by: its job
        run_counts("reclaim_agendas", NOW, {"groundskeeper/capability": "reclaim", **counts_tag({"retried": 2})}),
        run_counts("collect_zombies", NOW, {"groundskeeper/capability": "progressor", **counts_tag({"retried": 5})}),
    ]
    rows = add_up(runs, NOW)
    assert {(r["capability"], r["counter"]): r["last_24h"] for r in rows} == {
        ("__ASSET_JOB", "redriven"): 1,
        ("batching", "batches_sent"): 4,
        ("progressor", "retried"): 5,
        ("reclaim", "retried"): 2,
    }
    figures = totals(rows)
    assert list(figures) == list(FIGURES)
    assert (figures["agendas_retried"], figures["timers_retried"], figures["batches_sent"]) == (2, 5, 4)


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
        assert tags[COUNTS_TAG] == '{"reclaimed":5,"retried":1}'
        assert not [key for key in tags if key.startswith(COUNT_TAG_PREFIX)]
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
        assert rows[("reclaim", "reclaimed")]["24 h"] == 10
        assert rows[("reclaim", "reclaimed")]["7 days"] == 10
        assert rows[("reclaim", "retried")]["24 h"] == 2
        assert rows[("fleet", "redriven")]["7 days"] == 4


@dg.asset(group_name="batching")
def batches_like(context: dg.AssetExecutionContext) -> None:
    run_summary(context, "batches demo", {"batches_sent": 3})


@pytest.mark.slow
def test_a_run_of_the_asset_job_counts_under_its_assets_capability():
    """A materialization from an asset page or a backfill runs Dagster's ``__ASSET_JOB``, without the
    capability tag of a job: it counts under its asset's capability (tag, else group)."""
    defs = dg.Definitions(assets=[batches_like, operations_summary_asset(lambda: defs.resolve_asset_graph())])
    job = defs.resolve_implicit_global_asset_job_def()
    with dg.instance_for_test() as instance:
        run = job.execute_in_process(instance=instance, asset_selection=[batches_like.key])
        assert instance.get_run_by_id(run.run_id).job_name == "__ASSET_JOB"
        result = job.execute_in_process(instance=instance, asset_selection=[dg.AssetKey("operations_summary")])
        [materialization] = result.asset_materializations_for_node("operations_summary")
    rows = {
        (r.data["capability"], r.data["counter"]): r.data["24 h"]
        for r in materialization.metadata["per_capability"].value.records
    }
    assert rows == {("batching", "batches_sent"): 3}
    assert materialization.metadata["batches_sent_24h"].value == 3
