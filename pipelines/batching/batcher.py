"""One run for a (receiver, UTC day) partition: recover crashed batches, then write the day's batches
under the receiver's lease (the lease, crash recovery and missed batches: docs/batching.md)."""

import datetime as dt
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipelines.batching import schedule, store
from pipelines.batching.schedule import ReceiverConfig, format_batch_time
from pipelines.common import first_line, iso
from pipelines.common.aws_batches import CALL_POLICY, chunks, object_exists, retry_note
from pipelines.retry import retry_call


@dataclass
class BatchSettings:
    receivers_table: str
    records_table: str
    outbox_bucket: str
    lookback: dt.timedelta = dt.timedelta(days=7)
    lease_seconds: float = 300
    lease_wait_seconds: float = 120


@dataclass
class FileWritten:
    key: str
    records: int
    invalid_payloads: int = 0


@dataclass
class BatchWritten:
    batch_time: str
    files: list[FileWritten] = field(default_factory=list)


@dataclass
class RunReport:
    receiver: str
    day: str
    status: str = "ok"  # ok | cancelled | disabled | invalid_config | receiver_missing
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False
    batches: list[BatchWritten] = field(default_factory=list)
    already_done: list[str] = field(default_factory=list)
    recovered: list[dict[str, Any]] = field(default_factory=list)
    invalid_records: list[dict[str, Any]] = field(default_factory=list)
    pending_before: int = 0
    still_pending: int = 0
    oldest_pending_age_seconds: float | None = None

    @property
    def files(self) -> list[FileWritten]:
        return [f for b in self.batches for f in b.files]

    @property
    def records_batched(self) -> int:
        return sum(f.records for f in self.files)

    @property
    def failure(self) -> str | None:
        """One line when the partition fails (as a run of it fails), before any record is read; else None."""
        return "; ".join(self.errors) or self.status if self.status in ("invalid_config", "receiver_missing") else None


@dataclass
class _Record:
    record_id: str
    created: dt.datetime
    item: dict[str, Any]


def record_problem(receiver: str, item: dict[str, Any], now: dt.datetime) -> str | None:
    """Why a pending record of ``receiver`` is invalid at ``now`` (left pending: no run batches it), or None."""
    if item.get("receiver") is None:
        return "missing receiver"
    if item.get("receiver") != receiver:
        return f"receiver {schedule.shown(item.get('receiver'))} differs from pending_receiver {receiver!r}"
    if (created := schedule.parse_created_at(item.get("created_at"))) is None:
        return f"malformed created_at {schedule.shown(item.get('created_at'))}"
    if "batch_id" in item:
        parsed, shown = store.parse_batch_id(item["batch_id"]), schedule.shown(item["batch_id"])
        if parsed is None or parsed[0] != receiver:
            return f"batch_id {shown} is not a batch of this receiver"
        if not created < parsed[1] <= now:  # a run locks a record in a batch time after it, up to its now
            return f"batch_id {shown} names a batch time not after its created_at, or after {format_batch_time(now)}"
    return None


def _classify(receiver: str, items: list[dict[str, Any]], report: RunReport, now: dt.datetime):
    """Split pending items into free records, locked groups (by batch id) and invalid records."""
    free: list[_Record] = []
    locked: dict[str, list[_Record]] = defaultdict(list)
    for item in items:
        rid = item.get("record_id")
        problem = record_problem(receiver, item, now)
        if problem:
            report.invalid_records.append({"record_id": rid, "problem": problem})
            continue
        record = _Record(rid, schedule.parse_created_at(item["created_at"]), item)
        (locked[item["batch_id"]] if "batch_id" in item else free).append(record)
    for group in (free, *locked.values()):
        group.sort(key=lambda r: (r.created, r.record_id))
    return free, locked


