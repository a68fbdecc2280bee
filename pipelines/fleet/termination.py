"""The termination queue's rounds and flushes (docs/fleet.md, "Rounds and flushes" and "Stopping a drain")."""

import datetime as dt
import functools
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pipelines.common import first_line, printable, to_item
from pipelines.common.aws_batches import chunks, object_exists, transact_conditional
from pipelines.common.sqs import queue_name
from pipelines.fleet import calls as fleet_calls
from pipelines.fleet.calls import MetricBatch, aws_call, delete_parameters, put_object, read_object
from pipelines.fleet.context import FleetContext
from pipelines.fleet.drain import RunArchive
from pipelines.fleet.messages import (
    FINAL_STATUSES,
    STARTED,
    InvalidMessage,
    Termination,
    fingerprint,
    parse_termination,
    runner_parameter,
)
from pipelines.fleet.queues import dead_letter_into, delete_messages
from pipelines.fleet.tasks.old_jobs import archived_job_key

ROUNDS_PREFIX = "rounds"  # s3://<archive bucket>/rounds/<queue>/<round id>: done for the job ids it lists


def new_round_id(started_at: float) -> str:
    """``<epoch ms when the round's receive began>-<random>``: unique, and says how old the round is."""
    return f"{int(started_at * 1000)}-{uuid.uuid4().hex[:12]}"


def round_marker_key(queue_url: str, round_id: str) -> str:
    return f"{ROUNDS_PREFIX}/{queue_name(queue_url)}/{round_id}"


@dataclass
class _Job:
    """A job of the round: its first message, and any later copies in the same round."""

    term: Termination
    digest: str
    messages: list[dict[str, Any]]
    current: dict[str, Any] = field(default_factory=dict)  # the job as it was, when the condition failed


