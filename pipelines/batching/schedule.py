"""Receiver configuration and batch-time math, either form of item (rules and DST: docs/batching.md).
No AWS, no Dagster."""

import datetime as dt
import re
import reprlib
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

RECEIVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)\Z")
HHMMSS = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)(?::([0-5]\d))?\Z")
MAX_BATCH_SIZE_LIMIT = 100_000
BATCH_TIME_FORMAT = "%Y-%m-%dT%H:%MZ"

US_TIME_ZONES: dict[str, str] = {
    "PACIFIC": "America/Los_Angeles",
    "MOUNTAIN": "America/Denver",
    "ARIZONA": "America/Phoenix",
    "CENTRAL": "America/Chicago",
    "EASTERN": "America/New_York",
    "SAMOA": "Pacific/Pago_Pago",
    "HAWAII": "Pacific/Honolulu",
    "EAST_INDIANA": "America/Indiana/Indianapolis",
    "INDIANA_STARKE": "America/Indiana/Knox",
    "MICHIGAN": "America/Detroit",
    "CHAMORRO": "Pacific/Guam",
    "ALASKA": "America/Anchorage",
    "PUERTO_RICO": "America/Puerto_Rico",  # no daylight saving (a mapping to Cuba would add it)
    "US_VIRGIN_ISLANDS": "America/St_Thomas",
    "CHUUK": "Pacific/Chuuk",
    "POHNPEI": "Pacific/Pohnpei",
    "KOSRAE": "Pacific/Kosrae",
    "NORTHERN_MARIANA_ISLANDS": "Pacific/Saipan",
    "UTC": "UTC",
    "MAJURO": "Pacific/Majuro",
}
"""ReportStream's ``USTimeZone`` names -> the IANA zone each denotes (docs/batching.md#reportstreams-settings)."""

REPORTSTREAM_DEFAULTS: dict[str, Any] = {
    "operation": "NONE",
    "numberPerDay": 1,
    "initialTime": "00:00",
    "timeZone": "EASTERN",
    "maxReportCount": 100,
}
"""ReportStream's ``Receiver.Timing`` defaults, for a key its ``timing`` block leaves out."""


