"""Small helpers shared by the capabilities. No Dagster imports."""

import datetime as dt
import re
from decimal import Decimal
from functools import cache
from typing import Any


@cache
def _types() -> tuple[Any, Any]:
    """boto3's (serializer, deserializer), made at first use: importing boto3 costs about 0.1 s."""
    from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

    return TypeSerializer(), TypeDeserializer()


def to_item(values: dict[str, Any]) -> dict[str, Any]:
    """Plain Python values -> a DynamoDB low-level item (floats become Decimals, None is left out)."""
    serializer = _types()[0]
    return {
        key: serializer.serialize(Decimal(str(value)) if isinstance(value, float) else value)
        for key, value in values.items()
        if value is not None
    }


def from_item(item: dict[str, Any]) -> dict[str, Any]:
    """A DynamoDB low-level item -> plain Python values (integral Decimals become ints)."""
    deserializer = _types()[1]
    out = {}
    for key, value in item.items():
        plain = deserializer.deserialize(value)
        if isinstance(plain, Decimal):
            plain = int(plain) if plain == plain.to_integral_value() else float(plain)
        out[key] = plain
    return out


def now_ms(now: dt.datetime | None = None) -> int:
    """Epoch milliseconds (the contract's time unit)."""
    return int((now or dt.datetime.now(dt.UTC)).timestamp() * 1000)


def time_gone_by(value: Any, now: float) -> float:
    """``value`` as a time read back (a cursor's): seconds since the epoch from 0 to ``now``, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= now:
        raise ValueError(f"not a time gone by: {value!r}")
    return float(value)


def iso(moment: dt.datetime) -> str:
    """ISO-8601 UTC with milliseconds and a Z, e.g. ``2026-11-22T01:02:03.456Z``; the year always has four
    digits (glibc's ``%Y`` writes year 5 as ``5``), so it sorts as text."""
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def dimension_value(value: Any) -> str:
    """A CloudWatch dimension value: printable ASCII (AWS refuses the rest), not blank, at most 255."""
    text = re.sub(r"[^\x20-\x7e]", "?", str(value)).strip()[:255]
    return text or "none"


def printable(text: Any) -> str:
    """``text`` with every character that is not printable (a newline, a control character) escaped as Python
    writes it: a value read from a table or a message stays on its line of the log."""
    text = str(text)
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def first_line(error: Any, limit: int | None = 300) -> str:
    """The first non-blank line of an error, collapsed, cut to ``limit`` (None: not cut). A first line
    ending in ``:`` (botocore's ``Parameter validation failed:``) is joined by the lines under it."""
    lines = [" ".join(line.split()) for line in str("" if error is None else error).splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return type(error).__name__ if isinstance(error, BaseException) else ""
    line = " ".join(lines) if lines[0].endswith(":") else lines[0]
    return line if limit is None or len(line) <= limit else line[: limit - 1] + "…"
