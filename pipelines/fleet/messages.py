"""Parsing and validation of runs-fleet's queue messages: a message that fails raises ``InvalidMessage``."""

import datetime as dt
import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from pipelines.common import iso, printable
from pipelines.common.params import param, specs

# Outside values that become a path, key or name are checked with ``fullmatch`` (``$`` would
# accept a trailing newline).
INSTANCE_ID_RE = re.compile(r"i-[0-9a-f]{8}([0-9a-f]{9})?")
RUNNER_PREFIX = "/runs-fleet/runners/"
RUNNER_PARAMETER_RE = re.compile(rf"{RUNNER_PREFIX}(?P<instance_id>{INSTANCE_ID_RE.pattern})/config")

# Termination message status -> job status (contract).
STATUS_MAP = {"success": "completed", "failure": "failed", "timeout": "timeout", "interrupted": "interrupted"}
FINAL_STATUSES = tuple(STATUS_MAP.values())
STARTED = "started"
"""The status runs-fleet's agent sends when a job starts; runs-fleet's handler ignores it, and so does the drain."""

MAX_JOB_ID = 256
MAX_ERROR = 4096
MAX_DURATION_SECONDS = 31 * 24 * 3600  # a month: more is a broken clock, not a job
FUTURE_SLACK = dt.timedelta(days=1)
MAX_CLOCK_SKEW = dt.timedelta(minutes=5)
"""A housekeeping ``params.now`` later than the real clock by more than this needs ``dryRun``."""
EARLIEST = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
"""A ``params.now`` before this is a broken clock (refused); a ``started_at`` or ``completed_at`` before it is
absent (Go's zero time is year 1)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class InvalidMessage(ValueError):
    """A message that can never be processed. ``reason`` is one line for the dead-letter attribute."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def fingerprint(body: str) -> str:
    """A stable hash of a message body (dead-letter bookkeeping, archive keys)."""
    return hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()


