"""The alerting tests' webhook receiver: ``infra.alerts_receiver`` (the one ``make dev`` runs) on a
free port, under a path like a chat webhook's, whose last segment is its secret."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from infra.alerts_receiver import LocalAlertsReceiver


@contextmanager
def webhook_receiver(path: str = "/services/T000/B000/secret-token") -> Iterator[LocalAlertsReceiver]:
    with LocalAlertsReceiver(path=path) as receiver:
        yield receiver
