"""Run summaries: ``run_summary`` tags each run with its counters; ``operations_summary`` adds
them up per capability over 24 hours and 7 days."""

import contextlib
import datetime as dt
import json
import random
import uuid
from collections.abc import Iterator
from unittest import mock

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.storage.runs.schema import RunsTable, RunTagsTable

from pipelines.common.defs.summary import (
    operations_summary_asset,
    own_outcome,
    run_summary,
    window_runs,
)
from pipelines.common.summary import (
    COUNT_TAG_PREFIX,
    COUNTS_TAG,
    DRY_RUN_TAG,
    FIGURES,
    WINDOWS,
    add_up,
    counts_tag,
    run_counters,
    run_counts,
    totals,
)
from tests.progressor_support import scratch_database
from tests.reclaim_support import PROGRESS_TABLE, reexecute_reclaim, seed_mixed
from tests.test_reclaim import BASE, _job

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
    own_outcome(context)  # as a job's first step
    run_summary(context, "reclaim demo", {"reclaimed": 2, "retried": 1})
    run_summary(context, "reclaim demo", {"reclaimed": 3, "retried": 0})  # a second partition: adds up


@dg.job(tags={"groundskeeper/capability": "reclaim"})
def reclaim_like():
    reclaims()


def test_a_counter_below_zero_is_not_a_count():
    assert run_counters(counts_tag({"errors": -1_000_000, "reclaimed": 2})) == {"reclaimed": 2}


def test_a_counter_past_any_number_is_not_a_count():
    assert run_counters({COUNTS_TAG: '{"x":1e400,"y":2}'}) == {"y": 2}


@pytest.mark.slow
def test_a_re_execution_with_its_parents_tags_counts_its_own_work_only():
    """The UI's re-execution and Dagster's run retries copy the parent's tags, its counts among them."""
    with dg.instance_for_test() as instance:
        parent = reclaim_like.execute_in_process(instance=instance)
        tags = {k: v for k, v in instance.get_run_by_id(parent.run_id).tags.items() if not k.startswith("dagster/")}
        options = dg.ReexecutionOptions(parent_run_id=parent.run_id)
        child = dg.execute_job(dg.reconstructable(reclaim_like), instance, tags=tags, reexecution_options=options)
        counted = run_counters(instance.get_run_by_id(child.run_id).tags)
    assert counted == {"reclaimed": 5, "retried": 1}


@dg.op
def plans(context: dg.OpExecutionContext) -> int:
    own_outcome(context)  # as a job's first step
    return 7


@dg.op
def reports(context: dg.OpExecutionContext, reclaimed: int) -> None:
    run_summary(context, "reclaim demo", {"reclaimed": reclaimed})


@dg.job(tags={"groundskeeper/capability": "reclaim"})
def planned_like():
    reports(plans())


def _reexecuted(instance: dg.DagsterInstance, job, parent_run_id: str, steps: list[str] | None = None) -> dict:
    """The counters of ``job`` re-executed as the UI does, with its parent's tags: its counters."""
    tags = {k: v for k, v in instance.get_run_by_id(parent_run_id).tags.items() if not k.startswith("dagster/")}
    options = dg.ReexecutionOptions(parent_run_id=parent_run_id, step_selection=steps)
    child = dg.execute_job(dg.reconstructable(job), instance, tags=tags, reexecution_options=options)
    return run_counters(instance.get_run_by_id(child.run_id).tags)


@pytest.mark.slow
def test_a_re_execution_of_its_last_step_only_counts_that_steps_report_once():
    with dg.instance_for_test() as instance:
        parent = dg.execute_job(dg.reconstructable(planned_like), instance)
        counted = _reexecuted(instance, planned_like, parent.run_id, ["reports"])
    assert counted == {"reclaimed": 7}


@pytest.mark.slow
def test_a_re_execution_of_a_run_with_the_older_per_counter_tags_counts_its_own_work_only():
    with dg.instance_for_test() as instance:
        legacy = {"groundskeeper/count/reclaimed": "7"}
        parent = dg.execute_job(dg.reconstructable(reclaim_like), instance, tags=legacy)
        counted = _reexecuted(instance, reclaim_like, parent.run_id)
    assert counted == {"reclaimed": 5, "retried": 1}


