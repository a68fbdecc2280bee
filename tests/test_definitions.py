"""Tier 1: the code location loads, in every deployment, through Python and through the CLI."""

import subprocess
import sys

import dagster as dg
import pytest

from infra.demo.definitions import build_local_definitions
from pipelines.definitions import ROOT_DIR, build_definitions, defs


def test_definitions_are_loadable():
    dg.Definitions.validate_loadable(defs)


def test_each_deployment_is_loadable_and_demo_traffic_is_make_devs_only():
    local, prod = build_local_definitions(), build_definitions("prod")
    dg.Definitions.validate_loadable(local)
    dg.Definitions.validate_loadable(prod)
    assert local.resolve_job_def("demo_traffic").name == "demo_traffic"
    assert "demo_traffic" not in {job.name for job in prod.resolve_all_job_defs()}
    schedule = local.resolve_schedule_def("demo_traffic_schedule")
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING


def test_the_cluster_runs_the_fan_out_jobs_on_celery_and_their_schedule_and_sensor_launch_those():
    cluster, local = build_definitions("cluster"), build_definitions("local")
    fan_out = ("reclaim_agendas", "receiver_batches_job", "batch_minute_job", "process_termination_queue")
    executors = {name: cluster.resolve_job_def(name).executor_def.name for name in fan_out}
    assert executors == dict.fromkeys(fan_out, "celery")
    assert local.resolve_job_def("receiver_batches_job").executor_def.name == "in_process"
    assert local.resolve_job_def("batch_minute_job").executor_def.name == "in_process"
    assert local.resolve_job_def("process_termination_queue").executor_def.name == "in_process"
    assert cluster.resolve_job_def("process_housekeeping_queue").executor_def.name == "in_process"
    assert cluster.resolve_schedule_def("batch_decider").job_name == "batch_minute_job"
    handoff_jobs = {t.job_name for t in cluster.resolve_sensor_def("batch_failures_handoff").targets}
    assert handoff_jobs == {"receiver_batches_job", "batch_minute_job"}
    assert cluster.resolve_sensor_def("termination_queue_sensor").job_name == "process_termination_queue"


def test_an_unknown_deployment_is_refused(monkeypatch):
    import pytest

    from resources import deployment_name

    monkeypatch.setenv("DAGSTER_DEPLOYMENT", "staging")
    with pytest.raises(ValueError, match="DAGSTER_DEPLOYMENT='staging'"):
        deployment_name()


@pytest.mark.parametrize(
    ("variable", "line"),
    [
        ("DAGSTER_DEPLOYMENT", "DAGSTER_DEPLOYMENT='staging' is not one of local, prod, cluster"),
        ("METRICS_SINK", "METRICS_SINK='staging' is not one of cloudwatch, none"),
    ],
)
def test_a_setting_that_stops_the_code_location_is_its_one_line_where_dagster_shows_the_load_error(
    monkeypatch, variable, line
):
    # What the code server keeps as the code location's load error, and the UI and
    # `dagster definitions validate` show: the line alone, no stack.
    from dagster._utils.error import serializable_error_info_from_exc_info

    from resources import deployment_name, resources_for

    monkeypatch.setenv(variable, "staging")
    with pytest.raises(ValueError) as info:
        resources_for("local") if variable == "METRICS_SINK" else deployment_name()
    shown = serializable_error_info_from_exc_info((info.type, info.value, info.tb))
    assert shown.message == line
    assert shown.stack == []
    assert shown.to_string() == line


@pytest.mark.cli
def test_dagster_definitions_validate_shows_an_unknown_deployment_in_one_line_without_a_traceback(tmp_path):
    import os

    env = {**os.environ, "DAGSTER_DEPLOYMENT": "staging", "DAGSTER_HOME": str(tmp_path)}
    (tmp_path / "dagster.yaml").write_text("")
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-m", "pipelines.definitions"],
        cwd=ROOT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert "DAGSTER_DEPLOYMENT='staging' is not one of local, prod, cluster" in output
    assert "Stack Trace" not in output
    assert "Traceback" not in output


@pytest.mark.cli
def test_dagster_definitions_validate_cli():
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
