"""The run config of ``close_incident``, declared once (no Dagster)."""

from dataclasses import dataclass

from pipelines.common.params import ParamsError, param

ACKNOWLEDGE, CLOSE = "acknowledge", "close"


@dataclass(frozen=True)
class IncidentAction:
    key: str = param(description="The incident's alert_key, as its messages and the alerts/incidents table show it.")
    action: str = param(
        ACKNOWLEDGE,
        description=(
            "acknowledge: someone is on it (no more reminders; it still resolves by itself); close: it is "
            "over (closed until it fires again: a new failed run, or the problem gone and back)."
        ),
        choices=(ACKNOWLEDGE, CLOSE),
    )
    note: str = param("", description="Why, in one line; shown in the message sent.")

    def __post_init__(self) -> None:
        if not self.key.strip():
            raise ParamsError("key must be an incident's alert_key, e.g. dead_letters:runs-fleet-termination-dlq-dev")
