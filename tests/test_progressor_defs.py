"""The Dagster layer of progressor zombie collection: the job (in process and via the CLI), the schedules,
the health asset and its checks and the retry preset."""

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import psycopg2
import pytest
from psycopg2 import sql

from infra.demo import progressor_engine as engine
from infra.demo.progressor_schema import create_namespace
from pipelines.common.charts import INLINE_MARKDOWN_LIMIT
from pipelines.progressor.defs import (
    collect_zombies_job,
    health_asset,
    health_schedule,
    schedule_for,
)
from pipelines.progressor.params import collect_params
from pipelines.progressor.schema import tables_for
from pipelines.progressor.targets import Target, dagster_name, load_targets
from pipelines.retry.presets import preset
from resources.clients import CloudWatchResource
from resources.postgres import ProgressorDatabase
from tests.progressor_support import finished_task, local_run_limits, scratch_database, unique_namespace

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parent.parent


class RecordingCloudWatch(CloudWatchResource):
    """Keeps the PutMetricData calls instead of sending them."""

    def get_client(self):
        return _Recorder


class _Recorder:
    calls: list = []

    @classmethod
    def put_metric_data(cls, **kwargs):
        cls.calls.append(kwargs)


@pytest.fixture(scope="module")
def dsn():
    with scratch_database() as url:
        yield url


@pytest.fixture
def zombie_ns(dsn):
    """A namespace with two zombies (a timer and a call), a live task and finished history, and an idle process
    with an overdue timer."""

    def seed(cur, t) -> None:
        engine.start_process(cur, t, "p-timer", age_seconds=300, task_type="timeout")
        engine.start_process(cur, t, "p-call", age_seconds=300, task_type="call")
        engine.start_process(cur, t, "p-live", age_seconds=5)
        for ms in (30, 120, 400, 2000):
            finished_task(cur, t, "p-live", "call", duration_ms=ms, ago=60)
        engine.start_process(cur, t, "p-idle", age_seconds=2 * 86400)
        cur.execute(t.sql("DELETE FROM {running} WHERE process_id = 'p-idle'"))
        cur.execute(
            t.sql("UPDATE {tasks} SET status = 'finished', finished_time = running_time WHERE process_id = 'p-idle'")
        )
        engine.schedule_task(cur, t, "p-idle", "timeout", in_seconds=-200)  # overdue timer

    return _seeded(dsn, "defs", seed)


def _seeded(dsn, prefix: str, seed) -> str:
    """A new namespace, ``seed(cursor, tables)`` written in one transaction."""
    ns = unique_namespace(prefix)
    conn = psycopg2.connect(dsn)
    t = create_namespace(conn, ns)
    with conn, conn.cursor() as cur:
        seed(cur, t)
    conn.close()
    return ns


def _resources(dsn):
    _Recorder.calls.clear()
    return {"progressor_db": ProgressorDatabase(dsn=dsn), "cloudwatch": RecordingCloudWatch()}


def _run(dsn, config: dict):
    return collect_zombies_job.execute_in_process(run_config=config, resources=_resources(dsn), raise_on_error=False)


def _metadata(result) -> dict:
    return result.output_for_node("collect_namespace_zombies")


def test_job_flat_config_error_action(dsn, zombie_ns):
    result = _run(dsn, {"namespace": zombie_ns})
    assert result.success
    out = _metadata(result)
    assert (out["found"], out["errored"], out["retried"], out["skipped_locked"], out["batches_rolled_back"]) == (
        2,
        2,
        0,
        0,
        0,
    )


def test_job_retry_action(dsn, zombie_ns):
    out = _metadata(_run(dsn, {"namespace": zombie_ns, "action": "retry"}))
    assert (out["retried"], out["errored"]) == (1, 1)


