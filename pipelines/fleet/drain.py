"""The drain loop of both queues and a run's raw archive (docs/fleet.md, "Rounds and flushes" and
"Stopping a drain")."""

import datetime as dt
import json
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pipelines.common import first_line, iso
from pipelines.common.params import param
from pipelines.common.sqs import queue_name
from pipelines.fleet.calls import put_object
from pipelines.fleet.queues import receive

log = logging.getLogger(__name__)

PROGRESS_EVERY = 500  # messages between two progress lines in the run log
TERMINATED = "terminated"  # stopped_by of a drain that saw, at a round boundary, that its run is being terminated
STATUS_UNREADABLE = "status unreadable"  # stopped_by of a drain whose run's status could not be read then
# handler(messages, pool, started_at=<wall-clock time at which the round's receive began>) -> counts
RoundHandler = Callable[..., Counter]


@dataclass(frozen=True)
class DrainLimits:
    """The flat run config of both drain jobs (runs-fleet's camelCase names are its deprecated aliases)."""

    concurrency: int = param(
        10, description="Receives per round and worker threads (a round holds up to 10 x this).", minimum=1, maximum=10
    )
    max_messages: int = param(
        0,
        description="Stop after this many messages (0: until the queue is empty).",
        minimum=0,
        maximum=1_000_000,
        aliases=("maxMessages",),
    )
    max_seconds: float = param(
        300, description="Stop receiving after this many seconds.", minimum=1, maximum=3600, aliases=("maxSeconds",)
    )
    wait_seconds: int = param(
        2,
        description="Long poll of a round's first receive, in seconds; an empty poll ends the run.",
        minimum=0,
        maximum=20,
        aliases=("waitSeconds",),
    )
    stop_timeout_seconds: float = param(
        60,
        description="On terminate or SIGTERM: how long to wait for the round in flight to finish.",
        minimum=0,
        maximum=900,
        aliases=("stopTimeoutSeconds",),
    )


@dataclass(frozen=True)
class TerminationLimits(DrainLimits):
    flush_rounds: int = param(
        3,
        description="Termination queue: rounds whose archive, dead letters, clean-up, done marker and deletes go "
        "out together (their messages stay in flight until then; sooner once half the visibility timeout has "
        "passed).",
        minimum=1,
        maximum=10,
    )


@dataclass
class DrainResult:
    counts: Counter = field(default_factory=Counter)
    rounds: int = 0
    seconds: float = 0.0
    stopped_by: str = ""

    def as_dict(self, keys: tuple[str, ...] = ()) -> dict[str, Any]:
        out: dict[str, Any] = {key: 0 for key in keys}
        out.update(sorted(self.counts.items()))
        out.update(rounds=self.rounds, seconds=round(self.seconds, 3), stopped_by=self.stopped_by)
        if self.seconds > 0:
            out["messages_per_second"] = round(self.counts.get("received", 0) / self.seconds, 1)
        return out


class RunArchive:
    """A run's raw messages as JSON Lines, rewritten whole by each ``write`` (S3 cannot append), in parts of
    up to ``max_bytes`` (docs/fleet.md, "Rounds and flushes"). A retried step (``retry_number`` > 0) writes
    objects of its own, so that it never overwrites what an earlier attempt archived. Thread-safe."""

    def __init__(self, s3, bucket: str, queue: str, run_id: str, *, retry_number: int = 0, max_bytes: int = 256 * 1024):
        self.s3, self.bucket, self.max_bytes = s3, bucket, max_bytes
        attempt = f".retry-{retry_number}" if retry_number else ""
        self.prefix = f"raw/{queue}/{dt.datetime.now(dt.UTC):%Y-%m-%d}/{run_id}{attempt}"
        self._lines: list[bytes] = []
        self._size = 0
        self._part = 1
        self._lock = threading.Lock()
        self.keys: list[str] = []

    def write(self, messages: Sequence[dict[str, Any]]) -> None:
        received = iso(dt.datetime.now(dt.UTC))
        lines = [
            json.dumps(
                {
                    "message_id": m.get("MessageId"),
                    "received_at": received,
                    "receive_count": (m.get("Attributes") or {}).get("ApproximateReceiveCount"),
                    "sent_timestamp": (m.get("Attributes") or {}).get("SentTimestamp"),
                    "body": m.get("Body"),
                },
                ensure_ascii=False,
            ).encode("utf-8", "surrogatepass")
            + b"\n"
            for m in messages
        ]
        with self._lock:
            if self._lines and self._size + sum(map(len, lines)) > self.max_bytes:
                self._lines, self._size, self._part = [], 0, self._part + 1
            self._lines += lines
            self._size += sum(map(len, lines))
            body = b"".join(self._lines)
            key = f"{self.prefix}.jsonl" if self._part == 1 else f"{self.prefix}.part-{self._part:04d}.jsonl"
            put_object(
                self.s3, self.bucket, key, body, what="PutObject (raw archive)", ContentType="application/x-ndjson"
            )
            if key not in self.keys:
                self.keys.append(key)


