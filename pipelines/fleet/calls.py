"""runs-fleet's retry of one AWS call: :func:`aws_call`, by the retry library's ``runs-fleet`` preset."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from pipelines.retry import preset, retry_call

T = TypeVar("T")
log = logging.getLogger(__name__)

POLICY = preset("runs-fleet")
"""runs-fleet's retry of one AWS call (pkg/events/handler.go): waits 0.1, 0.5, 1 s, 4 attempts."""


def aws_call(operation: Callable[[], T], *, what: str = "AWS call") -> T:
    """``operation()`` retried by :data:`POLICY` after a transient AWS error."""

    def note(attempt: int, exc: BaseException, wait: float) -> None:
        log.warning("%s failed (%s), retry %d in %.1fs", what, exc, attempt, wait)

    return retry_call(operation, POLICY, on_retry=note)