def test_job_metadata_names_the_counts(dsn, zombie_ns):
    result = _run(dsn, {"namespace": zombie_ns})
    [materialization] = [
        e
        for e in result.all_node_events
        if e.event_type_value == "STEP_OUTPUT" and e.step_key == "collect_namespace_zombies"
    ]
    keys = set(materialization.event_specific_data.metadata)
    assert {"found", "errored", "retried", "skipped_locked", "batches_rolled_back"} <= keys


def test_job_sends_zombies_collected(dsn, zombie_ns):
    _run(dsn, {"namespace": zombie_ns})
    datum = _Recorder.calls[0]["MetricData"][0]
    assert (datum["MetricName"], datum["Value"], datum["Dimensions"][0]["Value"]) == (
        "ProgressorZombiesCollected",
        2,
        zombie_ns,
    )


def test_job_dry_run_sends_nothing_and_collects_nothing(dsn, zombie_ns):
    out = _metadata(_run(dsn, {"namespace": zombie_ns, "dry_run": True}))
    assert (out["found"], out["would_error"], out["errored"], _Recorder.calls) == (2, 2, 0, [])


def _failure_line(result) -> str:
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    return failure.event_specific_data.error.message.strip()


def test_job_namespace_without_tables_fails_with_one_line(dsn):
    result = _run(dsn, {"namespace": "missing/ns"})
    assert _failure_line(result).endswith("namespace 'missing/ns' has no progressor tables in this database")


def test_job_unreachable_dsn_fails_with_one_line():
    result = _run("postgresql://postgres:secret@127.0.0.1:9/progressor", {"namespace": "default/default"})
    line = _failure_line(result)
    assert "cannot reach the progressor database at 127.0.0.1:9/progressor (PROGRESSOR_DSN)" in line
    assert "secret" not in line


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://collector:S3cr3t%Pw@127.0.0.1:9/progressor",  # '%' not followed by two hex digits
        "host=127.0.0.1 port=9 user=collector password S3cr3tPw dbname=progressor",  # a missing '='
    ],
)
def test_job_malformed_dsn_fails_with_one_line_without_the_password(dsn):
    line = _failure_line(_run(dsn, {"namespace": "default/default"}))
    assert "not a valid connection string (its value is not shown)" in line
    assert "S3cr3t" not in line


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://collector:S3cr3t@PwTail@127.0.0.1:9/progressor",  # libpq's host: PwTail@127.0.0.1
        "postgresql://collector:S3cr3t@PwTail:9@127.0.0.1:9/progressor",  # libpq's host PwTail, port 9@127...
        "postgresql://collector:S3cr3t/PwTail@127.0.0.1:9/progressor",  # libpq's host collector, port S3cr3t
        "postgresql://collector:12/PwTail@127.0.0.1:9/progressor",  # libpq's port 12, dbname PwTail@127...
    ],
)
def test_job_dsn_whose_password_holds_a_url_delimiter_fails_with_one_line_without_the_password(dsn):
    line = _failure_line(_run(dsn, {"namespace": "default/default"}))
    assert "password (or user name) holds an unencoded '@' or '/', percent-encode it" in line
    assert "PwTail" not in line


@pytest.mark.parametrize(
    "user_info, query",
    [("{user}:pa?ss@", ""), ("{user}:pa#ss@", ""), ("", "?user={user}&application_name=gk@prod")],
    ids=["password with ?", "password with #", "an @ in the query"],
)
def test_a_dsn_libpq_reads_as_meant_connects(dsn, user_info, query):
    """libpq takes a URL's user-info up to its first '@' ('?' and '#' in a password are its own) and never looks
    for one in the query: such a DSN is not refused (this server trusts any password)."""
    head, _, tail = dsn.partition("://")
    user, _, where = tail.partition("@")
    url = f"{head}://{user_info.format(user=user)}{where}{query.format(user=user)}"
    with ProgressorDatabase(dsn=url).connection() as conn, conn.cursor() as cur:
        cur.execute("SELECT 1")
        assert cur.fetchone() == (1,)


