"""An invalid environment value never stops the code location from loading: the capability whose
settings it is fails its own runs and sensors with one line naming the variable and its allowed
values, and the rest of the code location loads."""

import subprocess
import sys

import dagster as dg
import pytest

from pipelines.definitions import build_definitions
from resources import SettingsError, resources_for

VALID_JOBS = {job.name for job in build_definitions("local").resolve_all_job_defs()}


def _job_names(defs: dg.Definitions) -> set[str]:
    return {job.name for job in defs.resolve_all_job_defs()}


def _resource_failure(result) -> str:
    [event] = [e for e in result.all_events if e.event_type_value == "RESOURCE_INIT_FAILURE"]
    return event.event_specific_data.error.message


@pytest.mark.parametrize("value", ["9", "0", "-1", "two"])
def test_an_invalid_drain_runs_value_fails_the_fleet_only_with_one_line_naming_it(aws_shared, monkeypatch, value):
    monkeypatch.setenv("RUNS_FLEET_TERMINATION_DRAIN_RUNS", value)
    line = f"RUNS_FLEET_TERMINATION_DRAIN_RUNS={value!r} is invalid: a whole number from 1 to 8"
    defs = build_definitions("local")
    dg.Definitions.validate_loadable(defs)
    assert _job_names(defs) == VALID_JOBS  # every capability's jobs are there
    assert "receiver_batches_job" in VALID_JOBS
    assert "process_termination_queue" in VALID_JOBS
    resources = resources_for("local")
    assert resources["fleet"].invalid == line

    sensor = defs.resolve_sensor_def("termination_queue_sensor")
    with pytest.raises(dg.DagsterError) as raised:  # the sensor's resource setup wraps the line
        with dg.build_sensor_context(resources={k: resources[k] for k in ("sqs", "fleet")}) as context:
            sensor(context)
    chain, error = [], raised.value
    while error is not None:
        chain.append(error)
        error = error.__cause__ or error.__context__
    assert [str(e) for e in chain if isinstance(e, SettingsError)] == [line]

    result = defs.resolve_job_def("redrive_dead_letters").execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), raise_on_error=False
    )
    assert not result.success
    assert _resource_failure(result).strip().endswith(line)


def test_an_invalid_grouped_writes_value_loads_and_fails_the_runs_that_use_dynamodb(aws_shared, monkeypatch):
    monkeypatch.setenv("DYNAMODB_GROUPED_WRITES", "maybe")
    defs = build_definitions("local")
    dg.Definitions.validate_loadable(defs)
    assert _job_names(defs) == VALID_JOBS
    result = defs.resolve_job_def("batching_checks_job").execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), raise_on_error=False
    )
    assert not result.success
    assert _resource_failure(result).strip().endswith("DYNAMODB_GROUPED_WRITES='maybe' is invalid: true or false")


@pytest.mark.parametrize(
    ("name", "value", "line"),
    [
        (
            "BATCH_PARTITIONS_LOOKBACK_DAYS",
            "0",
            "BATCH_PARTITIONS_LOOKBACK_DAYS='0' is invalid: a whole number from 1 to 366",
        ),
        (
            "BATCH_PARTITIONS_START_DATE",
            "yesterday",
            "BATCH_PARTITIONS_START_DATE='yesterday' is invalid: a YYYY-MM-DD date",
        ),
    ],
)
def test_an_invalid_batch_partitions_value_fails_the_batching_runs_only(aws_shared, monkeypatch, name, value, line):
    monkeypatch.setenv(name, value)
    defs = build_definitions("local")
    dg.Definitions.validate_loadable(defs)
    assert _job_names(defs) == VALID_JOBS
    assert resources_for("local")["batching"].invalid == line
    result = defs.resolve_job_def("batching_checks_job").execute_in_process(
        instance=dg.DagsterInstance.ephemeral(), raise_on_error=False
    )
    assert not result.success
    assert _resource_failure(result).strip().endswith(line)


@pytest.mark.cli
def test_the_code_location_module_loads_with_invalid_values_in_its_environment(aws_shared):
    """In a fresh process, as a code server imports it: the values are read at import."""
    env = {
        **aws_shared.subprocess_env(),
        "RUNS_FLEET_TERMINATION_DRAIN_RUNS": "9",
        "BATCH_PARTITIONS_START_DATE": "yesterday",
        "BATCH_PARTITIONS_LOOKBACK_DAYS": "-1",
        "DYNAMODB_GROUPED_WRITES": "maybe",
    }
    code = "from pipelines.definitions import defs; print(sorted(j.name for j in defs.resolve_all_job_defs()))"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str(sorted(VALID_JOBS))


def _accepts(job: dg.JobDefinition, run_config: dict) -> bool:
    try:
        dg.validate_run_config(job, run_config)
    except dg.DagsterInvalidConfigError:
        return False
    return True


def test_no_job_takes_a_resource_setting_from_its_run_config():
    # The Launchpad, a backfill or `dagster job launch` would otherwise point the run's clients at another
    # endpoint, credential or database: the asset jobs have no flat config mapping to hide them behind.
    defs = build_definitions("prod")
    jobs = defs.resolve_all_job_defs()
    probe = {"resources": {"s3": {"config": {"endpoint_url": "http://elsewhere.example"}}}}
    assert "pool_cost_report_job" in {job.name for job in jobs}
    assert [job.name for job in jobs if _accepts(job, probe)] == []


def test_no_job_takes_where_its_step_outputs_go_from_its_run_config():
    # Dagster's default io_manager takes base_dir from run config: a step's output would be pickled
    # to, and the next step's input unpickled from, a folder the Launchpad named.
    jobs = build_definitions("prod").resolve_all_job_defs()
    probe = {"resources": {"io_manager": {"config": {"base_dir": "/tmp/elsewhere"}}}}
    assert [job.name for job in jobs if _accepts(job, probe)] == []


def test_a_fixed_resource_reads_its_environment_variable_when_the_run_starts(aws_shared, monkeypatch):
    from resources import fixed
    from resources.settings import FleetSettings, fleet_settings_from_env

    @dg.asset
    def table(fleet: FleetSettings) -> str:
        return fleet.jobs_table

    resources = fixed({"fleet": fleet_settings_from_env()})
    monkeypatch.setenv("RUNS_FLEET_JOBS_TABLE", "read-at-run-start")
    result = dg.materialize([table], resources=resources)
    assert result.output_for_node("table") == "read-at-run-start"


def test_a_fixed_resource_with_its_variable_unset_fails_the_run_with_one_line_naming_it(aws_shared, monkeypatch):
    from resources import fixed
    from resources.settings import FleetSettings, fleet_settings_from_env

    @dg.asset
    def table(fleet: FleetSettings) -> str:
        return fleet.jobs_table

    resources = fixed({"fleet": fleet_settings_from_env()})
    monkeypatch.delenv("RUNS_FLEET_JOBS_TABLE", raising=False)
    result = dg.materialize([table], resources=resources, raise_on_error=False)
    line = "resource fleet: the environment variable RUNS_FLEET_JOBS_TABLE is not set"
    assert _resource_failure(result).strip().endswith(line)
