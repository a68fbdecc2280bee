"""The dead-letter queues as assets, with a check on each one's depth (warns above 0), and their job."""

import dagster as dg

from pipelines.common.defs.failures import AWS_RETRY_POLICY, one_line_failures
from pipelines.common.defs.metadata import CheckNotes, noted
from pipelines.common.defs.schedules import ONE_AT_A_TIME_TAG
from pipelines.common.sqs import dead_letter_depth, queue_name
from pipelines.fleet.defs.jobs import CAPABILITY_TAGS
from resources import FleetSettings, SQSResource

DLQ_ASSETS = {
    label: dg.AssetSpec(
        key=["runs_fleet", f"{label}_dead_letters"],
        description=f"The {label} queue's dead-letter queue (SQS). Should stay empty.",
        kinds={"sqs"},
        group_name="fleet",
    )
    for label in ("termination", "housekeeping")
}


def _dlq_check(label: str, spec: dg.AssetSpec, notes: CheckNotes | None) -> dg.AssetChecksDefinition:
    key = dg.AssetCheckKey(spec.key, "dead_letter_depth")

    @dg.asset_check(
        asset=spec.key,
        name=key.name,
        description=f"Messages in the {label} dead-letter queue (warns above 0).",
        retry_policy=AWS_RETRY_POLICY,
    )
    @one_line_failures
    def _check(context: dg.AssetCheckExecutionContext, sqs: SQSResource, fleet: FleetSettings) -> dg.AssetCheckResult:
        url = getattr(fleet, f"{label}_dlq_url")
        depth = dead_letter_depth(sqs.get_client(), url)
        total = depth["depth"]
        description, note = noted(
            key,
            total == 0,
            f"{total} message(s) in {queue_name(url)}" + (": see redrive_dead_letters" if total else ""),
            notes,
        )
        return dg.AssetCheckResult(
            passed=total == 0,
            severity=dg.AssetCheckSeverity.WARN,
            description=description,
            metadata={"depth": total, **depth, "queue": url, **note},
        )

    return _check


def dlq_checks(notes: CheckNotes | None = None) -> list[dg.AssetChecksDefinition]:
    """The depth check of each dead-letter queue (a failed one adds its note from ``notes``)."""
    return [_dlq_check(label, spec, notes) for label, spec in DLQ_ASSETS.items()]


dead_letter_checks_job = dg.define_asset_job(
    "fleet_dead_letter_checks",
    selection=dg.AssetSelection.checks(*dlq_checks()),
    description="Checks the depth of each fleet dead-letter queue.",
    tags={**CAPABILITY_TAGS, ONE_AT_A_TIME_TAG: "fleet_dead_letter_checks"},
    executor_def=dg.in_process_executor,
)
