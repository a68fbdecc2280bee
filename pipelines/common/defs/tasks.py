"""The one Dagster adapter of the task contract (``pipelines.common.task``): its job and schedules."""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import dagster as dg

from pipelines.common.defs.config import config_schema, flat_config, params_from_config
from pipelines.common.defs.failures import AWS_RETRY_POLICY, one_line_failures
from pipelines.common.defs.metadata import metadata_from
from pipelines.common.defs.metrics import CommittedChangeMetrics
from pipelines.common.defs.schedules import schedule
from pipelines.common.defs.summary import own_outcome, run_summary
from pipelines.common.looks import Look
from pipelines.common.task import Task, TaskRun


def resource_clients(context: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """The resources ``keys`` as a pass sees them: a boto3 client for a client resource, any other as it is."""
    resources = {key: getattr(context.resources, key) for key in keys}
    return {key: r.get_client() if callable(getattr(r, "get_client", None)) else r for key, r in resources.items()}


def one_op_job(
    name: str,
    op: str,
    params: type,
    body: Callable[[Any, Any], dg.Output],
    *,
    description: str,
    tags: Mapping[str, str],
    resources: Iterable[str] = (),
    executor_def: dg.ExecutorDefinition | None = None,
    op_description: str | None = None,
    retry_policy: dg.RetryPolicy | None = AWS_RETRY_POLICY,
    op_tags: Mapping[str, str] | None = None,
) -> dg.JobDefinition:
    """The job ``name`` of one op ``op`` whose parameters ``params`` are the flat run config: the op
    returns ``body(context, params)`` under the one AWS failure policy (a bad value fails it in one line)."""

    @dg.op(
        name=op,
        description=op_description or description,
        config_schema=config_schema(params),
        required_resource_keys=set(resources),
        retry_policy=retry_policy,
        tags=op_tags,
    )
    @one_line_failures
    def the_op(context):  # no annotation: this module has lazy annotations
        own_outcome(context)
        return body(context, params_from_config(context, params))

    @dg.job(
        name=name, description=description, tags=dict(tags), config=flat_config(op, params), executor_def=executor_def
    )
    def the_job():
        the_op()

    return the_job


def task_job(task: Task, executor_def: dg.ExecutorDefinition | None = None) -> dg.JobDefinition:
    """The job of ``task`` (``task.job``, one op ``task.op``), on ``executor_def`` or the code location's."""
    assert task.job is not None, f"{task.name}: no job"  # with one, Task checked its op, what and counters
    what, counters = task.what, task.counters

    def run(context, params) -> dg.Output:
        clients = resource_clients(context, tuple(key for key in task.clients if key != "cloudwatch"))
        if "cloudwatch" in task.clients:  # metrics after a committed change, never a failed run
            clients["cloudwatch"] = CommittedChangeMetrics(context, context.resources.cloudwatch, what(params))
        try:
            result = task.run(TaskRun(context.log, context.run_id, clients), None, params)
        except task.failures as exc:  # its message says it all
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        run_summary(context, what(params), counters(result), dry_run=getattr(params, "dry_run", False))
        return dg.Output(result, metadata=metadata_from(result))

    return one_op_job(
        task.job,
        task.op,
        task.params,
        run,
        description=task.description,
        tags=task.tags,
        resources=task.clients,
        executor_def=executor_def,
    )


def task_schedule(
    task: Task,
    job: dg.JobDefinition,
    *,
    name: str,
    cron: str,
    params: Any,
    run_config: Mapping[str, Any],
    tags: Mapping[str, str] | None = None,
    crons: Mapping[str, str] | None = None,
) -> dg.ScheduleDefinition:
    """The schedule ``name`` of ``task``'s ``job``, looking first with the task's look (its clients only)."""

    def look(context: dg.ScheduleEvaluationContext) -> Look:
        return task.look(TaskRun(context.log, "", resource_clients(context, task.look_clients)), None, params)  # type: ignore[misc]

    return schedule(
        name=name,
        crons=crons,
        job=job,
        cron_schedule=cron,
        look=look if task.look is not None else None,
        request=lambda _context: dg.RunRequest(run_config=dict(run_config), tags=dict(tags or {})),
        required_resource_keys=set(task.look_clients),
        description=f"{task.description} For {task.what(params) if task.what else task.name} ({cron})."
        + (
            f" Looks first at {task.looks_at} and skips the tick when there is nothing to do, or while the "
            "previous run is still queued, running or being cancelled."
            if task.look is not None
            else ""
        ),
    )