@dataclass
class ReceiverBatcher:
    """Batches one receiver for one UTC day. ``now`` is the logical clock (batch times up to it)."""

    dynamodb: Any
    s3: Any
    settings: BatchSettings
    owner: str = field(default_factory=lambda: f"batcher-{uuid.uuid4()}", kw_only=True)
    log: Callable[[str], None] = field(default=lambda _msg: None, kw_only=True)
    clock: Callable[[], float] = field(default=time.monotonic, kw_only=True)  # the lease's age, in seconds
    _lease_taken: float = field(default=0.0, init=False, repr=False)  # the clock when it was last taken or renewed
    _files_by_day: dict[str, dict[str, int]] = field(default_factory=dict, init=False, repr=False)

    def run(self, receiver: str, day: str, now: dt.datetime, *, dry_run: bool = False) -> RunReport:
        report = RunReport(receiver=receiver, day=day, dry_run=dry_run)
        s = self.settings
        self._files_by_day = {}
        if dry_run:
            item = store.get_receiver(self.dynamodb, s.receivers_table, receiver)
        else:
            self._lease_taken = self.clock()
            item = store.acquire_lease(
                self.dynamodb, s.receivers_table, receiver, self.owner, s.lease_seconds, s.lease_wait_seconds
            )
        if item is None:
            report.status = "receiver_missing"
            report.errors.append(
                f"receiver {receiver!r} is not in {s.receivers_table}: receivers come from that table "
                "(receivers_sync removes a partition added by hand at its next tick)"
            )
            return report
        try:
            left = self._run_locked(item, report, now)
            report.still_pending = len(left) + len(report.invalid_records)
            if left:
                report.oldest_pending_age_seconds = max(0.0, (now - min(r.created for r in left)).total_seconds())
        finally:
            if not dry_run:
                self._release(receiver, report)
        return report

    def _release(self, receiver: str, report: RunReport) -> None:
        """Give the lease back; one that cannot be is a line (in ``report.errors`` too: worth an operator's eye),
        never the run's outcome or its error."""
        s = self.settings
        try:
            retry_call(
                lambda: store.release_lease(self.dynamodb, s.receivers_table, receiver, self.owner),
                CALL_POLICY,
                on_retry=retry_note("UpdateItem (lease release)"),
            )
        except Exception as exc:  # noqa: BLE001 - the lease expires on its own
            left = max(0, round(s.lease_seconds - (self.clock() - self._lease_taken)))
            report.errors.append(f"the lease on {receiver} was not released ({first_line(exc)}): expires in {left} s")
            self.log(report.errors[-1])

    def _run_locked(self, item: dict[str, Any], report: RunReport, now: dt.datetime) -> list[_Record]:
        """Batch the day's batch times; returns the records left pending."""
        s = self.settings
        try:
            cfg = schedule.parse_receiver(item)
        except schedule.InvalidReceiver as exc:
            report.status = "invalid_config"
            report.errors.append(str(exc))
            return []
        if not cfg.batching_enabled:
            report.status = "disabled"
            return []

        pending_items = store.query_pending(self.dynamodb, s.records_table, cfg.receiver)
        report.pending_before = len(pending_items)
        free, locked = _classify(cfg.receiver, pending_items, report, now)
        if report.invalid_records:
            self.log(f"{len(report.invalid_records)} pending record(s) of {cfg.receiver} are malformed; left pending")

        day_times = schedule.batch_times_in_day(cfg, report.day, until=now)
        locked_times = {store.parse_batch_id(b)[1] for b in locked}
        wanted = sorted(set(day_times) | locked_times)
        if not wanted:
            return free
        low, high = wanted[0] - s.lookback, wanted[-1]
        done = self._ledger(cfg.receiver, low, high)
        report.already_done = [format_batch_time(t) for t in day_times if t in done]

        for batch in sorted(locked, key=lambda b: store.parse_batch_id(b)[1:]):
            if not self._recover(cfg, batch, locked[batch], report):
                return free

        own = set(wanted)
        last = max((t for t in done if t < wanted[0]), default=None)
        if last:  # the batch times missed since the last one done (none was due, a stop, an outage), in order
            wanted = sorted(own | set(schedule.batch_times(cfg, last, wanted[-1])))
        taken: set[str] = set()
        for moment in wanted:
            if moment in done:
                continue
            candidates = [r for r in free if r.record_id not in taken and r.created < moment]
            if not candidates and moment not in own:  # a missed one of another day writes only with records
                continue
            if self._write_batch(cfg, moment, candidates, taken, report) is None:  # cancelled
                break
        return [r for r in free if r.record_id not in taken]

    def _ledger(self, receiver: str, low: dt.datetime, high: dt.datetime) -> set[dt.datetime]:
        prefix = f"ledger/{receiver}/"
        start_after = store.ledger_key(receiver, low - dt.timedelta(minutes=1))
        out = set()
        for key in store.list_keys(
            self.s3, self.settings.outbox_bucket, prefix, start_after, store.ledger_key(receiver, high)
        ):
            try:
                out.add(schedule.parse_batch_time(key[len(prefix) :].removesuffix(".json")))
            except ValueError:
                continue
        return out

    def _existing_files(self, receiver: str, moment: dt.datetime) -> int:
        """The highest file number already in S3 for batch time ``moment`` (0 when none)."""
        day = moment.strftime("%Y-%m-%d")
        if day not in self._files_by_day:
            found: dict[str, int] = {}
            prefix = f"batches/{receiver}/{day}T"
            for key in store.list_keys(self.s3, self.settings.outbox_bucket, prefix):
                parts = key.split("/")
                if len(parts) == 4 and parts[3].endswith(".jsonl") and parts[3][:-6].isdigit():
                    found[parts[2]] = max(found.get(parts[2], 0), int(parts[3][:-6]))
            self._files_by_day[day] = found
        return self._files_by_day[day].get(format_batch_time(moment), 0)

    def _still_enabled(self, cfg: ReceiverConfig, report: RunReport) -> bool:
        """Renew the lease (also reads the receiver now); False when batching was switched off."""
        if report.dry_run:
            return True
        s = self.settings
        self._lease_taken = self.clock()
        item = store.renew_lease(self.dynamodb, s.receivers_table, cfg.receiver, self.owner, s.lease_seconds)
        if not schedule.item_enabled(item):
            report.status = "cancelled"
            self.log(
                f"{cfg.receiver} is disabled (batching_enabled false or customerStatus inactive): "
                "stopping before the next file"
            )
            return False
        return True

    def _hold_lease(self, receiver: str) -> None:
        """Before a write to S3: renew the lease once half of it has run out since it was last taken or
        renewed (``LeaseLost`` when another run has it now); no call while more than half is left."""
        s = self.settings
        if self.clock() - self._lease_taken >= s.lease_seconds / 2:
            self._lease_taken = self.clock()
            store.renew_lease(self.dynamodb, s.receivers_table, receiver, self.owner, s.lease_seconds)

    def _upload_and_finalize(self, batch: str, key: str, records: list[_Record], upload: bool = True) -> FileWritten:
        lines = [store.record_line(r.item, batch) for r in records]
        if upload:
            self._hold_lease(store.parse_batch_id(batch)[0])
            store.put_file(self.s3, self.settings.outbox_bucket, key, lines)
        ids = [r.record_id for r in records]
        at = iso(dt.datetime.now(dt.UTC))
        finalized = store.finalize_records(self.dynamodb, self.settings.records_table, ids, batch, at)
        invalid = sum(1 for line in lines if '"payload_invalid_json":true' in line)
        return FileWritten(key=key, records=finalized, invalid_payloads=invalid)

    def _recover(self, cfg: ReceiverConfig, batch: str, records: list[_Record], report: RunReport) -> bool:
        """Finish a file whose run died between locking and finalizing."""
        _, moment, n = store.parse_batch_id(batch)
        key = store.file_key(cfg.receiver, moment, n)
        # another refusal than its absence says nothing of the file: the run fails and retries
        in_s3 = object_exists(self.s3, self.settings.outbox_bucket, key)
        if not report.dry_run:
            if not self._still_enabled(cfg, report):
                return False
            # a file in S3: the upload happened, only the final updates were missing
            finalized = self._upload_and_finalize(batch, key, records, upload=not in_s3).records
            self.log(f"recovered {batch}: {finalized} record(s) ({'finalized' if in_s3 else 'written'})")
        else:
            finalized = len(records)
        report.recovered.append({"batch_id": batch, "key": key, "records": finalized, "file_was_in_s3": in_s3})
        return True

    def _may_send_empty(self, cfg: ReceiverConfig, moment: dt.datetime, report: RunReport) -> bool:
        """Whether batch time ``moment`` may write an empty file: always, unless ``onlyOncePerDay``
        and another batch time of the receiver's local day has (the claim on the receiver item)."""
        if not cfg.empty_once_per_day:
            return True
        day = cfg.local_day(moment)
        if report.dry_run:
            item = store.get_receiver(self.dynamodb, self.settings.receivers_table, cfg.receiver) or {}
            return not schedule.empty_sent(cfg, item, moment)
        if store.claim_empty_batch(self.dynamodb, self.settings.receivers_table, cfg.receiver, self.owner, day, moment):
            return True
        self.log(
            f"{cfg.receiver} {format_batch_time(moment)}: the empty file of {day} is already sent (onlyOncePerDay)"
        )
        return False

    def _write_batch(
        self,
        cfg: ReceiverConfig,
        moment: dt.datetime,
        candidates: list[_Record],
        taken: set[str],
        report: RunReport,
    ) -> BatchWritten | None:
        s = self.settings
        existing = self._existing_files(cfg.receiver, moment)
        written = BatchWritten(batch_time=format_batch_time(moment))
        for group in chunks(candidates, cfg.file_size):
            if not self._still_enabled(cfg, report):
                if written.files:
                    report.batches.append(written)
                return None
            n = existing + len(written.files) + 1  # a group with no record locked wrote no file
            batch = store.batch_id(cfg.receiver, moment, n)
            key = store.file_key(cfg.receiver, moment, n)
            taken.update(r.record_id for r in group)  # records a run could not lock belong to someone else
            if report.dry_run:
                written.files.append(FileWritten(key=key, records=len(group)))
                continue
            ids = [r.record_id for r in group]
            got = set(
                store.lock_records(
                    self.dynamodb, s.records_table, s.receivers_table, cfg.receiver, self.owner, ids, batch
                )
            )
            mine = [r for r in group if r.record_id in got]
            if not mine:
                continue
            written.files.append(self._upload_and_finalize(batch, key, mine))
            self.log(f"{cfg.receiver} {written.batch_time}: wrote {key} ({len(mine)} records)")
        if not written.files and not existing and cfg.send_if_empty_batch and self._may_send_empty(cfg, moment, report):
            if not self._still_enabled(cfg, report):
                return None
            key = store.file_key(cfg.receiver, moment, 1)
            # only where no file is: a run whose lease lapsed while it got here must not empty another's
            if not report.dry_run and not store.put_file(self.s3, s.outbox_bucket, key, [], new_only=True):
                self.log(f"{cfg.receiver} {written.batch_time}: {key} was written by another run meanwhile; kept")
                return None
            written.files.append(FileWritten(key=key, records=0))
        if not report.dry_run:
            entry = {
                "receiver": cfg.receiver,
                "batch_time": written.batch_time,
                "files": [{"key": f.key, "records": f.records} for f in written.files],
                "resumed_after_file": existing,
                "run": self.owner,
                "written_at": iso(dt.datetime.now(dt.UTC)),
            }
            self._hold_lease(cfg.receiver)  # a run whose lease lapsed leaves the new owner's entry as it is
            store.put_ledger(self.s3, s.outbox_bucket, cfg.receiver, moment, entry)
        report.batches.append(written)
        return written
