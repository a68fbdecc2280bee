"""Attempts, ids and fencing (seed 001, "Ids management" and "Retry implementation").

- ``schedule_id``: the canonical id of one request (a task or decision), made by our library;
  a duplicated ``schedule`` command (same ``schedule_id``) changes nothing.
- ``attempt_id``: one per attempt (made by the engine when it queues work). Attempts are also
  numbered 1, 2, 3...: the number is the fencing token.
- ``processing_id``: one per processing of an attempt (made by the agent). An attempt may be
  processed more than once; a duplicated history event (same ``processing_id`` and kind)
  changes nothing.

``Job`` is the per-request "mini engine" of the seed: it holds every attempt, applies the retry
rules, and derives the canonical status with ``canonical_status``. It is plain data: store it
anywhere. ``Engine`` keeps jobs by ``schedule_id``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import StrEnum


def new_schedule_id() -> str:
    return f"sch-{uuid.uuid4().hex}"


def new_attempt_id() -> str:
    return f"att-{uuid.uuid4().hex}"


def new_processing_id() -> str:
    return f"prc-{uuid.uuid4().hex}"


class AttemptStatus(StrEnum):
    SCHEDULED = "scheduled"
    QUEUED = "queued"
    PROCESSING = "processing"
    FAILED = "failed"
    COMPLETED = "completed"
    CANCELLED = "cancelled"  # a scheduled attempt that will never run; ignored by the job status


JOB_STATUSES = ("scheduled", "queued", "processing", "failed", "completed")
"""The seed's canonical job statuses: a job is always in exactly one of them."""


class EventKind(StrEnum):
    """History events from agents. Their rank makes applying them order-independent:
    a processing only moves forward (started < timedout < failed < completed)."""

    STARTED = "started"
    TIMEDOUT = "timedout"
    FAILED = "failed"
    COMPLETED = "completed"


_RANK = {EventKind.STARTED: 0, EventKind.TIMEDOUT: 1, EventKind.FAILED: 2, EventKind.COMPLETED: 3}
_LIVE = {EventKind.STARTED, EventKind.TIMEDOUT}


@dataclass
class Attempt:
    attempt_id: str
    number: int
    due: float  # when it may be queued (epoch seconds); 0 for "now"
    manual: bool = False
    queued: bool = False
    cancelled: bool = False
    processings: dict[str, EventKind] = field(default_factory=dict)

    @property
    def status(self) -> AttemptStatus:
        states = set(self.processings.values())
        if EventKind.COMPLETED in states:
            return AttemptStatus.COMPLETED
        if states & _LIVE:
            return AttemptStatus.PROCESSING
        if EventKind.FAILED in states:
            return AttemptStatus.FAILED
        if self.cancelled:
            return AttemptStatus.CANCELLED
        return AttemptStatus.QUEUED if self.queued else AttemptStatus.SCHEDULED

    @property
    def processing_timeout(self) -> bool:
        """While processing: at least one live processing has timed out."""
        return self.status is AttemptStatus.PROCESSING and EventKind.TIMEDOUT in self.processings.values()


def canonical_status(attempts: list[Attempt]) -> str:
    """The job status derived from its attempts, by the seed's rules (first match wins):

    completed as soon as an attempt completed; failed when an attempt failed and none is
    scheduled, queued or processing; processing; queued; scheduled. Cancelled attempts do not
    count; at least one attempt must not be cancelled.
    """
    statuses = {a.status for a in attempts} - {AttemptStatus.CANCELLED}
    if not statuses:
        raise ValueError("a job needs at least one attempt that is not cancelled")
    if AttemptStatus.COMPLETED in statuses:
        return "completed"
    live = {AttemptStatus.SCHEDULED, AttemptStatus.QUEUED, AttemptStatus.PROCESSING}
    if AttemptStatus.FAILED in statuses and not statuses & live:
        return "failed"
    for status in (AttemptStatus.PROCESSING, AttemptStatus.QUEUED, AttemptStatus.SCHEDULED):
        if status in statuses:
            return status.value
    raise AssertionError(statuses)  # unreachable: every attempt status is covered above


def job_processing_timeout(attempts: list[Attempt]) -> bool:
    """While the job is processing: every processing attempt has timed out."""
    if canonical_status(attempts) != "processing":
        return False
    processing = [a for a in attempts if a.status is AttemptStatus.PROCESSING]
    return all(a.processing_timeout for a in processing)


