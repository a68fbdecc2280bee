"""Demo traffic: the pure step, the job in process, and the job through the dagster CLI."""

import dataclasses
import datetime as dt
import json
import subprocess
import sys

import dagster as dg
import pytest

from infra.demo.batching import DEMO_RECEIVERS, RecordTraffic
from infra.demo.definitions import build_local_definitions
from infra.demo.defs import demo_traffic_step
from infra.demo.fleet import DEMO_POOLS, FleetTraffic
from infra.demo.reclaim import AgendaTraffic
from infra.demo.traffic import DEMO_PARAMS, DemoConfig, DemoTargets, run_demo_traffic
from pipelines.common.params import ParamsError
from pipelines.definitions import ROOT_DIR

NO_LEFTOVERS = {"duplicate_messages": 0, "old_jobs": 0, "orphan_instances": 0}


def _clients(aws):
    return {name: aws.client(name) for name in ("dynamodb", "ec2", "ssm", "sqs")}


def _count(aws, table_env):
    return aws.client("dynamodb").scan(TableName=aws.env[table_env], Select="COUNT")["Count"]


def _queue_depth(aws, queue_env):
    attrs = aws.client("sqs").get_queue_attributes(
        QueueUrl=aws.env[queue_env], AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"])


@pytest.mark.slow
def test_demo_steps_move_agendas_run_jobs_and_add_records(aws):
    now = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
    cfg = DemoConfig(
        reclaim=AgendaTraffic(new_agendas=6, stuck_agendas=2),
        fleet=FleetTraffic(jobs_started=5, jobs_finished=3, malformed_messages=2, **NO_LEFTOVERS),
        batching=RecordTraffic(records=30),
        seed=1,
    )
    targets = DemoTargets.from_env(aws.env)
    first = run_demo_traffic(targets=targets, cfg=cfg, now=now, **_clients(aws))
    assert first["agendas_added"] == 6
    assert first["agendas_stuck"] == 2
    assert first["agendas_started"] == 6  # every WAITING agenda was picked up
    assert first["jobs_started"] == 5
    assert first["records_added"] == 30
    assert first["pools_created"] == len(DEMO_POOLS)
    assert first["receivers_created"] == len(DEMO_RECEIVERS)

    cfg = dataclasses.replace(cfg, seed=2)  # a new seed: new ids
    second = run_demo_traffic(targets=targets, cfg=cfg, now=now + dt.timedelta(seconds=30), **_clients(aws))
    assert second["pools_created"] == 0
    assert second["receivers_created"] == 0  # idempotent set-up
    assert second["agendas_completed"] >= 6  # the ones started in step one completed
    assert second["jobs_finished"] == 3

    ddb = aws.client("dynamodb")
    items = ddb.scan(TableName=aws.env["AGENDA_PROGRESS_TABLE"])["Items"]
    states = {}
    for item in items:
        states[item["processingState"]["S"]] = states.get(item["processingState"]["S"], 0) + 1
    assert states.get("COMPLETE", 0) >= 6
    assert states.get("EXECUTING", 0) >= 4  # 4 stuck + newly started
    stuck = [
        i
        for i in items
        if i["processingState"]["S"] == "EXECUTING"
        and int(i["updatedTime"]["N"]) < int(now.timestamp() * 1000) - 5 * 60_000
    ]
    assert len(stuck) == 4

    assert _count(aws, "RUNS_FLEET_JOBS_TABLE") == 10
    assert _count(aws, "BATCH_RECORDS_TABLE") == 60
    # 3 finished jobs plus 2 + 2 malformed messages wait on the termination queue.
    assert _queue_depth(aws, "RUNS_FLEET_TERMINATION_QUEUE_URL") == 7
    bodies = []
    sqs = aws.client("sqs")
    while True:
        got = sqs.receive_message(
            QueueUrl=aws.env["RUNS_FLEET_TERMINATION_QUEUE_URL"], MaxNumberOfMessages=10, VisibilityTimeout=60
        ).get("Messages", [])
        if not got:
            break
        bodies += [m["Body"] for m in got]
    valid = []
    for body in bodies:
        try:
            parsed = json.loads(body)
        except ValueError:
            continue
        if (
            isinstance(parsed, dict)
            and parsed.get("status") in {"success", "failure", "timeout", "interrupted"}
            and str(parsed.get("instance_id", "")).startswith("i-")
            and "/" not in parsed["instance_id"]
        ):
            valid.append(parsed)
    assert len(valid) == 3
    params = aws.client("ssm").get_parameters_by_path(Path="/runs-fleet/runners/", Recursive=True)["Parameters"]
    assert len(params) == 10


@pytest.mark.slow
def test_demo_traffic_job_in_process(aws):
    defs = build_local_definitions()
    result = defs.resolve_job_def("demo_traffic").execute_in_process(
        run_config={"ops": {"demo_traffic_step": {"config": {"seed": 3, "records": 12}}}},
        instance=dg.DagsterInstance.ephemeral(),
    )
    counts = result.output_for_node("demo_traffic_step")
    assert counts["records_added"] == 12
    mat = result.get_step_success_events()[0]
    assert mat is not None
    assert _count(aws, "BATCH_RECORDS_TABLE") == 12


@pytest.mark.cli
def test_demo_traffic_job_through_the_dagster_cli(aws):
    before = _count(aws, "AGENDA_PROGRESS_TABLE")
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "job", "execute", "-m", "infra.demo.definitions", "-j", "demo_traffic"],
        cwd=ROOT_DIR,
        env=aws.subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "RUN_SUCCESS" in result.stdout + result.stderr
    assert _count(aws, "AGENDA_PROGRESS_TABLE") == before + 11  # 10 new + 1 stuck by default
    assert _count(aws, "BATCH_RECORDS_TABLE") == 40


