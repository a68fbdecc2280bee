"""The housekeeping tasks' one list, ``TASKS``, their dispatcher and the housekeeping queue's round handler."""

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pipelines.common.params import ParamsError, param, specs
from pipelines.common.task import Task
from pipelines.fleet.context import FleetContext
from pipelines.fleet.drain import RunArchive
from pipelines.fleet.messages import HousekeepingRequest, InvalidMessage, parse_housekeeping
from pipelines.fleet.pool_audit import audit as pool_audit
from pipelines.fleet.pool_audit.audit import AuditRun
from pipelines.fleet.queues import dead_letter_into, delete_messages
from pipelines.fleet.tasks import old_jobs, orphaned_instances, stale_ssm


@dataclass(frozen=True)
class TaskResult:
    """What one task did: ``summary``, small JSON-friendly figures; ``audit``, the pool audit's whole
    typed result, which the Dagster layer records as a ``pool_audit`` materialization (never serialised)."""

    task_type: str
    summary: dict[str, Any]
    audit: AuditRun | None = None


@dataclass(frozen=True)
class NoParams:
    """A task without parameters of its own."""


def cost_report(ctx: FleetContext, request: HousekeepingRequest, params: NoParams) -> dict[str, Any]:
    """runs-fleet's daily cost report (its CloudWatch job and fleet metrics, to S3 and SNS) is not made here."""
    ctx.log.info("cost_report: runs-fleet's daily cost report is not made here (pool_cost_report is); acknowledged")
    return {}


COST_REPORT = Task(name="cost_report", params=NoParams, run=cost_report, clients=())

TASKS: tuple[Task, ...] = (orphaned_instances.TASK, stale_ssm.TASK, old_jobs.TASK, pool_audit.TASK, COST_REPORT)
"""The housekeeping tasks: adding one is its module and one entry here."""

TASKS_BY_NAME: dict[str, Task] = {task.name: task for task in TASKS}


@dataclass(frozen=True)
class HousekeepingJobRequest(HousekeepingRequest):
    """The ``housekeeping`` job's run config: a message whose ``task_type`` is one of ``TASKS``, an enum of its
    schema, refused before a run starts (a queue's message of an unknown task is dead-lettered instead)."""

    task_type: str = param(
        description=next(s.description for s in specs(HousekeepingRequest) if s.name == "task_type"),
        choices=tuple(TASKS_BY_NAME),
    )


class Housekeeping:
    """The dispatcher of ``TASKS``."""

    def parse(self, data: Any) -> HousekeepingRequest:
        """A message body or run config, checked against the tasks' parameters (else ``InvalidMessage``)."""
        request = parse_housekeeping(data, allowed_params={task.name: set(task.param_names) for task in TASKS})
        self.params(request)
        return request

    def task(self, request: HousekeepingRequest) -> Task:
        if request.task_type in TASKS_BY_NAME:
            return TASKS_BY_NAME[request.task_type]
        raise InvalidMessage(f"unknown task_type {request.task_type[:40]!r}; known: {', '.join(TASKS_BY_NAME)}")

    def params(self, request: HousekeepingRequest) -> tuple[Any, list[str]]:
        """The request's task parameters, validated by its task, and the deprecation warnings for old names."""
        try:
            return self.task(request).parse(request.task_params)
        except ParamsError as exc:
            raise InvalidMessage(str(exc)) from None

    def run(self, ctx: FleetContext, request: HousekeepingRequest) -> TaskResult:
        """Run one validated request. Task parameters out of range raise ``InvalidMessage``."""
        params, warnings = self.params(request)
        for warning in warnings:
            ctx.log.warning(f"{request.task_type}: {warning}")
        try:
            out = self.task(request).run(ctx, request, params)
        except ParamsError as exc:
            raise InvalidMessage(str(exc)) from None
        if isinstance(out, AuditRun):
            return TaskResult(request.task_type, out.summary(), audit=out)
        return TaskResult(request.task_type, out)


DISPATCHER = Housekeeping()


class HousekeepingHandler:
    """One round of housekeeping messages (a ``drain.RoundHandler``): identical requests run once."""

    report_keys = ("received", "tasks_run", "dead_lettered", "failed", "deleted")

    def __init__(self, *, sqs, ctx: FleetContext, archive: RunArchive, queue_url: str, dlq_url: str):
        self.sqs, self.ctx, self.archive, self.queue_url, self.dlq_url = sqs, ctx, archive, queue_url, dlq_url
        self.results: list[TaskResult] = []

    def __call__(self, messages: list[dict[str, Any]], pool: ThreadPoolExecutor, started_at: float) -> Counter:
        counts: Counter = Counter()
        log = self.ctx.log
        try:
            self.archive.write(messages)
        except Exception as exc:
            log.error(f"archiving {len(messages)} raw message(s) failed, leaving them in the queue: {exc}")
            counts["failed"] += len(messages)
            return counts
        poison: list[tuple[dict[str, Any], str]] = []
        groups: dict[str, tuple[HousekeepingRequest, list[dict[str, Any]]]] = {}
        for message in messages:
            try:
                request = DISPATCHER.parse(message.get("Body"))
            except InvalidMessage as exc:
                log.warning(f"dead-lettering housekeeping message {message.get('MessageId')}: {exc.reason}")
                poison.append((message, exc.reason))
                continue
            groups.setdefault(request.key(), (request, []))[1].append(message)
        to_ack: list[dict[str, Any]] = []
        for request, group in groups.values():
            try:
                result = DISPATCHER.run(self.ctx, request)
            except InvalidMessage as exc:
                log.warning(f"dead-lettering housekeeping message(s) for {request.task_type}: {exc.reason}")
                poison += [(m, exc.reason) for m in group]
                continue
            except Exception as exc:  # stays in the queue; SQS dead-letters it after 3 receives
                log.error(f"housekeeping task {request.task_type} failed, message left in the queue: {exc!r}")
                counts["failed"] += len(group)
                continue
            self.results.append(result)
            counts[f"task_{request.task_type}"] += 1
            counts["tasks_run"] += 1
            counts["duplicates_in_round"] += len(group) - 1
            to_ack += group
        dead_letter_into(self, poison, counts, to_ack)
        if to_ack:
            not_deleted = delete_messages(self.sqs, self.queue_url, to_ack)
            counts["deleted"] += len(to_ack) - len(not_deleted)
            counts["delete_failed"] += len(not_deleted)
        return counts