class SupersededError(Exception):
    """A writer holds an old attempt's fencing token: a newer attempt took over."""

    def __init__(self, attempt_id: str, number: int, current_id: str | None, current_number: int):
        super().__init__(f"attempt {attempt_id} (#{number}) was superseded by attempt {current_id} (#{current_number})")
        self.attempt_id = attempt_id
        self.number = number
        self.current_id = current_id
        self.current_number = current_number


@dataclass(frozen=True)
class Outcome:
    """What a command or event did. ``changed`` is False for refusals and duplicates."""

    accepted: bool
    changed: bool
    reason: str
    attempt_id: str | None = None


@dataclass(frozen=True)
class HistoryEvent:
    kind: EventKind
    attempt_id: str
    processing_id: str


@dataclass
class Job:
    schedule_id: str
    attempts: list[Attempt] = field(default_factory=list)
    history: list[HistoryEvent] = field(default_factory=list)  # every event received, as is
    commands: dict[str, Outcome] = field(default_factory=dict)  # outcome of each command id
    _index: dict[str, Attempt] = field(default_factory=dict, repr=False, compare=False)

    # -- creation -----------------------------------------------------------------------------
    @classmethod
    def scheduled(cls, schedule_id: str, *, at: float = 0.0, now: float = 0.0, attempt_id: str | None = None) -> Job:
        job = cls(schedule_id=schedule_id)
        first = job._add(attempt_id, due=at, queued=at <= now)
        job.commands[schedule_id] = Outcome(True, True, "scheduled", first.attempt_id)
        return job

    # -- derived state --------------------------------------------------------------------------
    @property
    def status(self) -> str:
        return canonical_status(self.attempts)

    @property
    def processing_timeout(self) -> bool:
        return job_processing_timeout(self.attempts)

    def attempt(self, attempt_id: str) -> Attempt | None:
        if len(self._index) != len(self.attempts):  # attempts were added or replaced directly
            self._index = {a.attempt_id: a for a in self.attempts}
        return self._index.get(attempt_id)

    def snapshot(self) -> tuple:
        """Everything that decides behaviour (not the raw history log): equal snapshots, same job."""
        return (
            self.status,
            self.processing_timeout,
            tuple(
                (a.attempt_id, a.number, a.due, a.manual, a.queued, a.cancelled, tuple(sorted(a.processings.items())))
                for a in self.attempts
            ),
        )

    def _any(self, *statuses: AttemptStatus) -> bool:
        return any(a.status in statuses for a in self.attempts)

    def _add(self, attempt_id: str | None, *, due: float, queued: bool, manual: bool = False) -> Attempt:
        attempt = Attempt(
            attempt_id=attempt_id or new_attempt_id(),
            number=len(self.attempts) + 1,
            due=due,
            queued=queued,
            manual=manual,
        )
        self.attempts.append(attempt)
        return attempt

    def _cancel_scheduled(self) -> None:
        for a in self.attempts:
            if a.status is AttemptStatus.SCHEDULED:
                a.cancelled = True

    def _once(self, command_id: str, apply) -> Outcome:
        if command_id in self.commands:
            first = self.commands[command_id]
            return Outcome(first.accepted, False, f"duplicate command {command_id}: {first.reason}", first.attempt_id)
        outcome = apply()
        self.commands[command_id] = outcome
        return outcome

    # -- commands -------------------------------------------------------------------------------
    def retry_manual(self, command_id: str, *, now: float = 0.0, attempt_id: str | None = None) -> Outcome:
        """An operator's retry: queued at once, refused while an attempt is queued, processing or
        completed, and cancels the scheduled attempts."""

        def apply() -> Outcome:
            if self._any(AttemptStatus.QUEUED, AttemptStatus.PROCESSING, AttemptStatus.COMPLETED):
                return Outcome(False, False, f"refused: the job is {self.status}")
            self._cancel_scheduled()
            attempt = self._add(attempt_id, due=now, queued=True, manual=True)
            return Outcome(True, True, "queued", attempt.attempt_id)

        return self._once(command_id, apply)

    def retry_automatic(self, command_id: str, *, at: float, attempt_id: str | None = None) -> Outcome:
        """A policy's retry at ``at``: not done if another attempt is scheduled sooner (or at the
        same time), or is queued, processing or completed."""

        def apply() -> Outcome:
            if self._any(AttemptStatus.QUEUED, AttemptStatus.PROCESSING, AttemptStatus.COMPLETED):
                return Outcome(False, False, f"cancelled: another attempt is {self.status}")
            sooner = [a for a in self.attempts if a.status is AttemptStatus.SCHEDULED and a.due <= at]
            if sooner:
                return Outcome(False, False, f"cancelled: attempt {sooner[0].attempt_id} is scheduled sooner")
            attempt = self._add(attempt_id, due=at, queued=False)
            return Outcome(True, True, "scheduled", attempt.attempt_id)

        return self._once(command_id, apply)

    def dispatch(self, now: float) -> list[str]:
        """The engine queues every scheduled attempt that is due; returns their ids."""
        due = [a for a in self.attempts if a.status is AttemptStatus.SCHEDULED and a.due <= now]
        for a in due:
            a.queued = True
        return [a.attempt_id for a in due]

    # -- history events -------------------------------------------------------------------------
    def record(self, event: HistoryEvent) -> Outcome:
        """Store the event as is, then apply it. Duplicates and stale events change nothing."""
        self.history.append(event)
        attempt = self.attempt(event.attempt_id)
        if attempt is None:
            return Outcome(False, False, f"unknown attempt {event.attempt_id}")
        kind = EventKind(event.kind)
        previous = attempt.processings.get(event.processing_id)
        if previous is not None and _RANK[previous] >= _RANK[kind]:
            return Outcome(True, False, f"duplicate or stale {kind} for {event.processing_id}", attempt.attempt_id)
        attempt.processings[event.processing_id] = kind
        attempt.queued = True  # it ran, so it was queued, whatever order the events came in
        if kind is EventKind.COMPLETED:
            self._cancel_scheduled()
        return Outcome(True, True, kind.value, attempt.attempt_id)

    # -- fencing --------------------------------------------------------------------------------
    def current_attempt(self) -> Attempt | None:
        """The newest attempt that was dispatched: its number is the live fencing token."""
        dispatched = [a for a in self.attempts if a.queued]
        return max(dispatched, key=lambda a: a.number) if dispatched else None

    def fence(self, attempt_id: str) -> int:
        """Return the writer's fencing token, or raise ``SupersededError`` if a newer attempt was
        dispatched (or the attempt is unknown) so the writer can tell it lost."""
        attempt = self.attempt(attempt_id)
        current = self.current_attempt()
        current_number = current.number if current else 0
        if attempt is None or attempt.number < current_number:
            raise SupersededError(
                attempt_id, attempt.number if attempt else 0, current.attempt_id if current else None, current_number
            )
        return attempt.number


