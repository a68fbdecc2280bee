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