def _reclaimed_24h(instance: dg.DagsterInstance) -> int:
    result = dg.materialize([operations_summary_asset()], instance=instance)
    return result.asset_materializations_for_node("operations_summary")[0].metadata["reclaimed_24h"].value


@pytest.mark.slow
def test_a_re_execution_that_fails_before_its_summary_counts_none_of_its_parents_work(aws):
    ddb = aws.client("dynamodb")
    seed_mixed(ddb)
    with dg.instance_for_test() as instance:
        parent = _job().execute_in_process(run_config=BASE, instance=instance)  # reclaims the 7 stale agendas
        ddb.delete_table(TableName=PROGRESS_TABLE)  # its re-execution fails as it plans
        assert not reexecute_reclaim(instance, parent.run_id).success
        assert _reclaimed_24h(instance) == 7


@pytest.mark.slow
def test_a_re_execution_of_a_run_that_stepped_aside_counts_what_it_reclaimed(aws):
    seed_mixed(aws.client("dynamodb"))
    with dg.instance_for_test() as instance:
        older = instance.create_run_for_job(_job(), run_config=BASE, status=dg.DagsterRunStatus.STARTED)
        parent = _job().execute_in_process(run_config=BASE, instance=instance)  # steps aside: a dry run
        instance.report_run_canceled(older)  # the table is free
        reexecute_reclaim(instance, parent.run_id)
        assert _reclaimed_24h(instance) == 7


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


@dg.op
def dry_redrives(context: dg.OpExecutionContext) -> None:
    run_summary(context, "redrive demo", {"redriven": 4}, dry_run=True)


@dg.job(tags={"groundskeeper/capability": "fleet"})
def dry_redrive_like():
    dry_redrives()


@pytest.mark.slow
def test_a_dry_run_is_tagged_as_one_keeps_its_counts_and_the_asset_does_not_add_them_up():
    with dg.instance_for_test() as instance:
        redrive_like.execute_in_process(instance=instance)
        dry = dry_redrive_like.execute_in_process(instance=instance)
        tags = instance.get_run_by_id(dry.run_id).tags
        assert tags[DRY_RUN_TAG] == "true"
        assert tags[COUNTS_TAG] == '{"redriven":4}'
        messages = [r.user_message for r in instance.all_logs(dry.run_id)]
        assert "summary: redrive demo: redriven=4 (dry run)" in messages
        result = dg.materialize([operations_summary_asset()], instance=instance)
    meta = result.asset_materializations_for_node("operations_summary")[0].metadata
    assert meta["redriven_24h"].value == 4


def test_a_run_tagged_dry_run_counts_nothing():
    tags = {"groundskeeper/capability": "reclaim", DRY_RUN_TAG: "true", **counts_tag({"reclaimed": 3})}
    assert run_counts("reclaim_agendas", NOW, tags).counts == {}


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


CAPABILITY_COUNTERS = {
    "reclaim": ("reclaimed", "retried"),
    "batching": ("batches_sent",),
    "fleet": ("dead_lettered", "redriven"),
    "progressor": ("zombies_collected", "retried"),
}
BOUNDARY_MARGIN = dt.timedelta(minutes=30)
"""No run is this close to the 24-hour or 7-day edge: the asset's clock runs later than the test's."""


def add_runs(instance: dg.DagsterInstance, runs: list[tuple[DagsterRun, dt.datetime]]) -> None:
    """Many runs, each created when given, into the instance's run storage in one transaction (as
    ``add_historical_run`` adds one: the same column values)."""
    storage = instance.run_storage
    # the storage asks its schema whether it has the backfill column for every run: once is enough here
    has_backfill_id = storage.has_backfill_id_column()
    with mock.patch.object(storage, "has_backfill_id_column", return_value=has_backfill_id):
        values = [storage._get_run_insertion_values(run, created) for run, created in runs]
    with storage.connect() as conn:
        conn.execute(RunsTable.insert(), values)
        conn.execute(
            RunTagsTable.insert(),
            [{"run_id": r.run_id, "key": k, "value": v} for r, _ in runs for k, v in r.tags_for_storage().items()],
        )