class QueueDrain:
    def __init__(self, sqs, queue_url: str, handler: RoundHandler, limits: DrainLimits, *, logger: Any):
        self.sqs, self.queue_url, self.handler, self.limits, self.log = sqs, queue_url, handler, limits, logger
        self.stop = threading.Event()
        self.result = DrainResult()
        self.report_keys: tuple[str, ...] = getattr(handler, "report_keys", ())
        self.stop_detail = ""
        self.terminated: Callable[[], bool] | None = None  # is the run being terminated? (round boundaries)

    def _round(self, budget: int) -> list[dict[str, Any]]:
        """One long-poll receive, then (while they come back full) up to ``concurrency - 1`` short polls.
        Sequential: concurrent receives on one queue can be handed the same message (moto does so readily)."""
        messages: list[dict[str, Any]] = []
        wait = self.limits.wait_seconds
        for _ in range(self.limits.concurrency):
            got = receive(self.sqs, self.queue_url, max_messages=min(10, budget - len(messages)), wait_seconds=wait)
            messages += got
            wait = 0
            if len(got) < 10 or len(messages) >= budget or self.stop.is_set():
                break
        return messages

    def _flush(self, pool: ThreadPoolExecutor) -> None:
        flush = getattr(self.handler, "flush", None)
        if flush is not None:
            self.result.counts.update(flush(pool))

    def run(self) -> DrainResult:
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=self.limits.concurrency, thread_name_prefix="drain") as pool:
            try:
                self._loop(pool, started)
            except BaseException:
                try:  # what earlier rounds applied is finished if AWS allows; else redelivery finishes it
                    self._flush(pool)
                except Exception as exc:
                    self.log.error(f"flushing after a failed round failed too: {exc}")
                raise
            self._flush(pool)
        self.result.seconds = time.monotonic() - started
        return self.result

    def _loop(self, pool: ThreadPoolExecutor, started: float) -> None:
        limits, result = self.limits, self.result
        next_progress = PROGRESS_EVERY
        flush_due = getattr(self.handler, "flush_due", None)
        unflushed = 0
        rounds_per_flush = limits.flush_rounds if isinstance(limits, TerminationLimits) else 1
        while True:
            if self.stop.is_set():
                result.stopped_by = "stop requested"
                break
            try:  # a run whose status cannot be read (its instance's database is gone) stops, not works unrecorded
                if self.terminated is not None and self.terminated():
                    result.stopped_by, why = TERMINATED, "the run is being terminated"
            except Exception as exc:
                self.stop_detail, result.stopped_by = first_line(exc), STATUS_UNREADABLE
                why = f"the run's status cannot be read ({self.stop_detail})"
            if result.stopped_by:
                self.stop.set()
                writable_log(result, self.log).warning(f"{why}: no more receives; finishing the messages in flight")
                break
            budget = receive_budget(limits, result.counts["received"], started, 10 * limits.concurrency)
            if isinstance(budget, str):
                result.stopped_by = budget
                break
            round_began = time.time()
            messages = self._round(budget)
            if not messages:
                result.stopped_by = "queue empty"
                break
            result.counts["received"] += len(messages)
            result.counts.update(self.handler(messages, pool, started_at=round_began))
            result.rounds += 1
            unflushed += 1
            if unflushed >= rounds_per_flush or (flush_due is not None and flush_due()):
                self._flush(pool)
                unflushed = 0
            if result.counts["received"] >= next_progress:
                next_progress += PROGRESS_EVERY
                counts = ", ".join(f"{k}={v}" for k, v in sorted(result.counts.items()))
                self.log.info(
                    f"{queue_name(self.queue_url)}: {result.counts['received']} received in "
                    f"{time.monotonic() - started:.1f}s, {counts}"
                )


