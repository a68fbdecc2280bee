"""A decider minute's batching (docs/batching.md, "Runs sized by the work"); one receiver's failure never
stops its neighbours. No Dagster."""

import datetime as dt
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pipelines.batching import store
from pipelines.batching.batcher import ReceiverBatcher, RunReport
from pipelines.batching.schedule import RECEIVER_NAME

SHARE_SIZE = 25
"""The most receivers one step batches: a minute with more due receivers is several steps."""

WORKERS = 4
"""Threads batching a share's receivers at once (each its own batcher; the boto3 clients are shared:
clients are thread-safe, sessions are not). Their work waits on DynamoDB and S3, not the CPU."""


@dataclass(frozen=True)
class Due:
    receiver: str
    day: str

    @property
    def partition(self) -> str:
        """The partition key as Dagster writes a MultiPartitionKey of (day, receiver)."""
        return f"{self.day}|{self.receiver}"


@dataclass
class Outcome:
    due: Due
    report: RunReport | None = None
    error: str | None = None  # one line: the partition failed
    lines: list[str] = field(default_factory=list)  # the batcher's log lines, for the caller's thread to log

    @property
    def failed(self) -> bool:
        return self.error is not None


def worth_showing(report: RunReport) -> bool:
    """Whether a partition's batching needs an operator's eye beyond its run's counts: its own lines and
    event (a materialization; a dry run's, which writes nothing, an observation)."""
    return (
        report.dry_run
        or report.status != "ok"
        or bool(report.recovered)
        or bool(report.errors)  # a lease not given back
        or bool(report.invalid_records)
        or any(f.invalid_payloads for f in report.files)
    )


def parse_partitions(entries: Iterable[object]) -> tuple[list[Due], list[str]]:
    """The run config's ``partitions`` (``<day>|<receiver>`` keys) as :class:`Due` (first of each
    kept, in order), and one line for each entry that is not such a key."""
    wanted: list[Due] = []
    problems: list[str] = []
    for entry in entries:
        day, _, receiver = entry.partition("|") if isinstance(entry, str) else ("", "", "")
        try:
            valid_day = dt.date.fromisoformat(day).isoformat() == day
        except ValueError:
            valid_day = False
        if not (valid_day and RECEIVER_NAME.match(receiver)):
            problems.append(f"partition {entry!r} is not <YYYY-MM-DD>|<receiver>: skipped")
            continue
        wanted.append(Due(receiver, day))
    return list(dict.fromkeys(wanted)), problems


def shares(due: list[Due]) -> list[list[Due]]:
    return [due[i : i + SHARE_SIZE] for i in range(0, len(due), SHARE_SIZE)]


def batch_one(batcher: ReceiverBatcher, due: Due, now: dt.datetime, *, dry_run: bool = False) -> Outcome:
    """Batch one partition; whatever goes wrong is the outcome's one line, not an exception."""
    outcome = Outcome(due)
    batcher.log = outcome.lines.append
    try:
        outcome.report = batcher.run(due.receiver, due.day, now, dry_run=dry_run)
    except store.ReceiverBusy as exc:
        outcome.error = str(exc)
    except Exception as exc:  # noqa: BLE001 - one receiver's failure is its own, never its neighbours'
        outcome.error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    else:
        outcome.error = outcome.report.failure
    return outcome


def batch_share(
    make_batcher: Callable[[Due], ReceiverBatcher],
    share: list[Due],
    now: dt.datetime,
    done: Callable[[Outcome], None],
    *,
    dry_run: bool = False,
) -> list[Outcome]:
    """Batch every partition of ``share`` on :data:`WORKERS` threads, each with its own batcher;
    ``done`` is called with each outcome as it comes (in the caller's thread, in ``share``'s order)."""
    with ThreadPoolExecutor(max_workers=max(1, min(WORKERS, len(share))), thread_name_prefix="batch") as pool:
        futures = [pool.submit(batch_one, make_batcher(d), d, now, dry_run=dry_run) for d in share]
        outcomes = []
        for future in futures:
            outcomes.append(future.result())
            done(outcomes[-1])
    return outcomes
