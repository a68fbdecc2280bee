"""The batch decider (ReportStream's BatchDecider: one scan of the receivers table, then a query of the
pending-index per receiver due) and the audits behind the asset checks. No Dagster. ``tables`` names
``receivers_table`` and ``records_table``: the ``batching`` resource, or a ``BatchSettings``."""

import datetime as dt
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipelines.batching import schedule, store
from pipelines.batching.batcher import record_problem
from pipelines.common import first_line
from pipelines.common.looks import Look

LOOK_READS = 10
"""The most pages of the pending-index the checks schedule's look reads; past them it compares the invalid
receivers alone (the hourly refresh runs the checks)."""

PENDING_READ_LIMIT = 1000
"""The most pending records a tick reads of a due receiver; one with more (a backlog) is due at every batch
time of its window, and its counts are lower bounds (its runs batch exactly)."""


@dataclass(frozen=True)
class DueBatch:
    receiver: str
    batch_time: dt.datetime
    pending: int
    expected_files: int

    @property
    def day(self) -> str:
        return self.batch_time.strftime("%Y-%m-%d")


@dataclass
class Decision:
    due: list[DueBatch] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # receiver -> why not launched
    receivers: int = 0
    invalid_pending: dict[str, int] = field(default_factory=dict)  # receiver -> pending records no run batches
    backlog: set[str] = field(default_factory=set)  # receivers with more pending records than a tick reads
    unread: dict[str, str] = field(default_factory=dict)  # receiver -> why its pending records were not read


def decide(dynamodb, tables, tick: dt.datetime, window_seconds: int = 60) -> Decision:
    """Which receivers had a batch time in ``(tick - window, tick]`` and should get a run now."""
    items = store.scan_receivers(dynamodb, tables.receivers_table)
    decision = Decision(receivers=len(items))
    for item in items:
        name = str(item.get("receiver"))
        try:
            cfg = schedule.parse_receiver(item)
            due = schedule.due_in_window(cfg, tick, window_seconds) if cfg.batching_enabled else []
        except Exception as exc:  # an invalid config, or one that breaks the schedule: its receiver only
            why = exc if isinstance(exc, schedule.InvalidReceiver) else f"{type(exc).__name__}: {exc}"
            decision.skipped[name] = f"invalid config: {why}"
            continue
        if not cfg.batching_enabled:
            decision.skipped[name] = (
                "customerStatus is inactive" if cfg.customer_status == "inactive" else "batching_enabled is false"
            )
            continue
        if not due:
            continue
        # What is pending, read once for the window's batch times and compared as times: the index sorts
        # created_at as text, where one with an offset falls on the wrong side of a UTC batch time.
        created, invalid = [], 0
        try:
            for record in store.pending_keys(dynamodb, tables.records_table, cfg.receiver, PENDING_READ_LIMIT):
                if record_problem(cfg.receiver, record, tick) is None:
                    created.append(schedule.parse_created_at(record["created_at"]))
                else:
                    invalid += 1
        except Exception as exc:  # its receiver only: due, as its run reads what is pending itself
            decision.unread[name] = first_line(exc)
            decision.due.extend(DueBatch(cfg.receiver, moment, 0, 0) for moment in due)
            continue
        if invalid:
            decision.invalid_pending[name] = invalid
        if len(created) + invalid >= PENDING_READ_LIMIT:
            decision.backlog.add(name)
        for moment in due:
            pending = sum(1 for at in created if at < moment)
            empty = cfg.send_if_empty_batch and not schedule.empty_sent(cfg, item, moment)
            if pending == 0 and not empty and name not in decision.backlog:
                decision.skipped[name] = f"nothing pending before {schedule.format_batch_time(moment)}" + (
                    f" (the empty file of {cfg.local_day(moment)} is sent)" if cfg.send_if_empty_batch else ""
                )
                continue
            expected_files = max(1 if empty else 0, math.ceil(pending / cfg.file_size))
            decision.due.append(DueBatch(cfg.receiver, moment, pending, expected_files))
    return decision


def invalid_receivers(items: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {str(item.get("receiver")): errors for item in items if (errors := schedule.receiver_errors(item))}


def orphaned_pending(
    dynamodb, tables, items: list[dict[str, Any]] | None = None, max_pages: int | None = None
) -> dict[str, int] | None:
    """Receivers that are gone from the receivers table (``items``: its scan, when read already) but still
    have pending records (a scan of the sparse pending-index: costs what is pending); None when it goes on
    past ``max_pages`` pages."""
    if items is None:
        items = store.scan_receivers(dynamodb, tables.receivers_table)
    known = {str(i.get("receiver")) for i in items}
    found = dynamodb.get_paginator("scan").paginate(
        TableName=tables.records_table,
        IndexName=store.PENDING_INDEX,
        ProjectionExpression="pending_receiver",
    )
    pending = Counter()
    for pages, page in enumerate(found, 1):
        pending.update(item["pending_receiver"]["S"] for item in page.get("Items", []))
        if pages == max_pages and page.get("LastEvaluatedKey"):
            return None
    return {name: n for name, n in pending.items() if name not in known}


def look_at_receivers(dynamodb, tables) -> Look:
    """The batching checks schedule's look: what two of the three checks read (a scan of the receivers
    table and of the pending-index, at most :data:`LOOK_READS` pages: past them, the invalid receivers alone);
    the third scans the whole records table: the refresh covers it."""
    items = store.scan_receivers(dynamodb, tables.receivers_table)
    invalid = invalid_receivers(items)
    orphans = orphaned_pending(dynamodb, tables, items, LOOK_READS)
    if orphans is None:  # past the bound: a change of the invalid receivers, or the hourly refresh, runs the checks
        orphans, found = f"over {LOOK_READS} page(s) pending", f"over {LOOK_READS} page(s) of the pending-index"
    else:
        found = f"pending records of {len(orphans)} deleted receiver(s)"
    return Look.state(
        {"invalid_receivers": invalid, "orphaned_pending": orphans},
        f"{len(items)} receiver(s), {len(invalid)} invalid; {found}",
    )


def malformed_pending(dynamodb, records_table: str, limit: int = 100) -> tuple[int, list[dict[str, Any]]]:
    """(How many, the first ``limit``) pending records lack ``created_at``/``receiver``/``pending_receiver``
    (the pending-index cannot serve them): a full scan of the records table, for the asset check."""
    keys = ("receiver", "created_at", "pending_receiver")
    found = dynamodb.get_paginator("scan").paginate(
        TableName=records_table,
        FilterExpression=f"next_action = :b AND ({' OR '.join(f'attribute_not_exists({a})' for a in keys)})",
        ExpressionAttributeValues={":b": {"S": store.BATCH_ACTION}},
    )
    total, sample = 0, []
    for raw in (item for page in found for item in page.get("Items", [])):  # counted, not kept
        total += 1
        if len(sample) < limit:
            sample.append(
                {"record_id": raw.get("record_id", {}).get("S"), "missing": [a for a in keys if a not in raw]}
            )
    return total, sample


def valid_partition_names(items: list[dict[str, Any]]) -> tuple[set[str], list[str]]:
    """(names usable as partition keys, names that are not) among receiver items."""
    good, bad = set(), []
    for name in (item.get("receiver") for item in items):
        if isinstance(name, str) and schedule.RECEIVER_NAME.match(name):
            good.add(name)
        else:
            bad.append(repr(name))
    return good, bad
