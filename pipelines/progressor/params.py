"""The ``collect_zombies`` parameters, with progressor's own option names. No Dagster."""

import math
from dataclasses import dataclass
from typing import Any

from pipelines.common.params import ParamsError, param, parse_params
from pipelines.progressor.schema import TIMER_TYPES, check_namespace

ZOMBIE_ERROR = "zombie detected"  # progressor's detail for a zombie; also the error name retry policies see
MAX_RETRY_INTERVAL = 2**31 - 1  # last_retry_interval is an INTEGER column: a longer timeout is clamped to it


@dataclass(frozen=True)
class ProgressorRetryPolicy:
    """Progressor's retry policy (``retry_policy()`` in progressor.hrl): the ``retry_policy`` run config field.
    Not the retry library's ``RetryPolicy``, whose ``progressor`` preset states the same timing."""

    initial_timeout: int = param(5, description="Seconds before the first retry.", minimum=0, maximum=30 * 86400)
    backoff_coefficient: float = param(
        1.0, description="Next timeout = trunc(last_retry_interval x coefficient).", minimum=0, maximum=1000
    )
    max_timeout: int | None = param(
        None, description="Retry only while the timeout is below this (seconds); null = no limit.", minimum=1
    )
    max_attempts: int = param(
        3, description="Retry only while attempts_count + 1 < max_attempts.", minimum=1, maximum=32767
    )
    non_retryable_errors: list[str] = param(
        [], description=f"Errors never retried; a zombie's error is {ZOMBIE_ERROR!r}."
    )

    def __post_init__(self) -> None:
        if not all(isinstance(e, str) for e in self.non_retryable_errors):
            raise ParamsError(f"non_retryable_errors must be a list of strings, got {self.non_retryable_errors!r}")

    def decide(self, task_type: str, attempts_count: int, last_retry_interval: int) -> tuple[bool, int, str]:
        """(retry?, timeout, reason) for a zombie task: only timers, within attempts and max_timeout."""
        # progressor's check_retryable, clamped: a longer one would fail the batch with NumericValueOutOfRange
        grown = math.trunc(last_retry_interval * self.backoff_coefficient)
        timeout = min(grown if last_retry_interval else self.initial_timeout, MAX_RETRY_INTERVAL)
        attempt = attempts_count + 1
        if task_type not in TIMER_TYPES:
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
    namespace: str = param(
        description='Progressor namespace id, e.g. default/default; its tables are "<namespace>_processes" and so on.'
    )
    process_step_timeout: int = param(
        60, description="Progressor's process_step_timeout, seconds.", minimum=1, maximum=86400
    )
    task_scan_timeout: int = param(
        31,
        description="Progressor's task_scan_timeout, seconds. A running task is a zombie when its running_time is "
        "older than process_step_timeout + task_scan_timeout + 5 s (database clock).",
        minimum=1,
        maximum=86400,
    )
    action: str = param(
        "error",
        description="error: what progressor does (task and process to error, schedule dropped); retry: zombie "
        "timers (timeout, remove) within their attempts get a new waiting task, the rest get error.",
        choices=("error", "retry"),
    )
    writer_time_zone: str | None = param(
        None,
        description="The TimeZone of progressor's own database sessions, which its TO_TIMESTAMP running times "
        "depend on, as an IANA name (Asia/Tokyo); null = every zone they may use (role and database settings, "
        "the server default, the collector's own). Each running time is read back in each zone at its own "
        "wall-clock time and the latest reading counts.",
    )
    dry_run: bool = param(False, description="Log each zombie with what would be done to it; write nothing.")
    batch_size: int = param(100, description="Zombies per transaction.", minimum=1, maximum=10000)
    lock_timeout_ms: int = param(
        1000,
        description="SET LOCAL lock_timeout of each batch, milliseconds; a batch that times out is rolled back "
        "and left for the next run.",
        minimum=1,
        maximum=60000,
    )
    retry_policy: dict[str, Any] = param(
        {},
        description="Retry action only: progressor's retry policy fields initial_timeout (5), backoff_coefficient "
        "(1.0), max_timeout (none), max_attempts (3), non_retryable_errors ([]).",
    )

    def __post_init__(self) -> None:
        check_namespace(self.namespace)  # a NamespaceError is a ParamsError
        self.policy  # noqa: B018 - a bad retry_policy is a ParamsError here

    @property
    def policy(self) -> ProgressorRetryPolicy:
        try:
            return parse_params(ProgressorRetryPolicy, self.retry_policy or {}, what="retry_policy field")[0]
        except ParamsError as exc:
            raise ParamsError(f"retry_policy: {exc}") from None

    @property
    def threshold_seconds(self) -> int:
        """Progressor's zombie age: process_step_timeout + task_scan_timeout + 5 s (96 s by default)."""
        return self.process_step_timeout + self.task_scan_timeout + 5  # progressor's ?PROTECT_TIMEOUT


def collect_params(raw: Any) -> CollectParams:
    """Validate a flat run config or targets entry; deprecation warnings do not apply (no old names)."""
    return parse_params(CollectParams, raw, what="key")[0]
