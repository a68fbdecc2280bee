"""The ``collect_zombies`` parameters (progressor's own option names) and their validation. No Dagster.

Every problem is a ``ParamsError`` with one line that names the field and the value.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from pipelines.progressor.schema import NamespaceError, check_namespace

ACTIONS = ("error", "retry")
ZOMBIE_ERROR = "zombie detected"  # progressor's detail for a zombie; also the error name retry policies see

# Every config field and what it means (the Launchpad and the README show these).
DESCRIPTIONS: dict[str, str] = {
    "namespace": 'Progressor namespace id, e.g. default/default; its tables are "<namespace>_processes" and so on.',
    "process_step_timeout": "Progressor's process_step_timeout in seconds (1 to 86400).",
    "task_scan_timeout": "Progressor's task_scan_timeout in seconds (1 to 86400). A running task is a zombie "
    "when its running_time is older than process_step_timeout + task_scan_timeout + 5 s (database clock).",
    "action": "error: do what progressor does (task error, process error, schedule dropped); "
    "retry: zombie timers (timeout, remove) within their attempts get a new waiting task, the rest get error.",
    "dry_run": "Log each zombie with what would be done to it; write nothing.",
    "batch_size": "Zombies per transaction (1 to 10000).",
    "lock_timeout_ms": "SET LOCAL lock_timeout of each batch, in milliseconds (1 to 60000); "
    "a batch that times out is rolled back and left for the next run.",
    "retry_policy": "Retry action only: progressor's retry policy fields (initial_timeout, backoff_coefficient, "
    "max_timeout, max_attempts, non_retryable_errors).",
}
POLICY_DESCRIPTIONS: dict[str, str] = {
    "initial_timeout": "Seconds before the first retry (0 to 2592000).",
    "backoff_coefficient": "Next timeout = trunc(last_retry_interval x coefficient) (0 to 1000).",
    "max_timeout": "Retry only while the timeout is below this many seconds (1 to 2592000); unset = no limit.",
    "max_attempts": "Retry only while attempts_count + 1 < max_attempts (1 to 32767).",
    "non_retryable_errors": f"Errors never retried; a zombie's error is {ZOMBIE_ERROR!r}.",
}
RANGES: dict[str, tuple[float, float]] = {
    "process_step_timeout": (1, 86400),
    "task_scan_timeout": (1, 86400),
    "batch_size": (1, 10000),
    "lock_timeout_ms": (1, 60000),
    "initial_timeout": (0, 2592000),
    "backoff_coefficient": (0, 1000),
    "max_timeout": (1, 2592000),
    "max_attempts": (1, 32767),
}
PROTECT_TIMEOUT = 5  # progressor's ?PROTECT_TIMEOUT, seconds added to the threshold


class ParamsError(ValueError):
    """A bad parameter; the message is one line naming the field and the value."""


@dataclass(frozen=True)
class RetryPolicy:
    """Progressor's retry policy (``retry_policy()`` in progressor.hrl) and its defaults."""

    initial_timeout: int = 5
    backoff_coefficient: float = 1.0
    max_timeout: int | None = None
    max_attempts: int = 3
    non_retryable_errors: tuple[str, ...] = ()

    def next_timeout(self, last_retry_interval: int) -> int:
        """Progressor's ``check_retryable``: the initial timeout first, then trunc(last x coefficient)."""
        if last_retry_interval == 0:
            return self.initial_timeout
        return math.trunc(last_retry_interval * self.backoff_coefficient)

    def decide(self, task_type: str, attempts_count: int, last_retry_interval: int) -> tuple[bool, int, str]:
        """(retry?, timeout, reason) for a zombie task: only timers, within attempts and max_timeout."""
        timeout = self.next_timeout(last_retry_interval)
        attempt = attempts_count + 1
        if task_type not in ("timeout", "remove"):
            return False, timeout, f"{task_type} tasks are not retried"
        if ZOMBIE_ERROR in self.non_retryable_errors:
            return False, timeout, f"{ZOMBIE_ERROR!r} is in non_retryable_errors"
        if attempt >= self.max_attempts:
            return False, timeout, f"attempts exhausted ({attempt} of {self.max_attempts})"
        if self.max_timeout is not None and timeout >= self.max_timeout:
            return False, timeout, f"timeout {timeout}s is not below max_timeout {self.max_timeout}s"
        return True, timeout, f"attempt {attempt + 1} of {self.max_attempts} in {timeout}s"


