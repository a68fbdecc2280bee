"""runs-fleet's retry of one AWS call: :func:`aws_call`, by the retry library's ``runs-fleet`` preset."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from pipelines.common.aws_batches import CALL_POLICY
from pipelines.retry import retry_call

T = TypeVar("T")
log = logging.getLogger(__name__)

POLICY = CALL_POLICY
"""Read at each call (tests replace it with a policy that does not wait)."""


def aws_call(operation: Callable[[], T], *, what: str = "AWS call") -> T:
    """``operation()`` retried by :data:`POLICY` after a transient AWS error."""

    def note(attempt: int, exc: BaseException, wait: float) -> None:
        log.warning("%s failed (%s), retry %d in %.1fs", what, exc, attempt, wait)

    return retry_call(operation, POLICY, on_retry=note)