def test_job_bad_value_fails_with_one_line(dsn):
    result = _run(dsn, {"namespace": "default/default", "batch_size": 0})
    assert _failure_line(result).endswith("invalid run config: batch_size must be at least 1, got 0")


def test_config_fields_have_descriptions():
    fields = collect_zombies_job.config_mapping.config_schema.config_type.fields
    missing = [name for name, field in fields.items() if not field.description]
    assert missing == []


def test_local_targets_make_one_schedule_every_minute(monkeypatch):
    monkeypatch.setenv("GROUNDSKEEPER_DEMO", "busy")  # the targets file's cadence (quiet: test_demo_cadence)
    [target] = load_targets(ROOT / "infra" / "demo" / "targets" / "progressor.json")
    schedule = schedule_for(target)
    assert (schedule.name, schedule.cron_schedule) == ("collect_zombies_default_default", "* * * * *")


def test_schedule_run_config_is_flat():
    [target] = load_targets(ROOT / "infra" / "demo" / "targets" / "progressor.json")
    schedule = schedule_for(target)
    data = schedule.evaluate_tick(dg.build_schedule_context())
    [request] = data.run_requests
    assert request.run_config["namespace"] == "default/default"


def _tick(schedule, dsn, instance=None, at=None):
    context = dg.build_schedule_context(
        instance=instance,
        resources={"progressor_db": ProgressorDatabase(dsn=dsn)},
        scheduled_execution_time=at or dt.datetime.now(dt.UTC),
    )
    return schedule.evaluate_tick(context)


def test_collect_zombies_schedule_skips_without_zombies_and_runs_with_them(dsn, zombie_ns):
    calm = unique_namespace("calm")
    conn = psycopg2.connect(dsn)
    t = create_namespace(conn, calm)
    with conn, conn.cursor() as cur:
        engine.start_process(cur, t, "p-live", age_seconds=5)
    conn.close()
    with dg.instance_for_test(overrides=local_run_limits()) as instance:
        idle = _tick(schedule_for(load_targets_for(calm)[0]), dsn, instance)
        assert idle.run_requests == []
        assert idle.skip_message == f"no running task of {calm} older than 96s"
        schedule = schedule_for(load_targets_for(zombie_ns)[0])
        (request,) = _tick(schedule, dsn, instance).run_requests
        assert request.run_config == {"namespace": zombie_ns}
        # While that run is queued, the next tick does not queue another.
        instance.create_run_for_job(collect_zombies_job, run_config=request.run_config, tags=request.tags)
        assert "is still queued" in _tick(schedule, dsn, instance).skip_message


@pytest.fixture(scope="module")
def tokyo_dsn():
    """A database whose default TimeZone, the one progressor's sessions get, is Asia/Tokyo."""
    with scratch_database() as url:
        conn = psycopg2.connect(url)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT current_database()")
            cur.execute(
                sql.SQL("ALTER DATABASE {} SET TimeZone = 'Asia/Tokyo'").format(sql.Identifier(cur.fetchone()[0]))
            )
        conn.close()
        yield url


@pytest.mark.parametrize("writer_time_zone", ["Asia/Tokyo", None])
def test_collect_zombies_schedule_reads_running_times_in_the_writers_zone(request, writer_time_zone):
    """progressor in Asia/Tokyo stores TO_TIMESTAMP(<UTC text>) 9 h early: the look reads it back as the run does,
    in writer_time_zone or else the zones progressor's sessions may use (here the database's)."""
    url = request.getfixturevalue("dsn" if writer_time_zone else "tokyo_dsn")
    tokyo_hours = 9 * 3600
    ns = _seeded(url, "tokyo", lambda cur, t: engine.start_process(cur, t, "p-live", age_seconds=tokyo_hours + 5))
    config = {"namespace": ns, **({"writer_time_zone": writer_time_zone} if writer_time_zone else {})}
    target = Target(name=dagster_name(ns), cron="* * * * *", config=config, params=collect_params(config))
    schedule = schedule_for(target)
    with dg.instance_for_test(overrides=local_run_limits()) as instance:
        live_only = _tick(schedule, url, instance)
        conn = psycopg2.connect(url)
        with conn, conn.cursor() as cur:
            engine.start_process(cur, tables_for(ns), "p-dead", age_seconds=tokyo_hours + 3600)
        conn.close()
        with_a_zombie = _tick(schedule, url, instance)
    assert live_only.skip_message == f"no running task of {ns} older than 96s"
    assert len(with_a_zombie.run_requests) == 1