@dataclass
class _Pending:
    """The rounds since the last flush: what they received, and what the flush must finish."""

    round_id: str
    began: float  # wall-clock time at which the first round's receive began
    received: list[dict[str, Any]] = field(default_factory=list)  # archived by the flush
    applied: list[_Job] = field(default_factory=list)  # clean-up, metrics, marker, then acknowledged
    poison: list[tuple[dict[str, Any], str]] = field(default_factory=list)  # dead-lettered, then acknowledged
    to_ack: list[dict[str, Any]] = field(default_factory=list)  # duplicates: acknowledged
    applied_ids: set[str] = field(default_factory=set)  # the job ids in ``applied``


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
    values = {k: v for k, v in values.items() if v is not None}
    sets = [f"#{k} = :{k}" for k in values]
    if t.started_at:
        sets.append("#started_at = if_not_exists(#started_at, :started_at)")
        values["started_at"] = t.started_at
    finals = {f":final_{status}": status for status in FINAL_STATUSES}
    return {
        "Update": {
            "TableName": table,
            "Key": {"job_id": {"S": t.job_id}},
            "UpdateExpression": "SET " + ", ".join(sets),
            # The job must exist: a late copy must not recreate a job that old_jobs archived and deleted.
            # Any status but a final one ends (runs-fleet completes a job whatever its status); only the
            # job's own instance (or any, for a job with none yet) ends it.
            "ConditionExpression": "attribute_exists(#job_id) AND "
            f"(attribute_not_exists(#status) OR NOT #status IN ({', '.join(finals)})) AND "
            "(attribute_not_exists(#instance_id) OR #instance_id = :instance_id)",
            "ExpressionAttributeNames": {f"#{k}": k for k in values} | {"#job_id": "job_id"},
            "ExpressionAttributeValues": to_item({f":{k}": v for k, v in values.items()} | finals),
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
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


@dataclass
class JobOutcomes:
    """What a conditional write (or settling a failed condition) did with each job."""

    applied: list[_Job] = field(default_factory=list)
    conditional: list[_Job] = field(default_factory=list)  # the condition failed (``job.current`` as it is)
    failed: list[_Job] = field(default_factory=list)  # transient errors after the last try: left in the queue
    refused: list[tuple[_Job, str]] = field(default_factory=list)  # this job's write can never succeed: why


class TerminationHandler:
    """A ``drain.RoundHandler`` of termination messages."""

    report_keys = ("received", "applied", "duplicates", "dead_lettered", "failed", "deleted", "ssm_deleted")

    def __init__(self, *, sqs, ctx: FleetContext, archive: RunArchive, queue_url: str, dlq_url: str):
        self.sqs, self.ctx, self.archive, self.queue_url, self.dlq_url = sqs, ctx, archive, queue_url, dlq_url
        self.dynamodb, self.s3, self.bucket = ctx.dynamodb, ctx.s3, ctx.archive_bucket
        self.log, self.table = ctx.log, ctx.jobs_table
        # rounds known to be done: the job ids their markers list (S3 markers are never removed early)
        self._done_rounds: dict[str, frozenset[str]] = {}
        self._pending: _Pending | None = None  # the rounds since the last flush

    def _transact(self, jobs: Sequence[_Job], action: Callable[..., dict[str, Any]], round_id: str) -> JobOutcomes:
        """``action(table, round_id, job)`` for each job (``transact_conditional``, by runs-fleet's policy);
        one job's failure is its own. A failed condition keeps the job as it is (``ALL_OLD``) in ``job.current``."""
        result = transact_conditional(
            self.dynamodb, jobs, lambda j: action(self.table, round_id, j), policy=fleet_calls.POLICY, what="job update"
        )
        for job, current in result.conditional:
            job.current = current
        refused = [(job, f"job update refused: {reason}") for job, reason in result.refused]
        for job, reason in refused:
            self.log.warning(f"job {job.term.job_id}: {reason}")
        if result.failed:
            policy = fleet_calls.POLICY.describe()
            self.log.warning(f"{len(result.failed)} job update(s) still failing after {policy}; left in the queue")
        return JobOutcomes(result.applied, [job for job, _ in result.conditional], result.failed, refused)

    def __call__(self, messages: list[dict[str, Any]], pool: ThreadPoolExecutor, started_at: float) -> Counter:
        """One round: validate and write the jobs; the rest waits for :meth:`flush`. ``started_at``: when
        the round's receive began (wall clock; the first round of a flush stamps it in the round id)."""
        counts: Counter = Counter()
        if self._pending is None:
            self._pending = _Pending(round_id=new_round_id(started_at), began=started_at)
        pending = self._pending
        pending.received += messages
        round_id = pending.round_id

        now = dt.datetime.now(dt.UTC)
        jobs: dict[str, _Job] = {}
        for message in messages:
            try:
                sent = (message.get("Attributes") or {}).get("SentTimestamp")
                received_at = dt.datetime.fromtimestamp(int(sent) / 1000, dt.UTC) if str(sent).isdigit() else now
                term = parse_termination(message.get("Body"), received_at=received_at)
            except InvalidMessage as exc:
                self.log.warning(f"dead-lettering message {message.get('MessageId')}: {exc.reason}")
                pending.poison.append((message, exc.reason))
                continue
            if term.status == STARTED:  # a job's start: nothing to update (runs-fleet ignores it too)
                counts["started"] += 1
                pending.to_ack.append(message)
                continue
            if term.job_id in jobs:  # a copy in the same round follows the first one's outcome
                jobs[term.job_id].messages.append(message)
                counts["duplicates_in_round"] += 1
            else:
                jobs[term.job_id] = _Job(term=term, digest=fingerprint(message["Body"]), messages=[message])

        # Conditional updates; a job whose write is refused is dead-lettered like the poison.
        result = self._transact(list(jobs.values()), _update, round_id)
        if result.conditional:
            self._settle(result, round_id, counts)
            counts["duplicates"] += sum(len(job.messages) for job in result.conditional)
            pending.to_ack += [m for job in result.conditional for m in job.messages]
        counts["failed"] += sum(len(j.messages) for j in result.failed)
        pending.poison += [(m, reason) for job, reason in result.refused for m in job.messages]
        pending.applied += result.applied
        pending.applied_ids.update(job.term.job_id for job in result.applied)
        return counts

    def flush_due(self) -> bool:
        """Flush before the rounds held reach half the visibility timeout (their messages would
        otherwise come back to other runs while this one still holds them)."""
        return self._pending is not None and self._late(self._pending)

    def _late(self, pending: _Pending) -> bool:
        """Have the rounds held reached half the visibility timeout?"""
        return time.time() - pending.began >= self.visibility_timeout / 2

    def flush(self, pool: ThreadPoolExecutor) -> Counter:
        """The rounds since the last flush: archive, dead letters, clean-up, done marker, acknowledge.
        Nothing is acknowledged unless archived first."""
        counts: Counter = Counter()
        pending, self._pending = self._pending, None
        if pending is None:
            return counts
        try:
            self.archive.write(pending.received)
        except Exception as exc:  # nothing is acknowledged unarchived: all of it comes back
            self.log.error(f"archiving {len(pending.received)} raw message(s) failed, leaving them in the queue: {exc}")
            held = len(pending.to_ack) + len(pending.poison) + sum(len(j.messages) for j in pending.applied)
            counts["failed"] += held
            return counts

        to_ack = list(pending.to_ack)
        dead_letter_into(self, pending.poison, counts, to_ack)
        applied, round_id = pending.applied, pending.round_id
        if applied and self._late(pending):
            # Late: another run may take these jobs over once the timeout has passed; renew them first.
            applied, round_id = self._renewed(applied, round_id, counts)
        if applied:
            done = self._clean_up(applied, round_id, pool, counts)
            to_ack += [m for job in done for m in job.messages]
            counts["applied"] += len(done)
            counts["duplicates"] += sum(len(job.messages) - 1 for job in done)  # their copies in their round

        if to_ack:  # exactly what was handled
            # One DeleteMessageBatch after another: moto's SQS loses deletes made at the same time.
            not_deleted = len(delete_messages(self.sqs, self.queue_url, to_ack))
            counts["deleted"] += len(to_ack) - not_deleted
            counts["delete_failed"] += not_deleted
        return counts

    def round_done(self, round_id: str, job_id: str) -> bool:
        """Is the job's clean-up in that round done: its S3 marker exists and lists the job (a job of
        the round whose write was reported failed is not listed)? A marker listing no job covers all."""
        if round_id not in self._done_rounds:
            key = round_marker_key(self.queue_url, round_id)
            body = read_object(self.s3, self.bucket, key, what="GetObject (round marker)")
            if body is None:
                return False
            self._done_rounds[round_id] = frozenset(filter(None, body.decode().split("\n")))
        listed = self._done_rounds[round_id]
        return not listed or job_id in listed

    def _exists(self, key: str, what: str) -> bool:
        return aws_call(lambda: object_exists(self.s3, self.bucket, key), what=f"HeadObject ({what})")

    @functools.cached_property
    def visibility_timeout(self) -> float:
        """The queue's visibility timeout: how long a run holds what it received (asked once per run)."""
        attrs = aws_call(
            lambda: self.sqs.get_queue_attributes(QueueUrl=self.queue_url, AttributeNames=["VisibilityTimeout"]),
            what="GetQueueAttributes",
        )["Attributes"]
        return float(attrs.get("VisibilityTimeout", 30))

    def _settle(self, out: JobOutcomes, round_id: str, counts: Counter) -> None:
        """``out``'s jobs whose condition failed, settled in place (docs/fleet.md, "Stopping a drain"): duplicates
        stay ``conditional``, taken over by this round are ``applied``, else ``failed`` or ``refused``."""
        jobs, out.conditional = out.conditional, []
        unfinished: list[_Job] = []
        for job in jobs:
            old_round = job.current.get("termination_round")
            try:
                if not job.current:
                    if self._exists(archived_job_key(job.term.job_id), "archived job marker"):
                        counts["archived_duplicates"] += 1
                        out.conditional.append(job)  # old_jobs archived it: a late copy
                    else:
                        out.refused.append(
                            (job, f"unknown job_id {job.term.job_id[:80]!r}: no such job, none archived")
                        )
                    continue
                owner, sender = job.current.get("instance_id", job.term.instance_id), job.term.instance_id
                if owner != sender:  # another instance's message must not end this job
                    out.refused.append(
                        (job, f"job {job.term.job_id[:80]!r} has instance_id {printable(owner)[:40]}, not {sender}")
                    )
                    continue
                if job.current.get("termination_digest") != job.digest or not isinstance(old_round, str):
                    out.conditional.append(job)  # another message, or the job ended some other way
                    continue
                if self._pending is not None and old_round == self._pending.round_id:
                    if job.term.job_id in self._pending.applied_ids:
                        out.conditional.append(job)  # a copy of a message an unflushed round of this run applied
                    else:  # this run's own write, which landed although its call failed and was tried again
                        counts["landed_on_retry"] += 1
                        out.applied.append(job)
                    continue
                if self.round_done(old_round, job.term.job_id):
                    out.conditional.append(job)
                    continue
                began = old_round.split("-", 1)[0]  # see new_round_id
                if began.isdigit() and time.time() - int(began) / 1000 < self.visibility_timeout:
                    self.log.info(
                        f"job {job.term.job_id}: round {old_round} applied this message and is still within "
                        "its visibility timeout; leaving the message in the queue"
                    )
                    counts["held_elsewhere"] += len(job.messages)
                    continue
            except Exception as exc:
                self.log.error(
                    f"job {job.term.job_id}: could not settle its failed condition, left in the queue: {exc}"
                )
                out.failed.append(job)
                continue
            self.log.warning(f"job {job.term.job_id}: round {old_round} was cut short; finishing its clean-up")
            unfinished.append(job)
        taken = self._move(unfinished, round_id, counts)
        counts["taken_over"] += len(taken.applied)
        out.applied += taken.applied
        out.conditional += taken.conditional  # another run took them over first: it finishes their clean-up
        out.failed += taken.failed
        out.refused += taken.refused

    def _move(self, jobs: list[_Job], round_id: str, counts: Counter) -> JobOutcomes:
        """``jobs`` moved from the round in ``job.current`` to ``round_id`` (``_take_over``: of two runs,
        one wins). A move whose call failed and was tried again may have landed the first time: a job
        whose condition failed but that is in ``round_id`` already is moved (``landed_on_retry``)."""
        moved = self._transact(jobs, _take_over, round_id)
        landed = [j for j in moved.conditional if j.current.get("termination_round") == round_id]
        counts["landed_on_retry"] += len(landed)
        moved.applied += landed
        moved.conditional = [j for j in moved.conditional if j.current.get("termination_round") != round_id]
        return moved

    def _renewed(self, jobs: list[_Job], round_id: str, counts: Counter) -> tuple[list[_Job], str]:
        """A late flush's renewal (docs/fleet.md, "Rounds and flushes"): the jobs still stamped with ``round_id``
        moved to a fresh round (``_take_over``), and its id; those another run took over are left to it."""
        renewed = new_round_id(time.time())
        for job in jobs:
            job.current = {"termination_round": round_id}
        moved = self._move(jobs, renewed, counts)
        lost = len(moved.conditional)
        counts["lost_to_takeover"] += lost
        counts["failed"] += sum(len(j.messages) for j in [*moved.failed, *(j for j, _ in moved.refused)])
        if lost:
            self.log.warning(
                f"round {round_id}: flushed late; {lost} job(s) were taken over by another run, which finishes them"
            )
        return moved.applied, renewed

    def _clean_up(self, applied: list[_Job], round_id: str, pool: ThreadPoolExecutor, counts: Counter) -> list[_Job]:
        """SSM parameters and metrics of the applied jobs, then the round's done marker. Returns those done."""
        try:
            names = [runner_parameter(job.term.instance_id) for job in applied]
            for result in pool.map(lambda part: delete_parameters(self.ctx.ssm, part), chunks(names, 10)):
                counts["ssm_deleted"] += result["deleted"]
                counts["ssm_already_gone"] += result["missing"]
            metrics = MetricBatch()  # JobDuration, JobSuccess, JobFailure (its Error: the error's first line)
            for term in (job.term for job in applied):
                if term.duration_seconds is not None:
                    metrics.add("JobDuration", term.duration_seconds, unit="Seconds", Status=term.status)
                if term.status == "success":
                    metrics.add("JobSuccess", 1)
                else:
                    metrics.add("JobFailure", 1, Error=first_line(term.error) or term.status)
            metrics.publish(self.ctx.cloudwatch, self.ctx.namespace)
        except Exception as exc:  # no marker: the messages come back and finish the clean-up
            self.log.error(f"clean-up of {len(applied)} job(s) failed, their messages stay in the queue: {exc}")
            counts["failed"] += sum(len(j.messages) for j in applied)
            return []
        self._done_rounds[round_id] = frozenset(job.term.job_id for job in applied)
        body = "\n".join(job.term.job_id for job in applied).encode()
        key = round_marker_key(self.queue_url, round_id)
        try:
            put_object(self.s3, self.bucket, key, body, what="PutObject (round marker)", ContentType="text/plain")
        except Exception as exc:
            # The work is done; acknowledging is right. Only the marker is missing: a later copy of one
            # of these messages, in another run, would find the round unfinished and count it again.
            self.log.warning(f"round {round_id} done but its marker could not be written: {exc}")
            counts["round_not_marked"] += 1
        return applied
