"""One reclaim pass over one scan segment (or the index queries): read pages, gather batches of
``targetBatchSize``, act. Memory is one page plus one batch. No Dagster imports."""

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pipelines.common import now_ms, printable
from pipelines.common.looks import Look, fingerprint
from pipelines.reclaim.decide import CLOSE, FAIL, HOLD, QUEUE, RETRY, decide
from pipelines.reclaim.http import HttpWriter
from pipelines.reclaim.params import ReclaimParams, policy_from_params
from pipelines.reclaim.source import Candidate, Skip, TableInfo, build_requests, inspect_table, to_candidate
from pipelines.reclaim.writers import DONE, DynamoWriter, ItemError, OperationProgressWriter

PROGRESS_EVERY_SECONDS = 10.0
LOOK_READS = 5  # the most Query/Scan pages a schedule's look reads (after one DescribeTable)

# decision kind -> the counter a successful write adds to
DONE_COUNTER = {FAIL: "reclaimed", RETRY: "retried", HOLD: "held", QUEUE: "queued", CLOSE: "exhausted"}


@dataclass
class Counts:
    scanned: int = 0  # items DynamoDB read (ScannedCount)
    returned: int = 0  # items that passed the server-side filter
    matched: int = 0  # stale candidates after the client-side check
    reclaimed: int = 0  # timed out and failed (fail action, or retry action out of attempts)
    retried: int = 0  # reset to WAITING and queued now
    held: int = 0  # reset to WAITING, queued by a later run (retryAt)
    queued: int = 0  # held retries queued now
    exhausted: int = 0  # COMPLETE/failed items closed without retry
    raced: int = 0  # a condition failed: an executor or another run wrote first
    skipped: int = 0  # bad time field
    errors: int = 0  # this item could not be written (logged)
    operations_failed: int = 0
    would_act: int = 0  # dry run: candidates that would have been acted on
    api_calls: int = 0  # reads made by this pass
    pages: int = 0
    stopped_by_budget: bool = False
    completed_pass: bool = False  # the pass read to the end what it reads (a scan's table, an index query)
    skipped_ids: list[str] = field(default_factory=list)  # first few, for the run log and metadata

    def add(self, other: "Counts") -> None:
        for name, value in asdict(other).items():
            if isinstance(value, bool):
                setattr(self, name, getattr(self, name) or value)
            elif isinstance(value, list):
                getattr(self, name).extend(value[: max(0, 20 - len(getattr(self, name)))])
            else:
                setattr(self, name, getattr(self, name) + value)


@dataclass(frozen=True)
class SegmentPlan:
    """What one pass works on: the validated parameters, its segment and the budget."""

    params: ReclaimParams
    segment: int
    deadline: float  # epoch seconds
    info: TableInfo | None = None  # None when the run does nothing (overlap)
    overlap: str | None = None  # the id of an older run still working on the table


class KeyValueCursor:
    """The scan position of one (table, segment, filter), kept in the Dagster instance's cursor values: a config
    that reads other items of the same table (action, statuses, cutoff) keeps its own."""

    def __init__(self, storage: Any, params: ReclaimParams, segment: int) -> None:
        self.storage = storage
        names = ("reclaimAction", "includeWaiting", "retryFailed", "reclaimAgeMinutes")
        where = fingerprint({name: getattr(params, name) for name in names})
        table = f"{params.tableName}/{params.timeFieldName}"
        self.key = f"groundskeeper/reclaim/{table}/{segment}-of-{params.segments}/{where}"

    def load(self) -> dict[str, Any] | None:
        try:
            text = self.storage.get_cursor_values({self.key}).get(self.key)
            return json.loads(text) if text else None
        except ValueError:
            return None  # an unreadable cursor restarts the pass; it never fails the run

    def save(self, key: dict[str, Any] | None) -> None:
        self.storage.set_cursor_values({self.key: json.dumps(key, sort_keys=True) if key else ""})


class OneLineLog:
    """A log whose every message is one line: the ids and errors in them are read from the table."""

    def __init__(self, log: logging.Logger | Any) -> None:
        self.log = log

    def __getattr__(self, level: str) -> Callable[[str], None]:
        return lambda message: getattr(self.log, level)(printable(message))