def _health_run_by_schedule(dsn, ns: str, instance):
    """The health schedule of ``ns`` and its first request, whose run has run (it raises on failure)."""
    [target] = load_targets_for(ns)
    job = dg.define_asset_job("progressor_health_job", selection=dg.AssetSelection.groups("progressor"))
    defs = dg.Definitions(assets=[health_asset(target)], jobs=[job], resources=_resources(dsn))
    schedule = health_schedule([target], job)
    (first,) = _tick(schedule, dsn, instance).run_requests
    defs.resolve_job_def("progressor_health_job").execute_in_process(instance=instance, tags=first.tags)
    return schedule, first


def test_health_schedule_runs_when_a_check_would_change_and_at_least_hourly(dsn, zombie_ns):
    with dg.instance_for_test() as instance:
        schedule, first = _health_run_by_schedule(dsn, zombie_ns, instance)
        same = _tick(schedule, dsn, instance)
        assert same.run_requests == []
        assert f"{zombie_ns}: failing no_zombies, timers_on_time, oldest_running_task: unchanged" in same.skip_message

        _run(dsn, {"namespace": zombie_ns})  # the zombies are collected: no_zombies passes now
        (changed,) = _tick(schedule, dsn, instance).run_requests
        assert changed.tags != first.tags
        an_hour_on = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
        assert len(_tick(schedule, dsn, instance, at=an_hour_on).run_requests) == 1


@pytest.fixture
def live_ns(dsn):
    """A namespace where every check passes: a few young running tasks, no timers, no errors."""
    return _seeded(
        dsn, "live", lambda cur, t: [engine.start_process(cur, t, f"p-{k}", age_seconds=5) for k in range(3)]
    )


def test_health_schedule_skips_when_a_task_finishes_and_every_check_still_passes(dsn, live_ns):
    with dg.instance_for_test() as instance:
        schedule, _ = _health_run_by_schedule(dsn, live_ns, instance)
        conn = psycopg2.connect(dsn)
        t = create_namespace(conn, live_ns)
        engine.complete_running(conn, t, "p-1")  # live progress: one task finishes, another process starts
        with conn, conn.cursor() as cur:
            engine.start_process(cur, t, "p-new", age_seconds=1)
        conn.close()
        assert _tick(schedule, dsn, instance).run_requests == []


class _RecordingCursor(psycopg2.extensions.cursor):
    statements: list[str] = []

    def execute(self, query, vars=None):
        self.statements.append(query if isinstance(query, str) else query.as_string(self))
        return super().execute(query, vars)


def test_health_schedule_look_reads_the_tasks_table_by_key_only(dsn, live_ns, monkeypatch):
    """The look reads what the checks need (processes, running, schedule, and the corrupted_by task of a process
    in error, by key): not the tasks by status or the durations, whose scans grow with the tasks' history."""
    [target] = load_targets_for(live_ns)
    connect = psycopg2.connect
    monkeypatch.setattr(psycopg2, "connect", lambda *a, **kw: connect(*a, cursor_factory=_RecordingCursor, **kw))
    job = dg.define_asset_job("progressor_health_job", selection=dg.AssetSelection.groups("progressor"))
    _RecordingCursor.statements.clear()
    with dg.instance_for_test() as instance:
        _tick(health_schedule([target], job), dsn, instance)
    read = " ".join(_RecordingCursor.statements)
    assert f'"{tables_for(live_ns).name("running")}"' in read  # the look did read
    tasks = f'"{tables_for(live_ns).name("tasks")}"'
    assert [s for s in _RecordingCursor.statements if tasks in s and "t.task_id = p.corrupted_by" not in s] == []


