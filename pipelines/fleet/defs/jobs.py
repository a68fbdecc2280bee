"""The fleet's jobs, one op each, in the run's own process, where a UI termination or SIGTERM reaches the
drain's graceful stop; a drain on a Celery worker (``cluster``) reads its run's status at round boundaries."""

import dataclasses

import dagster as dg

from pipelines.common import first_line
from pipelines.common.defs.metadata import CheckNotes, metadata_from
from pipelines.common.defs.metrics import CommittedChangeMetrics
from pipelines.common.defs.summary import run_summary
from pipelines.common.defs.tasks import one_op_job, resource_clients, task_job
from pipelines.common.sqs import queue_name
from pipelines.common.summary import counters_of
from pipelines.fleet import dead_letter_redrive
from pipelines.fleet.context import FleetContext, fleet_context
from pipelines.fleet.defs.pool_audit import record_housekeeping_audits
from pipelines.fleet.drain import (
    STATUS_UNREADABLE,
    TERMINATED,
    DrainLimits,
    TerminationLimits,
    queue_drain,
    run_with_graceful_stop,
)
from pipelines.fleet.housekeeping import DISPATCHER, HousekeepingHandler, HousekeepingJobRequest
from pipelines.fleet.messages import InvalidMessage
from pipelines.fleet.termination import TerminationHandler

QUEUE_TAG = "groundskeeper/queue"
QUEUE_TAGS = {"termination": "runs-fleet-termination", "housekeeping": "runs-fleet-housekeeping"}
"""Each queue's ``groundskeeper/queue`` value of consumer slot 1 (its drain job's own tag): the queue's name."""
CAPABILITY_TAGS = {"groundskeeper/capability": "fleet"}


CLIENTS = ("ec2", "dynamodb", "ssm", "s3")
RESOURCES = {"fleet", "cloudwatch", *CLIENTS}


def _run_context(context: dg.OpExecutionContext) -> FleetContext:
    """A dagster-aws resource is its client already; ``cloudwatch`` publishes after a commit."""
    clients = resource_clients(context, CLIENTS)
    cloudwatch = CommittedChangeMetrics(context, context.resources.cloudwatch, "fleet")
    return fleet_context(context.resources.fleet, log=context.log, cloudwatch=cloudwatch, **clients)


def drain_job(
    queue: str,
    description: str,
    handler_cls: type,
    limits_cls: type[DrainLimits] = DrainLimits,
    *,
    executor_def: dg.ExecutorDefinition | None = None,
    notes: CheckNotes | None = None,
) -> dg.JobDefinition:
    """``process_<queue>_queue``; a handler's pool audits are recorded (a failed check noted from ``notes``)."""

    def drain_queue(context: dg.OpExecutionContext, limits: DrainLimits) -> dg.Output[dict]:
        ctx, fleet = _run_context(context), context.resources.fleet
        drain = queue_drain(
            handler_cls,
            ctx,
            sqs=context.resources.sqs.get_client(),
            queue_url=getattr(fleet, f"{queue}_queue_url"),
            dlq_url=getattr(fleet, f"{queue}_dlq_url"),
            run_id=context.run_id,
            limits=limits,
            retry_number=context.retry_number,
        )

        def terminated() -> bool:  # read from the instance: on a Celery worker no interrupt arrives
            run = context.instance.get_run_by_id(context.run_id)
            return run is not None and run.status in (dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.CANCELED)

        name = queue_name(drain.queue_url)
        try:
            result, interrupt = run_with_graceful_stop(drain, logger=context.log, terminated=terminated)
        except Exception as exc:  # what this attempt did counts on the run; a retry's counts add to it
            counts = {k: drain.result.counts[k] for k in drain.report_keys}
            run_summary(
                context, f"{name} drain", counts, f"attempt {context.retry_number + 1} failed: {first_line(exc)}"
            )
            raise
        summary = result.as_dict(drain.report_keys)
        if interrupt is not None:
            try:  # what the round in flight finished counts on the run too
                run_summary(context, f"{name} drain", {k: summary[k] for k in drain.report_keys}, "interrupted")
            finally:
                raise interrupt
        if result.stopped_by == STATUS_UNREADABLE:
            # the instance's database is gone: no summary or metadata can be recorded, and each try to
            # write one would only wait out the storage's connection retries
            raise dg.Failure(
                description=f"the run's status cannot be read ({drain.stop_detail}): the {name} drain stopped at "
                "a round boundary; what it did not acknowledge comes back to the queue",
                allow_retries=False,
            )
        counts = {k: summary[k] for k in drain.report_keys}
        run_summary(context, f"{name} drain", counts, f"stopped by {result.stopped_by}")
        if result.stopped_by == TERMINATED:  # fails the step in one line, so the run ends canceled
            done = ", ".join(f"{k}={v}" for k, v in counts.items())
            raise dg.Failure(
                description=f"run terminated: the {name} drain stopped at a round boundary ({done}); "
                "what it did not receive is still in the queue",
                allow_retries=False,
            )
        keys, results = drain.handler.archive.keys, getattr(drain.handler, "results", [])
        record_housekeeping_audits(context, results, notes)
        metadata = {
            **summary,
            "raw_archive": f"s3://{fleet.archive_bucket}/{keys[0]}" if keys else "(nothing)",
            "tasks": [{"task_type": r.task_type, **r.summary} for r in results],
            "metrics_published": ctx.cloudwatch.published,
        }
        return dg.Output(summary, metadata=metadata_from(metadata))

    return one_op_job(
        f"process_{queue}_queue",
        f"drain_{queue}_queue",
        limits_cls,
        drain_queue,
        description=f"Drain the {queue} queue (launched by {queue}_queue_sensor; one run per consumer slot).",
        op_description=description,
        # priority 10: a drain leaves the run queue before other runs (0), so no backlog delays it
        tags={**CAPABILITY_TAGS, "dagster/priority": "10", QUEUE_TAG: QUEUE_TAGS[queue]},
        resources={"sqs", *RESOURCES},
        executor_def=executor_def or dg.in_process_executor,
        op_tags={"kind": "sqs"},
    )


