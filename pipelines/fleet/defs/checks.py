"""The dead-letter queues as assets, with a check on each one's depth (warns above 0), and their job."""

import dagster as dg

from pipelines.common.defs.failures import AWS_RETRY_POLICY, one_line_failures
from pipelines.common.demo import seeded
from pipelines.common.sqs import dead_letter_depth, queue_name
from pipelines.fleet.defs.jobs import CAPABILITY_TAGS
from resources import FleetSettings, SQSResource, deployment_name

DLQ_ASSETS = {
    "termination": dg.AssetSpec(
        key=["runs_fleet", "termination_dead_letters"],
        description="The termination queue's dead-letter queue (SQS). Should stay empty.",
        kinds={"sqs"},
        group_name="fleet",
    ),
    "housekeeping": dg.AssetSpec(
        key=["runs_fleet", "housekeeping_dead_letters"],
        description="The housekeeping queue's dead-letter queue (SQS). Should stay empty.",
        kinds={"sqs"},
        group_name="fleet",
    ),
}


DEMO_SEEDED = {"termination": "demo_traffic sends malformed termination messages, which the drain dead-letters"}
"""What make dev's demo does that fails a queue's check (said on a failed check, local deployment only)."""


def _dlq_check(label: str, spec: dg.AssetSpec) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=spec.key,
        name="dead_letter_depth",
        description=f"Messages in the {label} dead-letter queue (warns above 0).",
        retry_policy=AWS_RETRY_POLICY,
    )
    @one_line_failures
    def _check(context: dg.AssetCheckExecutionContext, sqs: SQSResource, fleet: FleetSettings) -> dg.AssetCheckResult:
        url = getattr(fleet, f"{label}_dlq_url")
        depth = dead_letter_depth(sqs.get_client(), url)
        total = depth["depth"]
        description, demo = seeded(
            deployment_name(),
            total == 0,
            f"{total} message(s) in {queue_name(url)}" + (": see redrive_dead_letters" if total else ""),
            DEMO_SEEDED.get(label),
        )
        return dg.AssetCheckResult(
            passed=total == 0,
            severity=dg.AssetCheckSeverity.WARN,
            description=description,
            metadata={
                "depth": total,
                "visible": depth["visible"],
                "in_flight": depth["in_flight"],
                "queue": url,
                **demo,
            },
        )

    return _check


DLQ_CHECKS = [_dlq_check(label, spec) for label, spec in DLQ_ASSETS.items()]
dead_letter_checks_job = dg.define_asset_job(
    "fleet_dead_letter_checks",
    selection=dg.AssetSelection.checks(*DLQ_CHECKS),
    description="Checks the depth of each fleet dead-letter queue.",
    tags=CAPABILITY_TAGS,
    executor_def=dg.in_process_executor,
)