def history(count: int, now: dt.datetime, seed: int = 5) -> list[tuple[DagsterRun, dt.datetime]]:
    """``count`` runs created over the last 8 days: most with a capability and counters, some
    without counters, some without a capability tag (they count under their job's name)."""
    rng = random.Random(seed)
    out = []
    for n in range(count):
        age = rng.uniform(0, 8 * 86_400)
        while any(abs(age - edge.total_seconds()) < BOUNDARY_MARGIN.total_seconds() for edge in WINDOWS.values()):
            age = rng.uniform(0, 8 * 86_400)
        capability = rng.choice(sorted(CAPABILITY_COUNTERS))
        tags = {} if n % 13 == 0 else {"groundskeeper/capability": capability}
        if n % 10:
            tags.update(counts_tag({c: rng.randint(0, 9) for c in CAPABILITY_COUNTERS[capability]}))
        run = DagsterRun(job_name=f"{capability}_job", run_id=str(uuid.UUID(int=rng.getrandbits(128))), tags=tags)
        out.append((run, now - dt.timedelta(seconds=age)))
    return out


def expected_rows(runs: list[tuple[DagsterRun, dt.datetime]], now: dt.datetime) -> tuple[dict, int]:
    """The per-capability table the summary must show, summed here run by run: ``{(capability,
    counter): [24 h, 7 days]}``, and how many runs the 7 days hold."""
    expected: dict[tuple[str, str], list[int]] = {}
    in_window = 0
    for run, created in runs:
        age = now - created
        if age > WINDOWS["last_7d"]:
            continue
        in_window += 1
        capability = run.tags.get("groundskeeper/capability") or run.job_name
        for counter, value in json.loads(run.tags.get(COUNTS_TAG, "{}")).items():
            sums = expected.setdefault((capability, counter), [0, 0])
            sums[0] += value if age <= WINDOWS["last_24h"] else 0
            sums[1] += value
    return expected, in_window


def summarize(instance: dg.DagsterInstance) -> dict:
    result = dg.materialize([operations_summary_asset()], instance=instance)
    return result.asset_materializations_for_node("operations_summary")[0].metadata


def table_of(meta: dict) -> dict[tuple[str, str], list[int]]:
    return {
        (r.data["capability"], r.data["counter"]): [r.data["24 h"], r.data["7 days"]]
        for r in meta["per_capability"].value.records
    }


@contextlib.contextmanager
def instance_on(storage: str) -> Iterator[dg.DagsterInstance]:
    """A Dagster instance whose run storage is SQLite (as make dev's) or PostgreSQL (as production's)."""
    if storage == "sqlite":
        with dg.instance_for_test() as instance:
            yield instance
        return
    with (
        scratch_database("gk_dagster") as url,
        dg.instance_for_test(
            overrides={
                "storage": {"postgres": {"postgres_url": url.replace("postgresql://", "postgresql+psycopg2://")}}
            }
        ) as instance,
    ):
        yield instance


@pytest.mark.slow
def test_the_summary_counts_every_run_of_its_windows_with_50000_runs_in_them():
    now = dt.datetime.now(dt.UTC)
    runs = history(58_000, now)
    expected, in_window = expected_rows(runs, now)
    assert in_window >= 50_000
    with dg.instance_for_test() as instance:
        add_runs(instance, runs)
        meta = summarize(instance)
    assert table_of(meta) == expected
    assert meta["runs_read"].value == in_window + 1, "every run of the 7 days, and the summary's own run"
    assert meta["window_complete"].value is True


@pytest.mark.postgres
def test_the_summary_adds_up_a_postgresql_instance_too():
    now = dt.datetime.now(dt.UTC)
    runs = history(3_000, now)
    expected, in_window = expected_rows(runs, now)
    with instance_on("postgres") as instance:
        add_runs(instance, runs)
        meta = summarize(instance)
    assert table_of(meta) == expected
    assert meta["runs_read"].value == in_window + 1


@pytest.mark.parametrize("storage", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_small_pages_read_every_run_of_the_window_once(storage):
    """Paged through ``get_run_records`` 7 at a time: every run created in the window, each once."""
    now = dt.datetime.now(dt.UTC)
    since = now - WINDOWS["last_7d"]
    runs = history(300, now)
    with instance_on(storage) as instance:
        add_runs(instance, runs)
        read = [(r.job_name, r.created) for r in window_runs(instance, since, page=7)]
    wanted = sorted((run.job_name, created) for run, created in runs if created > since)
    assert sorted(read) == wanted
