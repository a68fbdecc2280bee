"""Environment values, one reader per kind: a bad one is a ``SettingsError`` line naming the variable."""

import datetime as dt
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class SettingsError(ValueError):
    """An environment value out of its allowed values: one line naming the variable and them."""


def int_env(name: str, default: int, *, minimum: int, maximum: int, env: Mapping[str, str] | None = None) -> int:
    """A whole number from ``minimum`` to ``maximum`` (unset or empty: ``default``)."""
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not minimum <= value <= maximum:
        raise SettingsError(f"{name}={raw!r} is invalid: a whole number from {minimum} to {maximum}")
    return value


def date_env(name: str, default: dt.date | None, *, env: Mapping[str, str] | None = None) -> dt.date | None:
    """A ``YYYY-MM-DD`` date (unset or empty: ``default``)."""
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return default
    try:
        return dt.date.fromisoformat(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is invalid: a YYYY-MM-DD date") from None


def bool_env(name: str, default: bool) -> bool:
    """``true`` or ``false`` (unset or empty: ``default``)."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("true", "1", "yes"):
        return True
    if raw in ("false", "0", "no"):
        return False
    raise SettingsError(f"{name}={raw!r} is invalid: true or false")


def checked(problems: list[str], read: Callable[..., T], name: str, default: T, **allowed: Any) -> T:
    """``read(name, default, **allowed)``, or ``default`` with the problem's line added to ``problems``."""
    try:
        return read(name, default, **allowed)
    except SettingsError as exc:
        problems.append(str(exc))
        return default


MAX_LOOKBACK_DAYS = 366


def batch_partitions_env(problems: list[str], env: Mapping[str, str] | None = None) -> tuple[dt.date | None, int]:
    """``BATCH_PARTITIONS_START_DATE`` (a date, or None) and ``BATCH_PARTITIONS_LOOKBACK_DAYS`` (1 to
    366, default 30); an invalid one counts as unset and its line goes to ``problems``."""
    start = checked(problems, date_env, "BATCH_PARTITIONS_START_DATE", None, env=env)
    lookback = checked(
        problems, int_env, "BATCH_PARTITIONS_LOOKBACK_DAYS", 30, minimum=1, maximum=MAX_LOOKBACK_DAYS, env=env
    )
    return start, lookback


ALERT_ENV = {
    "sns_topic_arn": "ALERTS_SNS_TOPIC_ARN",
    "webhook_url": "ALERTS_WEBHOOK_URL",
    "remind_hours": "ALERTS_REMIND_HOURS",
    "max_per_tick": "ALERTS_MAX_PER_TICK",
    "tick_failures": "ALERTS_TICK_FAILURES",
    "retry_policy": "ALERTS_RETRY_POLICY",
    "muted_warn_checks": "ALERTS_MUTED_WARN_CHECKS",
    "ui_url": "DAGSTER_UI_URL",
    "runbook_base_url": "ALERTS_RUNBOOK_BASE_URL",
    "heartbeat_env": "ALERTS_HEARTBEAT_ENV",
}
"""``AlertSettings``' fields and their variables, which alerting's lines on a bad value name."""
