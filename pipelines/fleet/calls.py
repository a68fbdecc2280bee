"""runs-fleet's retry of one AWS call: :func:`aws_call` retries a transient AWS error (the retry
library's classification, ``pipelines.retry.classify``) after runs-fleet's fixed waits, 100 ms, 500 ms,
1 s (the retry library's ``runs-fleet`` preset, :data:`POLICY`), then raises it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from pipelines.retry import is_transient, preset, retry_call

T = TypeVar("T")
log = logging.getLogger(__name__)


POLICY = preset("runs-fleet")
"""runs-fleet's retry of one AWS call (pkg/events/handler.go): waits 0.1, 0.5, 1 s, 4 attempts."""


def aws_call(
    operation: Callable[[], T], *, what: str = "AWS call", retryable: Callable[[BaseException], bool] = is_transient
) -> T:
    """``operation()`` retried by :data:`POLICY` after a transient AWS error (or what ``retryable`` accepts)."""

    def note(attempt: int, exc: BaseException, wait: float) -> None:
        log.warning("%s failed (%s), retry %d in %.1fs", what, exc, attempt, wait)

    return retry_call(operation, POLICY, retryable=retryable, on_retry=note)