def reclaim_pass(
    dynamodb,
    plan: SegmentPlan,
    writer: DynamoWriter | HttpWriter | None,
    *,
    cursor: KeyValueCursor | None = None,
    operations: OperationProgressWriter | None = None,
    log: logging.Logger | Any = None,
    run_id: str = "",
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> Counts:
    """Reclaim what ``plan.info`` holds in ``plan.segment`` before ``plan.deadline``. ``writer`` None = dry run."""
    log = OneLineLog(log or logging.getLogger(__name__))
    params, info, deadline = plan.params, plan.info, plan.deadline
    policy = policy_from_params(params.retryPolicy)  # unset: retry at once; the fail action never asks
    counts = Counts()
    now = now_ms()
    cutoff = params.cutoff_ms(now)
    batch: list[Candidate] = []
    last_progress = clock()

    def flush() -> None:
        decided = []
        for c in batch:
            try:
                d = decide(c, action=params.reclaimAction, now=now, cutoff=cutoff, policy=policy, run_id=run_id)
            except Exception as exc:  # a failing retry policy is reported, never retried (the retry RFC's warning)
                counts.errors += 1
                log.error(f"{c.id}: the retry policy failed: {exc}")
            else:
                decided.append((c, d))
        batch.clear()
        if writer is None:
            counts.would_act += len(decided)
            for c, d in decided:
                log.info(f"dry run: would {d.describe(c)}")
        elif decided:
            outcomes = writer.apply_many(decided, now=now, cutoff=cutoff)
            for (c, d), outcome in zip(decided, outcomes, strict=True):
                if isinstance(outcome, ItemError):
                    counts.errors += 1
                    log.error(f"could not {d.kind} {c.id}: {outcome}")
                elif outcome != DONE:
                    counts.raced += 1
                    log.info(f"raced: {c.id} changed since it was read; left alone")
                else:
                    setattr(counts, DONE_COUNTER[d.kind], getattr(counts, DONE_COUNTER[d.kind]) + 1)
                    if operations is not None and d.kind == FAIL and d.event:
                        try:
                            failed, refused = operations.fail_executing(c.id, d.event, now)
                        except Exception as exc:
                            counts.errors += 1
                            log.error(f"{c.id}: its OperationProgress items were left EXECUTING: {exc}")
                            continue
                        counts.operations_failed += failed
                        counts.errors += len(refused)
                        for exc in refused:
                            log.error(f"could not fail an OperationProgress item of {c.id}: {exc}")

    for label, operation, request in build_requests(info, params, now, plan.segment):
        resumable = operation == "scan" and cursor is not None  # scans keep their position between runs
        start_key = cursor.load() if resumable else None
        if start_key:
            log.info(f"{label}: resuming at {json.dumps(start_key)}")
        while True:
            if counts.api_calls and params.scanDelayMillis:
                sleep(max(0.0, min(params.scanDelayMillis / 1000, deadline - clock())))  # never past the budget
            if counts.api_calls and clock() >= deadline:
                counts.stopped_by_budget = True
                break
            kwargs = {**request, "ExclusiveStartKey": start_key} if start_key else request
            page = getattr(dynamodb, operation)(**kwargs)
            counts.api_calls += 1
            counts.pages += 1
            counts.scanned += page.get("ScannedCount", 0)
            counts.returned += page.get("Count", 0)
            for item in page.get("Items", []):
                found = to_candidate(item, info, params, now)
                if isinstance(found, Skip):
                    counts.skipped += 1
                    if len(counts.skipped_ids) < 20:
                        counts.skipped_ids.append(found.id)
                    log.warning(f"skipped {found.id}: {found.reason}")
                elif found is not None:
                    counts.matched += 1
                    batch.append(found)
                    if len(batch) >= params.targetBatchSize:
                        flush()
            start_key = page.get("LastEvaluatedKey")
            if clock() - last_progress >= PROGRESS_EVERY_SECONDS:
                last_progress = clock()
                log.info(f"{label}: {_progress(counts)}")
            if not start_key:
                break
        flush()  # the batch in hand is always finished, also when the budget ran out
        if resumable and writer is not None:
            cursor.save(start_key)
        if counts.stopped_by_budget:
            log.info(f"{label}: budget of {params.maximumExecutionSeconds}s used, stopping: {_progress(counts)}")
            break
    counts.completed_pass = not counts.stopped_by_budget
    return counts


def _progress(counts: Counts) -> str:
    told = ("scanned", "matched", "reclaimed", "retried", "held", "queued", "raced", "skipped")
    return f"{counts.pages} page(s), " + ", ".join(f"{name} {getattr(counts, name)}" for name in told)


def look(dynamodb, params: ReclaimParams) -> Look:
    """The reclaim schedules' look, the run's own reads and check (``docs/reclaim.md``, "Schedules")."""
    params = replace(params, segments=1)
    info, now, reads = inspect_table(dynamodb, params), now_ms(), 0
    requests = build_requests(info, params, now)
    for label, operation, request in requests:
        start_key = None
        while True:
            if reads == LOOK_READS:
                return Look.work(
                    f"{params.tableName}: {label} not read to its end in {reads} page(s): the run reads on"
                )
            kwargs = {**request, "ExclusiveStartKey": start_key} if start_key else request
            page = getattr(dynamodb, operation)(**kwargs)
            reads += 1
            if any(isinstance(to_candidate(item, info, params, now), Candidate) for item in page.get("Items", [])):
                return Look.work(f"{params.tableName}: an item to reclaim ({label})")
            if not (start_key := page.get("LastEvaluatedKey")):
                break
    said = ", ".join(label for label, _, _ in requests)
    return Look.idle(
        f"{params.tableName}: nothing to reclaim (cutoff {params.reclaimAgeMinutes} min; {said}: {reads} read(s))"
    )
