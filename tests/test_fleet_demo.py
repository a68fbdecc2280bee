"""Demo traffic feeds every fleet processor: duplicates, malformed messages, old jobs, orphans, pool_audit."""

import dagster as dg
import pytest

from infra.demo.traffic import DemoConfig, DemoTargets, run_demo_traffic
from pipelines.definitions import build_definitions
from tests import fleet_support as fs


@pytest.mark.slow
def test_demo_traffic_exercises_the_fleet_processors(aws):
    clients = {name: aws.client(name) for name in ("dynamodb", "ec2", "ssm", "sqs")}
    base = dict(new_agendas=1, stuck_agendas=0, records=0, jobs_started=6, jobs_finished=0, malformed_messages=0)
    quiet = dict(duplicate_messages=0, old_jobs=0, orphan_instances=0)  # the defaults are the demo job's
    targets = DemoTargets.from_env(aws.env)
    run_demo_traffic(targets=targets, cfg=DemoConfig.from_flat({**base, **quiet, "seed": 1}), **clients)
    second = run_demo_traffic(
        targets=targets,
        cfg=DemoConfig.from_flat(
            {
                **base,
                "jobs_started": 0,
                "jobs_finished": 4,
                "malformed_messages": 2,
                "duplicate_messages": 2,
                "old_jobs": 3,
                "orphan_instances": 1,
                "pool_audit_messages": 1,
                "seed": 2,
            }
        ),
        **clients,
    )
    assert second["duplicate_messages"] == 2
    assert second["old_jobs_added"] == 3
    assert second["orphans_launched"] == 1

    defs = build_definitions("local")
    instance = dg.DagsterInstance.ephemeral()
    drained = defs.resolve_job_def("process_termination_queue").execute_in_process(
        run_config={"wait_seconds": 0}, instance=instance
    )
    out = drained.output_for_node("drain_termination_queue")
    assert out["applied"] == 4
    assert out["dead_lettered"] == 2
    assert out.get("duplicates_in_round", 0) == 2
    assert fs.depth(aws, "RUNS_FLEET_TERMINATION_QUEUE_URL") == 0

    housekeeping = defs.resolve_job_def("process_housekeeping_queue").execute_in_process(
        run_config={"wait_seconds": 0}, instance=instance
    )
    out = housekeeping.output_for_node("drain_housekeeping_queue")
    assert out["dead_lettered"] == 0
    assert out["task_pool_audit"] == 1  # a pool_audit message runs the pool audit
    assert out["tasks_run"] == 3  # one housekeeping message from each step, and the pool_audit one
    old = defs.resolve_job_def("housekeeping").execute_in_process(
        run_config={"task_type": "old_jobs"}, instance=instance
    )
    assert old.output_for_node("run_housekeeping_task")["archived"] == 3