@dataclass(frozen=True)
class CollectParams:
    namespace: str
    process_step_timeout: int = 60
    task_scan_timeout: int = 31
    action: str = "error"
    dry_run: bool = False
    batch_size: int = 100
    lock_timeout_ms: int = 1000
    retry_policy: RetryPolicy = field(default_factory=RetryPolicy)

    @property
    def threshold_seconds(self) -> int:
        """Progressor's zombie age: process_step_timeout + task_scan_timeout + 5 s (96 s by default)."""
        return self.process_step_timeout + self.task_scan_timeout + PROTECT_TIMEOUT

    def as_config(self) -> dict[str, Any]:
        out = asdict(self)
        out["retry_policy"]["non_retryable_errors"] = list(self.retry_policy.non_retryable_errors)
        return out


def _number(name: str, value: Any, *, integer: bool = True, where: str = "") -> Any:
    low, high = RANGES[name]
    ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok_type or not (low <= value <= high) or value != value:
        kind = "an integer" if integer else "a number"
        raise ParamsError(f"{where}{name} must be {kind} from {low:g} to {high:g}, got {value!r}")
    return value


def parse_policy(raw: Any) -> RetryPolicy:
    if raw is None:
        return RetryPolicy()
    if not isinstance(raw, dict):
        raise ParamsError(f"retry_policy must be an object of progressor's policy fields, got {raw!r}")
    unknown = sorted(set(raw) - set(POLICY_DESCRIPTIONS))
    if unknown:
        raise ParamsError(f"retry_policy has unknown field {unknown[0]!r} (known: {', '.join(POLICY_DESCRIPTIONS)})")
    base = RetryPolicy()
    where = "retry_policy."
    errors = raw.get("non_retryable_errors")
    errors = [] if errors is None else errors
    if not isinstance(errors, list | tuple) or not all(isinstance(e, str) for e in errors):
        raise ParamsError(f"retry_policy.non_retryable_errors must be a list of strings, got {errors!r}")
    max_timeout = raw.get("max_timeout")
    return RetryPolicy(
        initial_timeout=_number("initial_timeout", raw.get("initial_timeout", base.initial_timeout), where=where),
        backoff_coefficient=float(
            _number(
                "backoff_coefficient",
                raw.get("backoff_coefficient", base.backoff_coefficient),
                integer=False,
                where=where,
            )
        ),
        max_timeout=None if max_timeout is None else _number("max_timeout", max_timeout, where=where),
        max_attempts=_number("max_attempts", raw.get("max_attempts", base.max_attempts), where=where),
        non_retryable_errors=tuple(errors),
    )


def parse_params(raw: dict[str, Any]) -> CollectParams:
    """Validate a flat run config (progressor's option names); unknown keys are errors."""
    if not isinstance(raw, dict):
        raise ParamsError(f"the run config must be an object, got {raw!r}")
    unknown = sorted(set(raw) - set(DESCRIPTIONS))
    if unknown:
        raise ParamsError(f"unknown key {unknown[0]!r} (known: {', '.join(DESCRIPTIONS)})")
    if "namespace" not in raw:
        raise ParamsError("namespace is required, e.g. default/default")
    try:
        namespace = check_namespace(raw["namespace"])
    except NamespaceError as exc:
        raise ParamsError(str(exc)) from None
    base = CollectParams(namespace=namespace)
    action = raw.get("action", base.action)
    if action not in ACTIONS:
        raise ParamsError(f"action must be one of {', '.join(ACTIONS)}, got {action!r}")
    dry_run = raw.get("dry_run", base.dry_run)
    if not isinstance(dry_run, bool):
        raise ParamsError(f"dry_run must be true or false, got {dry_run!r}")
    numbers = {
        name: _number(name, raw.get(name, getattr(base, name)))
        for name in ("process_step_timeout", "task_scan_timeout", "batch_size", "lock_timeout_ms")
    }
    return CollectParams(
        namespace=namespace,
        action=action,
        dry_run=dry_run,
        retry_policy=parse_policy(raw.get("retry_policy")),
        **numbers,
    )
