"""Termination queue: one round of received messages, handled with batch APIs.

For each round, in this order:

1. archive the raw messages in the run's S3 object (log before handling, seed 001);
2. validate; poison messages go to the dead-letter queue with their reason (and are deleted);
3. update the jobs with conditional updates, batched in ``TransactWriteItems``. The condition is
   "status is ``running`` or absent", or "this very message was applied but its clean-up is still
   pending" (a crashed run's message coming back). A duplicate fails the condition: it is
   acknowledged with no other effect;
4. delete the runners' SSM parameters (``DeleteParameters``, 10 a call);
5. publish ``JobDuration``, ``JobSuccess``, ``JobFailure`` (one ``PutMetricData``);
6. clear the clean-up marker (one more transaction), then delete exactly the handled messages
   (``DeleteMessageBatch``).

A message whose handling fails after the seed's backoff stays in the queue: SQS moves it to the
dead-letter queue after 3 receives. A run killed anywhere leaves each job either untouched, or
updated with its clean-up marker set, which the message's redelivery completes.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from pipelines.common import to_item
from pipelines.fleet.aws import (
    BACKOFF_SECONDS,
    FleetContext,
    MetricBatch,
    RunArchive,
    chunks,
    dead_letter_into,
    delete_messages,
    delete_parameters,
    error_code,
    message_received_at,
)
from pipelines.fleet.drain import QueueDrain, queue_drain
from pipelines.fleet.messages import InvalidMessage, Termination, fingerprint, parse_termination
from pipelines.retry.aws import is_transient

TRANSACTION_LIMIT = 100  # TransactWriteItems actions per call


@dataclass
class _Job:
    """One job of the round: the first message for it, and any later copies in the same round."""

    term: Termination
    digest: str
    messages: list[dict[str, Any]]
    outcome: str = "pending"  # applied | duplicate | failed


def _update(table: str, job: _Job) -> dict[str, Any]:
    t = job.term
    values: dict[str, Any] = {
        "status": t.job_status,
        "completed_at": t.completed_at,
        "instance_id": t.instance_id,
        "termination_digest": job.digest,
        "exit_code": t.exit_code,
        "duration_seconds": t.duration_seconds,
        "error": t.error,
    }
    names = {f"#{k}": k for k in values if values[k] is not None}
    sets = [f"#{k} = :{k}" for k in values if values[k] is not None]
    if t.started_at:
        sets.append("#started_at = if_not_exists(#started_at, :started_at)")
        names["#started_at"] = "started_at"
        values["started_at"] = t.started_at
    sets.append("#termination_pending = :true")
    names["#termination_pending"] = "termination_pending"
    expr_values = to_item({f":{k}": v for k, v in values.items() if v is not None})
    expr_values.update(to_item({":running": "running", ":true": True}))
    names.update({"#status": "status", "#termination_digest": "termination_digest"})
    return {
        "Update": {
            "TableName": table,
            "Key": {"job_id": {"S": t.job_id}},
            "UpdateExpression": "SET " + ", ".join(sets),
            "ConditionExpression": (
                "attribute_not_exists(#status) OR #status = :running OR "
                "(#termination_pending = :true AND #termination_digest = :termination_digest)"
            ),
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": expr_values,
        }
    }


def _finalize(table: str, job: _Job) -> dict[str, Any]:
    return {
        "Update": {
            "TableName": table,
            "Key": {"job_id": {"S": job.term.job_id}},
            "UpdateExpression": "REMOVE #p",
            "ConditionExpression": "#d = :d",
            "ExpressionAttributeNames": {"#p": "termination_pending", "#d": "termination_digest"},
            "ExpressionAttributeValues": {":d": {"S": job.digest}},
        }
    }


def transact_each(
    dynamodb,
    jobs: Sequence[_Job],
    build: Callable[[_Job], dict[str, Any]],
    *,
    sleeps: Sequence[float] = BACKOFF_SECONDS,
    logger: Any = None,
) -> tuple[list[_Job], list[_Job], list[_Job]]:
    """Apply one conditional action per job in transactions of up to 100.

    Returns (applied, condition_failed, failed). A cancelled transaction names its failed
    conditions; those jobs leave it and the rest is submitted again at once. Transient errors
    (conflicts, throttling) wait the seed's backoff; after the last one the jobs left are failed.
    """
    applied: list[_Job] = []
    conditional: list[_Job] = []
    failed: list[_Job] = []
    for part in chunks(list(jobs), TRANSACTION_LIMIT):
        todo, attempt = list(part), 0
        while todo:
            try:
                dynamodb.transact_write_items(TransactItems=[build(job) for job in todo])
                applied += todo
                break
            except ClientError as exc:
                code = error_code(exc)
                if code == "TransactionCanceledException":
                    reasons = exc.response.get("CancellationReasons") or []
                    if len(reasons) == len(todo):
                        failed_cond = [
                            j for j, r in zip(todo, reasons, strict=True) if r.get("Code") == "ConditionalCheckFailed"
                        ]
                        others = [
                            (j, r.get("Code"))
                            for j, r in zip(todo, reasons, strict=True)
                            if r.get("Code") not in ("None", None, "ConditionalCheckFailed")
                        ]
                        if failed_cond:
                            conditional += failed_cond
                            todo = [j for j in todo if j not in failed_cond]
                            continue  # resubmit the others at once: their condition held
                        if others and all(c == "ValidationError" for _, c in others):
                            failed += todo
                            if logger:
                                logger.error(f"transaction refused: {exc}")
                            break
                elif not is_transient(exc):
                    raise
            except Exception as exc:
                if not is_transient(exc):
                    raise
            if attempt >= len(sleeps):
                failed += todo
                if logger:
                    logger.warning(
                        f"{len(todo)} job update(s) still failing after {attempt} retries; left in the queue"
                    )
                break
            time.sleep(sleeps[attempt])
            attempt += 1
    return applied, conditional, failed


def job_metrics(batch: MetricBatch, term: Termination) -> None:
    """JobDuration (dimension Status), JobSuccess, JobFailure (dimension Error: the error's first line)."""
    if term.duration_seconds is not None:
        batch.add("JobDuration", term.duration_seconds, unit="Seconds", Status=term.status)
    if term.status == "success":
        batch.add("JobSuccess", 1)
    else:
        error = (term.error or "").strip()
        batch.add("JobFailure", 1, Error=error.splitlines()[0] if error else term.status)


class TerminationHandler:
    """Handles one round of termination messages (a ``drain.RoundHandler``)."""

    report_keys = ("received", "applied", "duplicates", "dead_lettered", "failed", "deleted", "ssm_deleted")

    def __init__(self, *, sqs, ctx: FleetContext, archive: RunArchive, queue_url: str, dlq_url: str):
        self.sqs, self.dynamodb, self.ssm, self.cloudwatch = sqs, ctx.dynamodb, ctx.ssm, ctx.cloudwatch
        self.archive, self.log, self.table, self.namespace = archive, ctx.log, ctx.jobs_table, ctx.namespace
        self.queue_url, self.dlq_url = queue_url, dlq_url

    def __call__(self, messages: list[dict[str, Any]], pool: ThreadPoolExecutor) -> Counter:
        counts: Counter = Counter()
        try:
            self.archive.write(messages)
        except Exception as exc:  # log before handling: without the archive, nothing is handled
            self.log.error(f"archiving {len(messages)} raw message(s) failed, leaving them in the queue: {exc}")
            counts["failed"] += len(messages)
            return counts

        # 2. validate
        now = dt.datetime.now(dt.UTC)
        poison: list[tuple[dict[str, Any], str]] = []
        jobs: dict[str, _Job] = {}
        for message in messages:
            try:
                term = parse_termination(message.get("Body"), received_at=message_received_at(message, now))
            except InvalidMessage as exc:
                self.log.warning(f"dead-lettering message {message.get('MessageId')}: {exc.reason}")
                poison.append((message, exc.reason))
                continue
            if term.job_id in jobs:  # a copy in the same round follows the first one's outcome
                jobs[term.job_id].messages.append(message)
                counts["duplicates_in_round"] += 1
            else:
                jobs[term.job_id] = _Job(term=term, digest=fingerprint(message["Body"]), messages=[message])

        to_ack: list[dict[str, Any]] = []
        dead_letter_into(self.sqs, self.queue_url, self.dlq_url, poison, counts, to_ack)

        # 3. conditional updates
        applied, duplicates, failed = transact_each(
            self.dynamodb, list(jobs.values()), lambda j: _update(self.table, j), logger=self.log
        )
        counts["duplicates"] += len(duplicates)
        counts["failed"] += sum(len(j.messages) for j in failed)
        for job in duplicates:
            to_ack += job.messages

        if applied:
            done = self._clean_up(applied, pool, counts)
            for job in done:
                to_ack += job.messages
            counts["applied"] += len(done)

        # 6. acknowledge exactly what was handled
        if to_ack:
            # One DeleteMessageBatch after another: moto's SQS loses deletes made at the same time.
            not_deleted = len(delete_messages(self.sqs, self.queue_url, to_ack))
            counts["deleted"] += len(to_ack) - not_deleted
            counts["delete_failed"] += not_deleted
        return counts

    def _clean_up(self, applied: list[_Job], pool: ThreadPoolExecutor, counts: Counter) -> list[_Job]:
        """SSM parameters, metrics and the clean-up marker of the applied jobs. Returns those done."""
        try:
            names = [job.term.parameter for job in applied]
            futures = [pool.submit(delete_parameters, self.ssm, part) for part in chunks(names, 10)]
            for future in futures:
                result = future.result()
                counts["ssm_deleted"] += result["deleted"]
                counts["ssm_already_gone"] += result["missing"]
            metrics = MetricBatch()
            for job in applied:
                job_metrics(metrics, job.term)
            metrics.publish(self.cloudwatch, self.namespace)
        except Exception as exc:  # the marker stays: the messages come back and finish the clean-up
            self.log.error(f"clean-up of {len(applied)} job(s) failed, their messages stay in the queue: {exc}")
            counts["failed"] += sum(len(j.messages) for j in applied)
            return []
        _, _, unfinished = transact_each(self.dynamodb, applied, lambda j: _finalize(self.table, j))
        if unfinished:
            # The work is done; acknowledging is right. Only the marker is left behind.
            self.log.warning(
                f"{len(unfinished)} clean-up marker(s) could not be cleared: {[j.term.job_id for j in unfinished]}"
            )
            counts["marker_not_cleared"] += len(unfinished)
        return applied


def termination_drain(ctx: FleetContext, **kwargs) -> QueueDrain:
    """A ``QueueDrain`` of the termination queue (``sqs``, ``queue_url``, ``dlq_url``, ``run_id``, ``limits``)."""
    return queue_drain(TerminationHandler, ctx, **kwargs)