@dataclass
class Engine:
    """Jobs by ``schedule_id``: a duplicated ``schedule`` command changes nothing."""

    jobs: dict[str, Job] = field(default_factory=dict)

    def schedule(self, schedule_id: str, *, at: float = 0.0, now: float = 0.0) -> Outcome:
        if schedule_id in self.jobs:
            return Outcome(
                True, False, f"duplicate schedule {schedule_id}", self.jobs[schedule_id].attempts[0].attempt_id
            )
        job = Job.scheduled(schedule_id, at=at, now=now)
        self.jobs[schedule_id] = job
        return job.commands[schedule_id]


# -- fencing in a store ---------------------------------------------------------------------------


def accepts(stored_token: int | None, writer_token: int) -> bool:
    """A fenced store accepts a write when no newer attempt has written before."""
    return stored_token is None or writer_token >= stored_token


def dynamodb_fence(token: int, attribute: str = "attemptNumber") -> dict:
    """Pieces of a DynamoDB ``UpdateItem`` that fence it by attempt number: merge them into your
    own call (``SET`` the returned ``update`` clause too). A ``ConditionalCheckFailedException``
    then means "a newer attempt wrote here": the writer was superseded.
    """
    return {
        "condition": "(attribute_not_exists(#fence) OR #fence <= :fence)",
        "update": "#fence = :fence",
        "names": {"#fence": attribute},
        "values": {":fence": {"N": str(int(token))}},
    }