def receive_budget(limits: Any, received: int, started: float, per_round: int) -> int | str:
    """How many messages the next receive may take, or why the run stops (``max_seconds``, ``max_messages``);
    ``started``: ``time.monotonic()``."""
    if time.monotonic() - started >= limits.max_seconds:
        return "max_seconds"
    left = limits.max_messages - received if limits.max_messages else per_round
    return min(per_round, left) if left > 0 else "max_messages"


def writable_log(result: DrainResult, run_log: Any) -> Any:
    """Where a drain's lines go: ``run_log``, except once its run's status is unreadable (the run's log is
    gone with the instance's database; a write would only wait out the storage's connection retries)."""
    return log if result.stopped_by == STATUS_UNREADABLE else run_log


def queue_drain(
    handler_cls, ctx, *, sqs, queue_url: str, dlq_url: str, run_id: str, limits: DrainLimits, retry_number: int = 0
) -> QueueDrain:
    """``retry_number``: the step's retry (Dagster's ``context.retry_number``; 0 on its first attempt)."""
    archive = RunArchive(ctx.s3, ctx.archive_bucket, queue_name(queue_url), run_id, retry_number=retry_number)
    handler = handler_cls(sqs=sqs, ctx=ctx, archive=archive, queue_url=queue_url, dlq_url=dlq_url)
    return QueueDrain(sqs, queue_url, handler, limits, logger=ctx.log)


def run_with_graceful_stop(
    drain: QueueDrain, *, logger: Any, terminated: Callable[[], bool] | None = None
) -> tuple[DrainResult, BaseException | None]:
    """Run ``drain`` in a worker thread, stopped by an interrupt of the calling (main) thread or ``terminated``
    (docs/fleet.md, "Stopping a drain"). Returns the result and the interrupt to re-raise (or None)."""
    drain.terminated = terminated
    outcome: dict[str, Any] = {}
    finished, watched = threading.Event(), threading.Event()

    def target() -> None:
        watched.wait()  # the drain begins once an interrupt would reach the loop below
        try:
            outcome["result"] = drain.run()
        except BaseException as exc:  # surfaced to the caller's thread
            outcome["error"] = exc
        finally:
            finished.set()

    interrupt: BaseException | None = None
    deadline: float | None = None
    restore: dict[int, Any] = {}
    # Wait on an Event, not Thread.join: an interrupt inside join() can leave is_alive() wrong.
    try:
        threading.Thread(target=target, name="queue-drain", daemon=True).start()
        watched.set()
    except BaseException:  # interrupted before anything was received: the drain, if started, stops at once
        drain.stop.set()
        watched.set()
        raise
    try:
        while True:
            try:  # from here on an interrupt stops the drain gracefully, wherever it lands
                if finished.is_set():
                    break
                if interrupt is not None and deadline is None:
                    deadline = time.monotonic() + drain.limits.stop_timeout_seconds
                    logger.warning("interrupted: no more receives; finishing the messages in flight")
                if deadline is not None and time.monotonic() >= deadline:
                    logger.error(
                        f"stop timeout ({drain.limits.stop_timeout_seconds}s) reached with a round still in flight; "
                        "its unacknowledged messages reappear after their visibility timeout"
                    )
                    break
                finished.wait(0.2)
            except BaseException as exc:  # DagsterExecutionInterruptedError, KeyboardInterrupt
                drain.stop.set()
                if interrupt is None and threading.current_thread() is threading.main_thread():
                    # Later SIGINT/SIGTERM (the executor forwards the signal it got) only keep ``stop``
                    # set, so they cannot cut the round in flight short.
                    for sig in (signal.SIGINT, signal.SIGTERM):
                        restore[sig] = signal.getsignal(sig)
                        signal.signal(sig, lambda *_: drain.stop.set())
                interrupt = interrupt or exc
        if "error" in outcome:
            raise outcome["error"]
        result = outcome.get("result", drain.result)
        if interrupt is not None:
            result.stopped_by = "interrupted"
        summary = result.as_dict(drain.report_keys)
        writable_log(result, logger).info(
            f"{queue_name(drain.queue_url)} drain: " + ", ".join(f"{k}={v}" for k, v in summary.items())
        )
        return result, interrupt
    finally:
        for sig, handler in restore.items():
            signal.signal(sig, handler)