def test_bad_target_is_one_line(tmp_path):
    path = tmp_path / "targets.json"
    path.write_text(json.dumps([{"namespace": "default/default", "batch_size": -3}]))
    with pytest.raises(ValueError, match=r"entry 0: batch_size must be at least 1, got -3$"):
        load_targets(path)


def _health(dsn, ns):
    [target] = load_targets_for(ns)
    asset = health_asset(target)
    return dg.materialize([asset], resources=_resources(dsn), raise_on_error=False)


def load_targets_for(ns):
    return [
        Target(
            name=dagster_name(ns), cron="* * * * *", config={"namespace": ns}, params=collect_params({"namespace": ns})
        )
    ]


def _check(result, name):
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == name]
    return evaluation


def test_health_zombies_check_is_an_error(dsn, zombie_ns):
    evaluation = _check(_health(dsn, zombie_ns), "no_zombies")
    assert (evaluation.passed, evaluation.severity) == (False, dg.AssetCheckSeverity.ERROR)


def test_health_overdue_timers_check_names_the_scanner(dsn, zombie_ns):
    evaluation = _check(_health(dsn, zombie_ns), "timers_on_time")
    assert "timer scanner is behind or stopped" in evaluation.description


def test_health_checks_pass_after_collection(dsn, zombie_ns):
    _run(dsn, {"namespace": zombie_ns})
    evaluation = _check(_health(dsn, zombie_ns), "no_zombies")
    assert evaluation.passed


def test_health_recent_errors_warn_after_collection(dsn, zombie_ns):
    _run(dsn, {"namespace": zombie_ns})
    evaluation = _check(_health(dsn, zombie_ns), "no_recent_process_errors")
    assert (evaluation.passed, evaluation.severity) == (False, dg.AssetCheckSeverity.WARN)


def test_health_task_durations_chart_shows_inline(dsn, zombie_ns):
    result = _health(dsn, zombie_ns)
    [materialization] = result.asset_materializations_for_node(result.all_node_events[0].node_name)
    chart = materialization.metadata["task_durations"].value
    # text bars in a code block under the UI's inline limit: no image (a data: one never shows)
    assert "data:" not in chart
    assert "![" not in chart
    assert len(chart) < INLINE_MARKDOWN_LIMIT
    assert chart.startswith("```\n<=50 ")
    assert "█" in chart
    assert "(max " in chart


def test_health_sends_overdue_timers_and_durations(dsn, zombie_ns):
    _health(dsn, zombie_ns)
    names = [d["MetricName"] for call in _Recorder.calls for d in call["MetricData"]]
    assert names == ["ProgressorOverdueTimers", "ProgressorTaskDuration"]


def test_retry_preset_progressor_in_the_library():
    policy = preset("progressor")
    assert [policy.delay(n) for n in (1, 2)] == [5.0, 5.0]


@pytest.mark.cli
def test_cli_runs_the_flat_config(dsn, zombie_ns, aws, tmp_path):
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"namespace": zombie_ns, "action": "retry"}))
    cmd = [sys.executable, "-m", "dagster", "job", "execute", "-m", "pipelines.definitions", "-j", "collect_zombies"]
    env = {**aws.subprocess_env(), "PROGRESSOR_DSN": dsn}
    result = subprocess.run([*cmd, "-c", str(config)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "found 2, errored 1, retried 1, skipped_locked 0, batches_rolled_back 0" in result.stdout + result.stderr
