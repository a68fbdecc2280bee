"""What to do with one candidate, a pure function (the original retry Lambda's rules: ``docs/reclaim.md``)."""

import datetime as dt
from dataclasses import dataclass
from typing import Any

from pipelines.reclaim.source import Candidate
from pipelines.retry import STOP, RetryPolicy, new_attempt_id

TIMEOUT_MESSAGE = "AgendaProgress timed out."
EXHAUSTED_MESSAGE = "attempts exhausted"
NOT_RETRYABLE_MESSAGE = "not retryable"

FAIL = "fail"  # timed out: COMPLETE/failed (fail action, or retry action out of attempts)
RETRY = "retry"  # reset to WAITING/pending and queue a ReadyAgenda item now
HOLD = "hold"  # reset to WAITING/pending with retryAt; a later run queues it
QUEUE = "queue"  # a held retry is due: queue its ReadyAgenda item
CLOSE = "close"  # a COMPLETE/failed item that will not be retried: mark it handled


@dataclass(frozen=True)
class Decision:
    kind: str
    attempt: int  # attemptsCompleted after the write
    event: dict[str, Any] | None  # the diagnostic event to append (None: none)
    retry_at: int | None = None
    reason: str = ""
    attempt_id: str | None = None  # retry and hold: the new attempt's id; queue: the held attempt's

    def describe(self, c: Candidate) -> str:
        if self.kind == FAIL:
            try:
                seen = dt.datetime.fromtimestamp(c.time_ms / 1000, dt.UTC).isoformat(timespec="seconds")
            except (OverflowError, ValueError, OSError):  # beyond any calendar: its number
                seen = f"{c.time_ms} ms"
            return f"fail {c.id} ({c.state} since {seen}; {self.reason})"
        if self.kind == RETRY:
            return f"retry {c.id} now: retry attempt {self.attempt} ({self.reason})"
        if self.kind == HOLD:
            return f"hold {c.id}: retry attempt {self.attempt} due at {self.retry_at} ({self.reason})"
        if self.kind == QUEUE:
            return f"queue the held retry of {c.id} (due at {c.retry_at})"
        return f"close {c.id} without retry ({self.reason})"


def diagnostic_event(message: str, now: int, payload: dict[str, Any], status_code: int = 408) -> dict[str, Any]:
    return {"message": message, "statusCode": status_code, "stackTrace": None, "time": now, "payload": payload}


def decide(c: Candidate, *, action: str, now: int, cutoff: int, policy: RetryPolicy, run_id: str = "") -> Decision:
    """``policy.delay(n)``: seconds before the next attempt after n attempts, or STOP."""
    seen = {"processingState": c.state, "time": c.time_ms, "cutoff": cutoff, "runId": run_id}
    if c.kind == "held":
        return Decision(QUEUE, c.attempts, None, reason="held retry due", attempt_id=c.attempt_id)
    timeout = c.kind == "timeout"
    # "failed": the failed attempt was already counted by whoever failed it
    n = c.attempts + 1 if timeout else max(c.attempts, 1)
    if timeout and action == "fail":
        return Decision(FAIL, n, diagnostic_event(TIMEOUT_MESSAGE, now, seen), reason="timed out")
    stop = _stop_reason(c, n, policy)
    if stop and timeout:
        return Decision(FAIL, n, diagnostic_event(f"{TIMEOUT_MESSAGE} {stop}", now, seen), reason=stop)
    if stop:
        return Decision(CLOSE, n, diagnostic_event(stop, now, seen, status_code=500), reason=stop)
    delay = float(policy.delay(n)) or 0
    attempt_id = new_attempt_id()
    payload = {**seen, "delaySeconds": delay, "attemptId": attempt_id}
    event = diagnostic_event(f"retry attempt {n}", now, payload, status_code=202)
    if delay <= 0:
        return Decision(RETRY, n, event, reason=f"after {n} attempt(s), no delay", attempt_id=attempt_id)
    reason = f"after {n} attempt(s), delay {delay:g}s"
    return Decision(HOLD, n, event, retry_at=now + int(delay * 1000), reason=reason, attempt_id=attempt_id)


def _stop_reason(c: Candidate, n: int, policy: RetryPolicy) -> str | None:
    if not c.retryable:
        return NOT_RETRYABLE_MESSAGE
    if missing := [name for name in ("insightId", "customerId") if not c.agenda.get(name)]:
        # POP's schedulers find a ReadyAgenda item by both: a retry would never be taken
        return f"{NOT_RETRYABLE_MESSAGE} (no {' or '.join(missing)} for its ReadyAgenda item)"
    if c.error_type and not policy.is_retryable(c.error_type):  # the agenda's last error is non-retryable
        return f"{NOT_RETRYABLE_MESSAGE} ({c.error_type})"
    if n >= c.max_attempts:
        return f"{EXHAUSTED_MESSAGE} ({n} of {c.max_attempts})"
    if policy.delay(n) is STOP:
        return f"{EXHAUSTED_MESSAGE} (the retry policy stops after {n})"
    return None