@dataclass(frozen=True)
class ReceiverConfig:
    receiver: str
    number_per_day: int
    initial_time: str
    time_zone: str
    max_batch_size: int
    send_if_empty_batch: bool
    batching_enabled: bool
    reportstream_timing: bool = False  # the item carries ReportStream's timing block: its rule
    operation: str = "MERGE"  # NONE: one file per record (ReportStream sends each report on its own)
    empty_once_per_day: bool = False  # whenEmpty.onlyOncePerDay: at most one empty file a local day
    customer_status: str = "active"

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.time_zone)

    @property
    def file_size(self) -> int:
        """Records per batch file: one with ``operation: NONE``, else ``max_batch_size``."""
        return 1 if self.operation == "NONE" else self.max_batch_size

    @property
    def wall_minutes(self) -> list[int]:
        """The receiver's batch times as minutes after local midnight, sorted."""
        if self.reportstream_timing:
            return reportstream_wall_minutes(self.number_per_day, self.initial_time)
        hours, minutes = (int(x) for x in self.initial_time.split(":")[:2])
        n = self.number_per_day
        return sorted({(hours * 60 + minutes + k * 1440 // n) % 1440 for k in range(n)})

    def local_day(self, moment: dt.datetime) -> str:
        """The receiver's local date of an instant, ``YYYY-MM-DD``."""
        return moment.astimezone(self.zone).date().isoformat()


def reportstream_wall_minutes(number_per_day: int, initial_time: str) -> list[int]:
    """ReportStream's batch times of a local day as minutes after midnight, sorted.

    ``batchInPrevious60Seconds`` is true at local second-of-day ``s`` when
    ``((s - initial + 86400 - 60) % period) - period >= -60`` with ``period = 86400 / numberPerDay``
    (integer division) and Kotlin's ``%`` (negative for a negative left side): when one of the
    period ends ``b = initial - 86400 + k * period`` (k >= 0) lies in ``(s - 60, s]`` and
    ``s >= initial - 86340``. A decider ticks at whole minutes, so ``b`` is due at minute
    ``ceil(b / 60)`` of the day.
    """
    parts = [int(x) for x in initial_time.split(":")]
    initial = parts[0] * 3600 + parts[1] * 60 + (parts[2] if len(parts) > 2 else 0)
    period = 86400 // number_per_day
    minutes = {-(-b // 60) for b in range(initial - 86400, 86400, period)}
    return sorted(m for m in minutes if 0 <= m < 1440 and m * 60 >= initial - 86340)


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 3, 80, 80


def shown(value: Any) -> str:
    """``repr(value)`` cut to 80 characters, built no deeper than that (a YAML alias chain is not expanded)."""
    return _SHOWN.repr(value)[:80]


class InvalidReceiver(ValueError):
    """A receiver item whose configuration cannot be scheduled."""


def _checked(values: dict[str, Any], name: str, ok, expected: str, errors: list[str], default: Any = None) -> Any:
    """``values[name]`` (``default`` when absent), with a line in ``errors`` when ``ok`` refuses it: an item
    with errors is never scheduled, so the value is then only read by later checks."""
    value = values.get(name, default)
    if not ok(value):
        errors.append(f"{name} must be {expected}, got {shown(value)}")
    return value


def _int_field(values: dict[str, Any], name: str, high: int, errors: list[str]) -> int:
    def ok(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= high

    return _checked(values, name, ok, f"an integer from 1 to {high}", errors)


def _bool_field(values: dict[str, Any], name: str, default: bool, errors: list[str]) -> bool:
    return _checked(values, name, lambda v: isinstance(v, bool), "a boolean", errors, default)


def _choice(values: dict[str, Any], name: str, choices: tuple[str, ...], default: str, errors: list[str]) -> str:
    return _checked(values, name, lambda v: v in choices, f"one of {', '.join(choices)}", errors, default)


def _map(values: dict[str, Any], name: str, expected: str, errors: list[str]) -> dict[str, Any]:
    value = _checked(values, name, lambda v: isinstance(v, dict), f"a map ({expected})", errors, {})
    return value if isinstance(value, dict) else {}


def _matches(pattern: re.Pattern[str]):
    return lambda value: isinstance(value, str) and pattern.match(value) is not None


def _is_zone(zone: Any) -> bool:
    try:
        if not isinstance(zone, str) or not zone or zone.startswith("/") or ".." in zone:
            return False
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a tzdata folder ("America"), a name too long
        return False
    return True


def iana_zone(name: Any) -> str | None:
    """The IANA zone of a ``USTimeZone`` name or of an IANA name; None when it is neither."""
    if isinstance(name, str) and name in US_TIME_ZONES:
        return US_TIME_ZONES[name]
    return name if _is_zone(name) else None


def _timing_fields(item: dict[str, Any], errors: list[str]) -> dict[str, Any]:
    """The config fields of an item that carries ReportStream's ``timing`` block."""
    timing = _map(item, "timing", "ReportStream's Receiver.Timing", errors)
    whole = {k: int(v) for k, v in timing.items() if isinstance(v, Decimal) and v == v.to_integral_value()}
    values = {**REPORTSTREAM_DEFAULTS, **timing, **whole}  # a number inside a DynamoDB map is a Decimal
    number = _int_field(values, "numberPerDay", 1440, errors)
    size = _int_field(values, "maxReportCount", MAX_BATCH_SIZE_LIMIT, errors)
    initial = _checked(values, "initialTime", _matches(HHMMSS), "HH:MM (00:00 to 23:59)", errors)
    zones = f"a ReportStream USTimeZone name ({', '.join(US_TIME_ZONES)}) or an IANA zone"
    zone = iana_zone(_checked(values, "timeZone", lambda v: iana_zone(v) is not None, zones, errors))
    when_empty = _map(values, "whenEmpty", "action, onlyOncePerDay", errors)
    return {
        "number_per_day": number,
        "initial_time": initial,
        "time_zone": zone,
        "max_batch_size": size,
        "customer_status": _choice(item, "customerStatus", ("active", "testing", "inactive"), "active", errors),
        "send_if_empty_batch": _choice(when_empty, "action", ("NONE", "SEND"), "NONE", errors) == "SEND",
        "empty_once_per_day": _bool_field(when_empty, "onlyOncePerDay", False, errors),
        "operation": _choice(values, "operation", ("MERGE", "NONE"), "NONE", errors),
        "reportstream_timing": True,
    }


def _groundskeeper_fields(item: dict[str, Any], errors: list[str]) -> dict[str, Any]:
    """The config fields of an item in Groundskeeper's own form."""
    return {
        "number_per_day": _int_field(item, "number_per_day", 1440, errors),
        "max_batch_size": _int_field(item, "max_batch_size", MAX_BATCH_SIZE_LIMIT, errors),
        "initial_time": _checked(item, "initial_time", _matches(HHMM), "HH:MM (00:00 to 23:59)", errors),
        "time_zone": _checked(item, "time_zone", _is_zone, "an IANA zone name", errors, "UTC"),
        "send_if_empty_batch": _bool_field(item, "send_if_empty_batch", False, errors),
    }


def _fields(item: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    errors: list[str] = []
    name = item.get("receiver")
    if not isinstance(name, str) or not RECEIVER_NAME.match(name):
        errors.append(f"receiver name must match {RECEIVER_NAME.pattern} (it is a partition key and an S3 path)")
    fields = _timing_fields(item, errors) if "timing" in item else _groundskeeper_fields(item, errors)
    fields["batching_enabled"] = _bool_field(item, "batching_enabled", True, errors)
    return fields, errors


def receiver_errors(item: dict[str, Any]) -> list[str]:
    """Every problem with a receiver item (plain values, as ``from_item`` gives); empty when valid."""
    return _fields(item)[1]


def item_enabled(item: dict[str, Any]) -> bool:
    """Whether a receiver item lets batching go on: ``batching_enabled`` is not false and its
    ``customerStatus`` (ReportStream's) is not ``inactive``."""
    return item.get("batching_enabled", True) is not False and item.get("customerStatus") != "inactive"


def parse_receiver(item: dict[str, Any]) -> ReceiverConfig:
    """A validated ``ReceiverConfig`` (disabled also by ``customerStatus: inactive``), or ``InvalidReceiver``
    naming every problem."""
    fields, errors = _fields(item)
    if errors:
        raise InvalidReceiver(f"receiver {item.get('receiver')!r}: " + "; ".join(errors))
    fields["batching_enabled"] = item_enabled(item)
    return ReceiverConfig(receiver=item["receiver"], **fields)


def empty_sent(cfg: ReceiverConfig, item: dict[str, Any], moment: dt.datetime) -> bool:
    """``onlyOncePerDay`` and another batch time of the local day already has the empty file."""
    if not cfg.empty_once_per_day:
        return False
    day, when = item.get("empty_batch_day"), item.get("empty_batch_time")
    return isinstance(day, str) and (
        day > cfg.local_day(moment) or (day == cfg.local_day(moment) and when != format_batch_time(moment))
    )


def batch_times(cfg: ReceiverConfig, start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    """The receiver's batch times T (aware UTC datetimes) with ``start <= T < end``, sorted."""
    zone, minutes = cfg.zone, cfg.wall_minutes
    first = start.astimezone(zone).date() - dt.timedelta(days=1)
    days = (end.astimezone(zone).date() - first).days + 2  # the local days from before start's to after end's
    walls = (
        dt.datetime.combine(first + dt.timedelta(days=n), dt.time(m // 60, m % 60))
        for n in range(days)
        for m in minutes
    )
    return sorted({moment for wall in walls for moment in _instants(wall, zone) if start <= moment < end})


def _instants(wall: dt.datetime, zone: ZoneInfo) -> tuple[dt.datetime, ...]:
    """The UTC instants of a naive local wall time: one, two when a fall-back repeats it (both
    occurrences), and for a time in a spring-forward gap the instant at the same distance after
    the gap (the UTC offset of before the change, ``fold=0``)."""
    first = wall.replace(tzinfo=zone).astimezone(dt.UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(dt.UTC)
    if first == second or second.astimezone(zone).replace(tzinfo=None) != wall:
        return (first,)  # unambiguous, or in a gap (fold=1 does not round-trip there)
    return (first, second)


def batch_times_in_day(cfg: ReceiverConfig, day: str, until: dt.datetime | None = None) -> list[dt.datetime]:
    """Batch times of the UTC day ``day`` (``YYYY-MM-DD``), up to and including ``until`` when given."""
    start = dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC)
    end = start + dt.timedelta(days=1)
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
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        return moment.astimezone(dt.UTC) if moment.tzinfo else None
    except (AttributeError, TypeError, ValueError, OverflowError):  # not text, not ISO 8601, UTC out of range
        return None
