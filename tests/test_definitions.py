"""Tier 1: the code location loads, in every deployment, through Python and through the CLI."""

import subprocess
import sys

import dagster as dg
import pytest

from pipelines.definitions import ROOT_DIR, build_definitions, defs


def test_definitions_are_loadable():
    dg.Definitions.validate_loadable(defs)


def test_each_deployment_is_loadable_and_demo_traffic_is_local_only():
    local, prod = build_definitions("local"), build_definitions("prod")
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
    assert cluster.resolve_sensor_def("batch_failures_handoff").job_name == "receiver_batches_job"
    assert cluster.resolve_sensor_def("termination_queue_sensor").job_name == "process_termination_queue"


def test_an_unknown_deployment_is_refused(monkeypatch):
    import pytest

    from resources import deployment_name

    monkeypatch.setenv("DAGSTER_DEPLOYMENT", "staging")
    with pytest.raises(ValueError, match="DAGSTER_DEPLOYMENT='staging'"):
        deployment_name()


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