def termination_queue_job(executor_def: dg.ExecutorDefinition | None = None) -> dg.JobDefinition:
    """In process unless ``executor_def`` is given (the cluster's: drains are competing consumers on its workers)."""
    description = "Drains the termination queue: archive, conditional job update, SSM clean-up, metrics, ack."
    return drain_job("termination", description, TerminationHandler, TerminationLimits, executor_def=executor_def)


process_termination_queue = termination_queue_job()


def housekeeping_jobs(notes: CheckNotes | None = None) -> tuple[dg.JobDefinition, dg.JobDefinition]:
    """``process_housekeeping_queue`` and ``housekeeping`` (a pool audit's failed check notes from ``notes``)."""
    description = "Drains the housekeeping queue: dispatches each message on its task_type."
    process_housekeeping_queue = drain_job("housekeeping", description, HousekeepingHandler, notes=notes)

    def run_task(context: dg.OpExecutionContext, message: HousekeepingJobRequest) -> dg.Output[dict]:
        try:  # the message's task parameters, checked against its task's declaration
            request = DISPATCHER.parse(dataclasses.asdict(message))
            ctx = _run_context(context)
            result = DISPATCHER.run(ctx, request)
        except InvalidMessage as exc:
            raise dg.Failure(description=f"invalid housekeeping request: {exc.reason}", allow_retries=False) from None
        record_housekeeping_audits(context, [result], notes)
        run_summary(context, f"housekeeping {request.task_type}", counters_of(result.summary), dry_run=request.dry_run)
        published = ctx.cloudwatch.published and not request.dry_run  # a dry run publishes nothing
        metadata = {"task_type": request.task_type, **result.summary, "metrics_published": published}
        return dg.Output(result.summary, metadata=metadata_from(metadata))

    housekeeping = one_op_job(
        "housekeeping",
        "run_housekeeping_task",
        HousekeepingJobRequest,
        run_task,
        description="Run one housekeeping task. Flat config: runs-fleet's message {task_type, timestamp, params}.",
        op_description="Runs one housekeeping task (runs-fleet's housekeeping message as config).",
        tags=CAPABILITY_TAGS,
        resources=RESOURCES,
        executor_def=dg.in_process_executor,
    )
    return process_housekeeping_queue, housekeeping


redrive_dead_letters = task_job(dead_letter_redrive.TASK, dg.in_process_executor)
