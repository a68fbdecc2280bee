"""The housekeeping dispatcher: :class:`Housekeeping` runs a housekeeping message's task, and
:class:`HousekeepingHandler` drains the housekeeping queue with it (identical requests in a round run
once).

``TASKS`` maps a ``task_type`` to its function ``(FleetContext, HousekeepingRequest) -> summary``:
runs-fleet's clean-up tasks (``pipelines.fleet.cleanup``) and the pool audit (its typed audit);
``TASK_PARAMS`` maps it to the parameter names it accepts besides ``now`` and ``dryRun``. A task's
parameters that are out of range raise ``InvalidMessage`` or ``pipelines.common.params.ParamsError``;
either dead-letters the message.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pipelines.common.params import ParamsError
from pipelines.fleet.archive import RunArchive
from pipelines.fleet.cleanup import old_jobs, orphaned_instances, stale_ssm
from pipelines.fleet.context import FleetContext
from pipelines.fleet.dead_letter_send import DeadLetterArchive, dead_letter_into
from pipelines.fleet.drain import QueueDrain, queue_drain
from pipelines.fleet.messages import HousekeepingRequest, InvalidMessage, parse_housekeeping
from pipelines.fleet.pool_audit.housekeeping import MESSAGE_PARAMS, HousekeepingAudit, pool_audit_task
from pipelines.fleet.queues import delete_messages


@dataclass(frozen=True)
class TaskResult:
    """What one task did. ``summary``: small, JSON-friendly figures (the run's output, its metadata
    and log). ``audit``: the pool audit's whole typed result, which the Dagster layer records as a
    ``pool_audit`` materialization with its checks; it is never serialised."""

    task_type: str
    summary: dict[str, Any]
    audit: HousekeepingAudit | None = None

    def as_json(self) -> dict[str, Any]:
        return {"task_type": self.task_type, **self.summary}


# ------------------------------------------------------------------------ dispatcher

TASKS: dict[str, Callable[[FleetContext, HousekeepingRequest], dict[str, Any] | HousekeepingAudit]] = {
    "orphaned_instances": orphaned_instances,
    "stale_ssm": stale_ssm,
    "old_jobs": old_jobs,
    "pool_audit": pool_audit_task,
}


TASK_PARAMS: dict[str, frozenset[str]] = {
    "orphaned_instances": frozenset({"max_runtime", "confirm_after_minutes"}),
    "stale_ssm": frozenset({"terminated_grace_minutes"}),
    "old_jobs": frozenset({"retention_days"}),
    "pool_audit": MESSAGE_PARAMS,
}


class Housekeeping:
    """The dispatcher of ``TASKS``."""

    def parse(self, data: Any) -> HousekeepingRequest:
        """Validate a message body or run config against the known tasks (``InvalidMessage`` otherwise)."""
        request = parse_housekeeping(data, allowed_params={name: set(p) for name, p in TASK_PARAMS.items()})
        self._task(request)
        return request

    def _task(self, request: HousekeepingRequest) -> Callable[..., dict[str, Any] | HousekeepingAudit]:
        if request.task_type in TASKS:
            return TASKS[request.task_type]
        raise InvalidMessage(f"unknown task_type {request.task_type[:40]!r}")

    def run(self, ctx: FleetContext, request: HousekeepingRequest) -> TaskResult:
        """Run one validated request. Task parameters out of range raise ``InvalidMessage``."""
        try:
            out = self._task(request)(ctx, request)
        except ParamsError as exc:
            raise InvalidMessage(str(exc)) from None
        if isinstance(out, HousekeepingAudit):
            return TaskResult(request.task_type, out.summary(), audit=out)
        return TaskResult(request.task_type, out)

    def drain(self, ctx: FleetContext, **kwargs) -> QueueDrain:
        """A ``QueueDrain`` of the housekeeping queue (``sqs``, ``queue_url``, ``dlq_url``, ``run_id``, ``limits``)."""
        return queue_drain(functools.partial(HousekeepingHandler, housekeeping=self), ctx, **kwargs)


class HousekeepingHandler:
    """One round of housekeeping messages (a ``drain.RoundHandler``): identical requests run once."""

    report_keys = ("received", "tasks_run", "dead_lettered", "failed", "deleted")

    def __init__(
        self, *, housekeeping: Housekeeping, sqs, ctx: FleetContext, archive: RunArchive, queue_url: str, dlq_url: str
    ):
        self.housekeeping = housekeeping
        self.sqs, self.ctx, self.archive, self.queue_url, self.dlq_url = sqs, ctx, archive, queue_url, dlq_url
        self.results: list[TaskResult] = []

    def __call__(
        self, messages: list[dict[str, Any]], pool: ThreadPoolExecutor, started_at: float | None = None
    ) -> Counter:
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
                request = self.housekeeping.parse(message.get("Body"))
            except InvalidMessage as exc:
                log.warning(f"dead-lettering housekeeping message {message.get('MessageId')}: {exc.reason}")
                poison.append((message, exc.reason))
                continue
            groups.setdefault(request.key(), (request, []))[1].append(message)
        to_ack: list[dict[str, Any]] = []
        for request, group in groups.values():
            try:
                result = self.housekeeping.run(self.ctx, request)
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
        archive = DeadLetterArchive(self.ctx.s3, self.ctx.archive_bucket)
        dead_letter_into(self.sqs, self.queue_url, self.dlq_url, poison, counts, to_ack, archive)
        if to_ack:
            not_deleted = delete_messages(self.sqs, self.queue_url, to_ack)
            counts["deleted"] += len(to_ack) - len(not_deleted)
        return counts
