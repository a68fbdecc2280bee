"""Termination queue: one round of received messages, handled with batch APIs.

For each round, in this order:

1. archive the raw messages in the run's S3 object (log before handling);
2. validate; poison messages go to the dead-letter queue with their reason (and are deleted);
3. update the jobs with conditional updates, batched in ``TransactWriteItems``: "status is
   ``running`` or absent" becomes the final status, stamped with the message's digest and the
   round's id (``termination_round``). A failed condition returns the job as it is;
4. delete the runners' SSM parameters (``DeleteParameters``, 10 a call);
5. publish ``JobDuration``, ``JobSuccess``, ``JobFailure`` (one ``PutMetricData``);
6. mark the round done: one small S3 object, ``rounds/termination/<round id>``;
7. delete exactly the handled messages (``DeleteMessageBatch``).

A job whose condition failed is a duplicate, unless it was applied by this very message (same
digest) in a round that is not marked done: that round's run was killed between its update and
its clean-up. If that round began more than the queue's visibility timeout ago (its run's hold on
the message has lapsed), this round takes the job over with one conditional update (round id
old -> new: of two runs racing for it, one wins) and finishes its clean-up; if it is younger, the
run that holds it is still at work, and the message is left in the queue to come back later.

So each job costs one transactional write, and each round one S3 object. A message whose handling
fails after runs-fleet's retries stays in the queue: SQS moves it to the dead-letter queue after 3
receives. A run killed anywhere leaves each job untouched, or updated in a round not marked done,
which the message's redelivery completes.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from pipelines.common import from_item, to_item
from pipelines.fleet.aws import (
    POLICY,
    FleetContext,
    MetricBatch,
    RunArchive,
    aws_call,
    chunks,
    dead_letter_into,
    delete_messages,
    delete_parameters,
    error_code,
    message_received_at,
    queue_name,
)
from pipelines.fleet.drain import QueueDrain, queue_drain
from pipelines.fleet.messages import InvalidMessage, Termination, fingerprint, parse_termination
from pipelines.retry.aws import is_transient

TRANSACTION_LIMIT = 100  # TransactWriteItems actions per call
ROUNDS_PREFIX = "rounds"  # s3://<archive bucket>/rounds/<queue>/<round id>: the round's clean-up is done


def new_round_id(started_at: float) -> str:
    """``<epoch ms when the round's receive began>-<random>``: unique, and says how old the round is."""
    return f"{int(started_at * 1000)}-{uuid.uuid4().hex[:12]}"


def round_marker_key(queue_url: str, round_id: str) -> str:
    """The S3 key whose existence says the round's clean-up is done."""
    return f"{ROUNDS_PREFIX}/{queue_name(queue_url)}/{round_id}"


def round_started_at(round_id: str) -> float | None:
    head = round_id.split("-", 1)[0]
    return int(head) / 1000 if head.isdigit() else None


@dataclass
class _Job:
    """One job of the round: the first message for it, and any later copies in the same round."""

    term: Termination
    digest: str
    messages: list[dict[str, Any]]
    current: dict[str, Any] = field(default_factory=dict)  # the job as it was, when the condition failed


