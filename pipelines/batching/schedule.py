"""Receiver configuration and batch-time math (ReportStream's receivers). No AWS, no Dagster.

A receiver's batch times are ``initial_time + k * (1440 / number_per_day)`` minutes in its time
zone: a fixed set of wall-clock minutes that every local day repeats. Minutes are whole, so for a
``number_per_day`` that does not divide 1440 the k-th offset is ``floor(k * 1440 / n)``.

Daylight saving time (``zoneinfo``):
- a wall time that does not exist (spring forward, e.g. 02:30 in New York) fires at the same
  distance after the gap (03:30 local), i.e. it keeps its UTC offset from before the change;
- a wall time that happens twice (fall back) fires once, at its first occurrence;
- two wall times that land on one instant fire once.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

RECEIVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)\Z")
MAX_BATCH_SIZE_LIMIT = 100_000
BATCH_TIME_FORMAT = "%Y-%m-%dT%H:%MZ"


@dataclass(frozen=True)
class ReceiverConfig:
    receiver: str
    number_per_day: int
    initial_time: str
    time_zone: str
    max_batch_size: int
    send_if_empty_batch: bool
    batching_enabled: bool

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.time_zone)

    @property
    def wall_minutes(self) -> list[int]:
        """The receiver's batch times as minutes after local midnight, sorted."""
        hours, minutes = (int(x) for x in self.initial_time.split(":"))
        start = hours * 60 + minutes
        n = self.number_per_day
        return sorted({(start + (k * 1440) // n) % 1440 for k in range(n)})


class InvalidReceiver(ValueError):
    """A receiver item whose configuration cannot be scheduled."""


def _int_field(item: dict[str, Any], name: str, low: int, high: int, errors: list[str]) -> int:
    value = item.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        errors.append(f"{name} must be an integer from {low} to {high}, got {value!r}")
        return low
    return value


def _bool_field(item: dict[str, Any], name: str, default: bool, errors: list[str]) -> bool:
    value = item.get(name, default)
    if not isinstance(value, bool):
        errors.append(f"{name} must be a boolean, got {value!r}")
        return default
    return value


def receiver_errors(item: dict[str, Any]) -> list[str]:
    """Every problem with a receiver item (plain values, as ``from_item`` gives); empty when valid."""
    errors: list[str] = []
    name = item.get("receiver")
    if not isinstance(name, str) or not RECEIVER_NAME.match(name):
        errors.append(f"receiver name must match {RECEIVER_NAME.pattern} (it is a partition key and an S3 path)")
    _int_field(item, "number_per_day", 1, 1440, errors)
    _int_field(item, "max_batch_size", 1, MAX_BATCH_SIZE_LIMIT, errors)
    initial = item.get("initial_time")
    if not isinstance(initial, str) or not HHMM.match(initial):
        errors.append(f"initial_time must be HH:MM (00:00 to 23:59), got {initial!r}")
    zone = item.get("time_zone", "UTC")
    try:
        if not isinstance(zone, str) or not zone or zone.startswith("/") or ".." in zone:
            raise ZoneInfoNotFoundError(zone)
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        errors.append(f"time_zone must be an IANA zone name, got {zone!r}")
    _bool_field(item, "send_if_empty_batch", False, errors)
    _bool_field(item, "batching_enabled", True, errors)
    return errors


def parse_receiver(item: dict[str, Any]) -> ReceiverConfig:
    """A validated ``ReceiverConfig`` from a receiver item, or ``InvalidReceiver`` naming every problem."""
    errors = receiver_errors(item)
    if errors:
        raise InvalidReceiver(f"receiver {item.get('receiver')!r}: " + "; ".join(errors))
    return ReceiverConfig(
        receiver=item["receiver"],
        number_per_day=item["number_per_day"],
        initial_time=item["initial_time"],
        time_zone=item.get("time_zone", "UTC"),
        max_batch_size=item["max_batch_size"],
        send_if_empty_batch=item.get("send_if_empty_batch", False),
        batching_enabled=item.get("batching_enabled", True),
    )


def batch_times(cfg: ReceiverConfig, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """The receiver's batch times T (aware UTC datetimes) with ``start <= T < end``, sorted."""
    zone = cfg.zone
    first = start.astimezone(zone).date() - dt.timedelta(days=1)
    last = end.astimezone(zone).date() + dt.timedelta(days=1)
    minutes = cfg.wall_minutes
    out: set[dt.datetime] = set()
    day = first
    while day <= last:
        for m in minutes:
            local = dt.datetime(day.year, day.month, day.day, m // 60, m % 60, tzinfo=zone)  # fold=0
            moment = local.astimezone(dt.UTC)
            if start <= moment < end:
                out.add(moment)
        day += dt.timedelta(days=1)
    return sorted(out)


def day_bounds(day: str | dt.date) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) of a UTC day given as ``YYYY-MM-DD``."""
    if isinstance(day, str):
        day = dt.date.fromisoformat(day)
    start = dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
    return start, start + dt.timedelta(days=1)


def batch_times_in_day(cfg: ReceiverConfig, day: str | dt.date, until: dt.datetime | None = None) -> list[dt.datetime]:
    """Batch times of the UTC day ``day``, up to and including ``until`` when given."""
    start, end = day_bounds(day)
    if until is not None:
        end = min(end, until + dt.timedelta(microseconds=1))
    return batch_times(cfg, start, end) if end > start else []


def due_in_window(cfg: ReceiverConfig, tick: dt.datetime, seconds: int = 60) -> list[dt.datetime]:
    """Batch times T with ``tick - seconds < T <= tick`` (what a decider tick at ``tick`` launches)."""
    return batch_times(
        cfg, tick - dt.timedelta(seconds=seconds) + dt.timedelta(microseconds=1), tick + dt.timedelta(microseconds=1)
    )


def format_batch_time(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime(BATCH_TIME_FORMAT)


def parse_batch_time(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, BATCH_TIME_FORMAT).replace(tzinfo=dt.UTC)


def parse_created_at(text: Any) -> dt.datetime | None:
    """A record's ISO-8601 ``created_at`` as an aware UTC datetime, or None when malformed."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return moment.astimezone(dt.UTC)