def valid_instance_id(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidMessage(f"instance_id must be a string, got {type(value).__name__}")
    if not INSTANCE_ID_RE.fullmatch(value):
        raise InvalidMessage(f"invalid instance_id {value[:80]!r}")
    return value


def runner_parameter(instance_id: str) -> str:
    """The runner's SSM parameter. The id is validated again here: no unchecked id builds a path."""
    return f"{RUNNER_PREFIX}{valid_instance_id(instance_id)}/config"


def instance_of_parameter(name: str) -> str | None:
    """The instance id in ``/runs-fleet/runners/<id>/config``, or None for any other name."""
    match = RUNNER_PARAMETER_RE.fullmatch(name)
    return match["instance_id"] if match else None


def utcnow() -> dt.datetime:
    """The real clock (tests move it with monkeypatch; a message never does)."""
    return dt.datetime.now(dt.UTC)


def _reject_constant(name: str) -> Any:
    raise InvalidMessage(f"non-finite number {name} in JSON")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InvalidMessage(f"duplicate key {key[:40]!r} in JSON")
        out[key] = value
    return out


def load_object(body: Any) -> dict[str, Any]:
    """Strict JSON object: no NaN/Infinity, no duplicate keys, no deep nesting bombs."""
    if not isinstance(body, str):
        raise InvalidMessage("message body is not text")
    if not body.strip():
        raise InvalidMessage("empty message body")
    try:
        value = json.loads(body, parse_constant=_reject_constant, object_pairs_hook=_no_duplicate_keys)
    except InvalidMessage:
        raise
    except RecursionError:
        raise InvalidMessage("JSON nested too deeply") from None
    except ValueError as exc:
        raise InvalidMessage(f"malformed JSON: {str(exc)[:120]}") from None
    if not isinstance(value, dict):
        raise InvalidMessage(f"message must be a JSON object, got {type(value).__name__}")
    _reject_unencodable(value)
    return value


def _reject_unencodable(value: dict[str, Any]) -> None:
    """Every text (key or value) must encode as UTF-8: JSON's ``\\ud800`` escapes decode to lone
    UTF-16 surrogates, which no AWS API (DynamoDB, SQS, CloudWatch) accepts."""
    todo: list[tuple[str, Any]] = [("", value)]
    while todo:
        path, item = todo.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                _encodable(key, f"a key in {path or 'the message'}")
                todo.append((f"{path}.{key}" if path else key, child))
        elif isinstance(item, list):
            todo += [(f"{path}[{n}]", child) for n, child in enumerate(item)]
        elif isinstance(item, str):
            _encodable(item, f"field {path}")


def _encodable(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        where = printable(where)[:80]
        raise InvalidMessage(f"{where} contains a lone UTF-16 surrogate (not encodable as UTF-8)") from None


def parse_time(value: Any, name: str, *, earliest: dt.datetime | None = EARLIEST) -> dt.datetime:
    if not isinstance(value, str):
        raise InvalidMessage(f"{name} must be an ISO-8601 string, got {type(value).__name__}")
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        raise InvalidMessage(f"{name} is not ISO-8601: {value[:40]!r}") from None
    if moment.tzinfo is None:
        raise InvalidMessage(f"{name} has no time zone: {value[:40]!r}")
    try:
        moment = moment.astimezone(dt.UTC)
    except OverflowError:  # 0001-01-01T00:00+05:00 has no UTC time
        raise InvalidMessage(f"{name} is out of range in UTC: {value[:40]!r}") from None
    if earliest is not None and moment < earliest:
        raise InvalidMessage(f"{name} is before {iso(earliest)}: {value[:40]!r}")
    return moment


def _job_time(data: dict[str, Any], name: str) -> dt.datetime | None:
    """A termination message's time, None when absent or before :data:`EARLIEST`: runs-fleet sends Go's zero
    time for a job that never started (``time.Time`` without ``omitempty``), and reads it as absent."""
    moment = parse_time(data[name], name, earliest=None) if data.get(name) is not None else None
    return None if moment is None or moment < EARLIEST else moment


def _only_known(names: Any, known: set[str], what: str = "field(s)") -> None:
    """Refuse any name not in ``known``, naming the first five (each cut to 40 characters, escaped)."""
    if unknown := sorted(set(names) - known):
        raise InvalidMessage(f"unknown {what}: {', '.join(printable(u[:40]) for u in unknown[:5])}")


def _text(value: Any, name: str, max_len: int, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidMessage(f"{name} must be a string, got {type(value).__name__}")
    if not value.strip() and not allow_empty:
        raise InvalidMessage(f"{name} is empty")
    if len(value) > max_len:
        raise InvalidMessage(f"{name} longer than {max_len} characters")
    return value


@dataclass(frozen=True)
class Termination:
    instance_id: str
    job_id: str
    status: str  # success | failure | timeout | interrupted, or started (nothing else is read)
    completed_at: str  # normalised ISO-8601 (sorts as text in completed_at-index)
    exit_code: int | None = None
    duration_seconds: float | None = None
    started_at: str | None = None
    error: str | None = None
    interrupted_by: str | None = None  # what interrupted the job (runs-fleet's agent, optional); not stored

    @property
    def job_status(self) -> str:
        return STATUS_MAP[self.status]


def parse_termination(body: Any, *, received_at: dt.datetime) -> Termination:
    """runs-fleet's termination message, or ``InvalidMessage`` with the reason."""
    data = load_object(body)  # other fields (a later agent's tool_cache_misses, ...) are not read, as runs-fleet's
    for name in ("instance_id", "job_id", "status"):
        if name not in data or data[name] is None:
            raise InvalidMessage(f"missing field {name}")
    instance_id = valid_instance_id(data["instance_id"])
    job_id = _text(data["job_id"], "job_id", MAX_JOB_ID)
    if _CONTROL.search(job_id) or job_id != job_id.strip():
        raise InvalidMessage("job_id contains control characters or surrounding spaces")
    status = data["status"]
    if not isinstance(status, str) or status not in (*STATUS_MAP, STARTED):
        raise InvalidMessage(f"unknown status {str(status)[:40]!r}")
    if status == STARTED:
        return Termination(instance_id=instance_id, job_id=job_id, status=status, completed_at=iso(received_at))
    exit_code = data.get("exit_code")
    if exit_code is not None:
        if isinstance(exit_code, bool) or not isinstance(exit_code, int | float):
            raise InvalidMessage(f"exit_code must be a number, got {type(exit_code).__name__}")
        if isinstance(exit_code, float) and (not math.isfinite(exit_code) or exit_code != int(exit_code)):
            raise InvalidMessage(f"exit_code must be a whole number, got {exit_code!r}")
        if not -(2**31) <= exit_code <= 2**31 - 1:
            raise InvalidMessage(f"exit_code out of range [{-(2**31)}, {2**31 - 1}]: {exit_code!r}")
        exit_code = int(exit_code)
    duration = data.get("duration_seconds")
    if duration is not None:
        if isinstance(duration, bool) or not isinstance(duration, int | float):
            raise InvalidMessage(f"duration_seconds must be a number, got {duration!r:.40}")
        if not 0 <= duration <= MAX_DURATION_SECONDS:  # NaN, infinities and integers past a float too
            raise InvalidMessage(f"duration_seconds out of range [0, {MAX_DURATION_SECONDS}]: {duration!r:.40}")
        duration = int(duration) if float(duration).is_integer() else float(duration)
    started = _job_time(data, "started_at")
    completed = _job_time(data, "completed_at") or received_at
    if completed > received_at + FUTURE_SLACK:
        raise InvalidMessage(f"completed_at {iso(completed)} is in the future")
    if started is not None and started > completed:
        raise InvalidMessage("started_at is after completed_at")
    error = None
    if data.get("error") is not None:
        error = _text(data["error"], "error", MAX_ERROR, allow_empty=True) or None
    interrupted_by = None
    if data.get("interrupted_by") is not None:
        interrupted_by = _text(data["interrupted_by"], "interrupted_by", MAX_ERROR, allow_empty=True) or None
    return Termination(
        instance_id=instance_id,
        job_id=job_id,
        status=status,
        completed_at=iso(completed),
        exit_code=exit_code,
        duration_seconds=duration,
        started_at=iso(started) if started else None,
        error=error,
        interrupted_by=interrupted_by,
    )


COMMON_PARAMS = {"now", "dryRun"}


@dataclass(frozen=True)
class HousekeepingRequest:
    """A validated housekeeping message (or the ``housekeeping`` job's flat run config), declared once."""

    task_type: str = param(
        description="The housekeeping task to run (docs/fleet.md lists them, with their parameters).",
    )
    timestamp: str | None = param(None, description="When the message was sent (ISO-8601 with a time zone).")
    params: dict[str, Any] = param(
        {},
        description="The task's parameters: now (ISO-8601, a what-if clock), dryRun (true: change nothing) and "
        "the task's own, as the task declares them.",
    )

    @property
    def dry_run(self) -> bool:
        return bool(self.params.get("dryRun", False))

    def now(self) -> dt.datetime:
        """``params.now`` (what-if runs and tests) or the real clock."""
        return parse_time(self.params["now"], "params.now") if "now" in self.params else utcnow()

    @property
    def task_params(self) -> dict[str, Any]:
        """The task's own parameters (without the common ``now`` and ``dryRun``)."""
        return {k: v for k, v in self.params.items() if k not in COMMON_PARAMS}

    def key(self) -> str:
        """Identical requests in one round run once."""
        return json.dumps([self.task_type, self.params], sort_keys=True)


def parse_housekeeping(data: Any, *, allowed_params: dict[str, set[str]]) -> HousekeepingRequest:
    """A housekeeping message body (text) or run config (dict). ``allowed_params``: task -> its params
    (the dispatcher, which knows which tasks exist, checks ``task_type``)."""
    if not isinstance(data, dict):
        data = load_object(data)
    _only_known(data, {spec.name for spec in specs(HousekeepingRequest)})
    task_type = data.get("task_type")
    if not isinstance(task_type, str) or not task_type:
        raise InvalidMessage("missing field task_type")
    timestamp = data.get("timestamp")
    if timestamp is not None:
        timestamp = iso(parse_time(timestamp, "timestamp", earliest=None))
    params = {} if data.get("params") is None else data["params"]
    if not isinstance(params, dict):
        raise InvalidMessage(f"params must be an object, got {type(params).__name__}")
    if task_type in allowed_params:
        _only_known(params, allowed_params[task_type] | COMMON_PARAMS, f"parameter(s) for {task_type}")
    if "dryRun" in params and not isinstance(params["dryRun"], bool):
        raise InvalidMessage("params.dryRun must be true or false")
    if "now" in params:
        what_if = parse_time(params["now"], "params.now")
        if what_if > utcnow() + MAX_CLOCK_SKEW and not params.get("dryRun", False):
            raise InvalidMessage(
                f"params.now {iso(what_if)} is later than the clock plus {MAX_CLOCK_SKEW.seconds // 60} min: "
                "a clock in the future is only allowed with dryRun"
            )
    return HousekeepingRequest(task_type=task_type, timestamp=timestamp, params=dict(params))