def _update(table: str, round_id: str, job: _Job) -> dict[str, Any]:
    t = job.term
    values: dict[str, Any] = {
        "status": t.job_status,
        "completed_at": t.completed_at,
        "instance_id": t.instance_id,
        "termination_digest": job.digest,
        "termination_round": round_id,
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
    expr_values = to_item({f":{k}": v for k, v in values.items() if v is not None})
    expr_values.update(to_item({":running": "running"}))
    return {
        "Update": {
            "TableName": table,
            "Key": {"job_id": {"S": t.job_id}},
            "UpdateExpression": "SET " + ", ".join(sets),
            "ConditionExpression": "attribute_not_exists(#status) OR #status = :running",
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": expr_values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


def _take_over(table: str, round_id: str, job: _Job) -> dict[str, Any]:
    """Move a job applied by this message in an unfinished round to ``round_id``: one run wins."""
    return {
        "Update": {
            "TableName": table,
            "Key": {"job_id": {"S": job.term.job_id}},
            "UpdateExpression": "SET #r = :new",
            "ConditionExpression": "#d = :d AND #r = :old",
            "ExpressionAttributeNames": {"#r": "termination_round", "#d": "termination_digest"},
            "ExpressionAttributeValues": to_item(
                {":new": round_id, ":old": job.current.get("termination_round", ""), ":d": job.digest}
            ),
        }
    }


class _TransactionConflict(Exception):
    """A cancelled transaction whose cancellation reasons are neither failed conditions nor
    validation errors (a conflict with another write): worth another try after a wait."""


def _retry_transaction(exc: BaseException) -> bool:
    return isinstance(exc, _TransactionConflict) or is_transient(exc)


def transact_each(
    dynamodb,
    jobs: Sequence[_Job],
    build: Callable[[_Job], dict[str, Any]],
    *,
    logger: Any = None,
) -> tuple[list[_Job], list[_Job], list[_Job]]:
    """Apply one conditional action per job in transactions of up to 100.

    Returns (applied, condition_failed, failed). A cancelled transaction names its failed
    conditions (with the item as it is, where the action asked for ``ALL_OLD``: kept in
    ``job.current``); those jobs leave it and the rest is submitted again at once. Transient errors
    (conflicts, throttling) are retried by runs-fleet's policy; after the last try the jobs left
    are failed.
    """
    applied: list[_Job] = []
    conditional: list[_Job] = []
    failed: list[_Job] = []
    for part in chunks(list(jobs), TRANSACTION_LIMIT):
        todo = list(part)

        def submit() -> None:
            nonlocal todo
            while todo:
                try:
                    dynamodb.transact_write_items(TransactItems=[build(job) for job in todo])
                except ClientError as exc:
                    if error_code(exc) != "TransactionCanceledException":
                        raise
                    reasons = exc.response.get("CancellationReasons") or []
                    if len(reasons) != len(todo):
                        raise _TransactionConflict(str(exc)) from exc
                    failed_cond = []
                    for j, r in zip(todo, reasons, strict=True):
                        if r.get("Code") == "ConditionalCheckFailed":
                            j.current = from_item(r["Item"]) if r.get("Item") else {}
                            failed_cond.append(j)
                    if failed_cond:
                        conditional.extend(failed_cond)
                        todo = [j for j in todo if j not in failed_cond]
                        continue  # resubmit the others at once: their condition held
                    others = [r.get("Code") for r in reasons if r.get("Code") not in ("None", None)]
                    if others and all(c == "ValidationError" for c in others):
                        failed.extend(todo)
                        todo = []
                        if logger:
                            logger.error(f"transaction refused: {exc}")
                        return
                    raise _TransactionConflict(str(exc)) from exc
                applied.extend(todo)
                todo = []

        try:
            aws_call(submit, what="TransactWriteItems", retryable=_retry_transaction)
        except Exception as exc:
            if not _retry_transaction(exc):
                raise
            failed.extend(todo)
            if logger:
                logger.warning(f"{len(todo)} job update(s) still failing after {POLICY.describe()}; left in the queue")
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
        self.s3, self.bucket = ctx.s3, ctx.archive_bucket
        self.archive, self.log, self.table, self.namespace = archive, ctx.log, ctx.jobs_table, ctx.namespace
        self.queue_url, self.dlq_url = queue_url, dlq_url
        self._done_rounds: set[str] = set()  # rounds known to be done (S3 markers are never removed early)
        self._visibility_timeout: float | None = None

    def __call__(
        self, messages: list[dict[str, Any]], pool: ThreadPoolExecutor, started_at: float | None = None
    ) -> Counter:
        """``started_at``: wall-clock time at which the round's receive began (stamped in the round id)."""
        counts: Counter = Counter()
        round_id = new_round_id(started_at if started_at is not None else time.time())
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
        applied, conditional, failed = transact_each(
            self.dynamodb, list(jobs.values()), lambda j: _update(self.table, round_id, j), logger=self.log
        )
        if conditional:
            duplicates, taken, failed_too = self._settle(conditional, round_id, counts)
            failed += failed_too
            counts["duplicates"] += len(duplicates)
            counts["taken_over"] += len(taken)
            applied += taken
            for job in duplicates:
                to_ack += job.messages
        counts["failed"] += sum(len(j.messages) for j in failed)

        if applied:
            done = self._clean_up(applied, round_id, pool, counts)
            for job in done:
                to_ack += job.messages
            counts["applied"] += len(done)

        # 7. acknowledge exactly what was handled
        if to_ack:
            # One DeleteMessageBatch after another: moto's SQS loses deletes made at the same time.
            not_deleted = len(delete_messages(self.sqs, self.queue_url, to_ack))
            counts["deleted"] += len(to_ack) - not_deleted
            counts["delete_failed"] += not_deleted
        return counts

    # ------------------------------------------------------------------ rounds

    def round_done(self, round_id: str) -> bool:
        """Is the round's clean-up done (its S3 marker exists)? Done rounds are remembered."""
        if round_id in self._done_rounds:
            return True
        key = round_marker_key(self.queue_url, round_id)
        try:
            aws_call(lambda: self.s3.head_object(Bucket=self.bucket, Key=key), what="HeadObject (round marker)")
        except ClientError as exc:
            if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        self._done_rounds.add(round_id)
        return True

    def visibility_timeout(self) -> float:
        """The queue's visibility timeout: how long a run holds what it received (asked once per run)."""
        if self._visibility_timeout is None:
            attrs = aws_call(
                lambda: self.sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["VisibilityTimeout"]),
                what="GetQueueAttributes",
            )["Attributes"]
            self._visibility_timeout = float(attrs.get("VisibilityTimeout", 30))
        return self._visibility_timeout

    def _settle(self, jobs: list[_Job], round_id: str, counts: Counter) -> tuple[list[_Job], list[_Job], list[_Job]]:
        """Jobs whose condition failed: (duplicates, taken over by this round, failed).

        A job applied by this same message in a round not marked done belongs to a run killed
        before its clean-up. Once that round is older than the visibility timeout, its run's hold
        on the message has lapsed and this round takes the job over; a younger round's run may
        still be at work, so the message is left in the queue (counted ``held_elsewhere``).
        """
        duplicates: list[_Job] = []
        unfinished: list[_Job] = []
        failed: list[_Job] = []
        for job in jobs:
            old_round = job.current.get("termination_round")
            if job.current.get("termination_digest") != job.digest or not isinstance(old_round, str):
                duplicates.append(job)  # another message, or the job ended some other way
                continue
            try:
                if self.round_done(old_round):
                    duplicates.append(job)
                    continue
                began = round_started_at(old_round)
                if began is not None and time.time() - began < self.visibility_timeout():
                    self.log.info(
                        f"job {job.term.job_id}: round {old_round} applied this message and is still within "
                        "its visibility timeout; leaving the message in the queue"
                    )
                    counts["held_elsewhere"] += len(job.messages)
                    continue
            except Exception as exc:
                self.log.error(f"job {job.term.job_id}: could not check round {old_round}, left in the queue: {exc}")
                failed.append(job)
                continue
            self.log.warning(f"job {job.term.job_id}: round {old_round} was cut short; finishing its clean-up")
            unfinished.append(job)
        taken, lost, failed_takeover = transact_each(
            self.dynamodb, unfinished, lambda j: _take_over(self.table, round_id, j), logger=self.log
        )
        duplicates += lost  # another run took it over first: it finishes the clean-up
        return duplicates, taken, failed + failed_takeover

    def _clean_up(self, applied: list[_Job], round_id: str, pool: ThreadPoolExecutor, counts: Counter) -> list[_Job]:
        """SSM parameters and metrics of the applied jobs, then the round's done marker. Returns those done."""
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
        except Exception as exc:  # no marker: the messages come back and finish the clean-up
            self.log.error(f"clean-up of {len(applied)} job(s) failed, their messages stay in the queue: {exc}")
            counts["failed"] += sum(len(j.messages) for j in applied)
            return []
        self._done_rounds.add(round_id)
        body = "\n".join(job.term.job_id for job in applied).encode()
        key = round_marker_key(self.queue_url, round_id)
        try:
            aws_call(
                lambda: self.s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="text/plain"),
                what="PutObject (round marker)",
            )
        except Exception as exc:
            # The work is done; acknowledging is right. Only the marker is missing: a later copy of one
            # of these messages, in another run, would find the round unfinished and count it again.
            self.log.warning(f"round {round_id} done but its marker could not be written: {exc}")
            counts["round_not_marked"] += 1
        return applied


def termination_drain(ctx: FleetContext, **kwargs) -> QueueDrain:
    """A ``QueueDrain`` of the termination queue (``sqs``, ``queue_url``, ``dlq_url``, ``run_id``, ``limits``)."""
    return queue_drain(TerminationHandler, ctx, **kwargs)