def test_the_job_and_the_plain_step_share_one_declaration_with_the_job_defaults():
    schema = demo_traffic_step.config_schema.config_type.fields
    declared = [f for kind in DEMO_PARAMS for f in dataclasses.fields(kind)]
    assert len(schema) == len(declared)  # each capability's keys, no two with one name
    assert set(schema) == {f.name for f in declared}
    for f in declared:
        assert schema[f.name].description, f"{f.name} has no description"
    defaults = DemoConfig()
    # what make dev's demo_traffic_schedule has always made every 2 minutes
    assert (defaults.fleet.duplicate_messages, defaults.fleet.old_jobs, defaults.fleet.orphan_instances) == (1, 2, 1)
    assert DemoConfig.from_flat({}) == defaults
    for f in declared:
        if f.default is not None:
            assert schema[f.name].default_value == f.default, f.name


def test_the_flat_run_config_gives_each_capability_its_keys():
    cfg = DemoConfig.from_flat({"new_agendas": 3, "jobs_started": 2, "records": 5, "seed": 9})
    assert cfg == DemoConfig(
        reclaim=AgendaTraffic(new_agendas=3),
        fleet=FleetTraffic(jobs_started=2),
        batching=RecordTraffic(records=5),
        seed=9,
    )
    with pytest.raises(ParamsError, match="^max_instances must be at most 500, got 501$"):
        DemoConfig.from_flat({"max_instances": 501})
    with pytest.raises(ParamsError, match="^unknown parameter\\(s\\) record; known: new_agendas, "):
        DemoConfig.from_flat({"record": 5})


def test_the_targets_come_from_the_contract_variables_by_name():
    env = {
        "AGENDA_PROGRESS_TABLE": "agendas",
        "RUNS_FLEET_JOBS_TABLE": "jobs",
        "RUNS_FLEET_POOLS_TABLE": "pools",
        "RUNS_FLEET_TERMINATION_QUEUE_URL": "termination",
        "RUNS_FLEET_HOUSEKEEPING_QUEUE_URL": "housekeeping",
        "RECEIVERS_TABLE": "receivers",
        "BATCH_RECORDS_TABLE": "records",
        "BATCH_OUTBOX_BUCKET": "outbox",  # not the demo's
    }
    assert DemoTargets.from_env(env) == DemoTargets(
        agenda_progress_table="agendas",
        jobs_table="jobs",
        pools_table="pools",
        termination_queue_url="termination",
        housekeeping_queue_url="housekeeping",
        receivers_table="receivers",
        records_table="records",
    )


def test_a_bad_demo_config_fails_with_one_line(aws):
    result = (
        build_local_definitions()
        .resolve_job_def("demo_traffic")
        .execute_in_process(
            run_config={"ops": {"demo_traffic_step": {"config": {"records": -1}}}},
            instance=dg.DagsterInstance.ephemeral(),
            raise_on_error=False,
        )
    )
    description = result.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    assert description == "invalid run config: records must be at least 0, got -1"
