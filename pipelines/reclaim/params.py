"""The reclaim job's parameters: the seed's flat JSON (seed 000) plus camelCase extensions.

Pure Python (no Dagster): the Dagster config schema, the targets file and the tests all go
through :func:`parse_params`, so a value is validated the same way wherever it comes from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

# name -> (type, default). ``None`` default with ``required`` below means "no default".
SEED_FIELDS: dict[str, tuple[type, Any]] = {
    "maximumExecutionSeconds": (int, 60),
    "tableName": (str, None),
    "idFieldName": (str, None),
    "timeFieldName": (str, None),
    "reclaimAgeMinutes": (int, 0),
    "scanDelayMillis": (int, 0),
    "targetBatchSize": (int, 50),
    "objectScanLimit": (int, 50),
    "logReclaimOnly": (bool, False),
    "agendaProgressEndpointURL": (str, None),
}
REQUIRED = ("tableName", "idFieldName", "timeFieldName")

EXTENSION_FIELDS: dict[str, tuple[type, Any]] = {
    "reclaimAction": (str, "fail"),
    "retryPolicy": (dict, None),
    "indexName": (str, None),
    "segments": (int, 1),
    "operationProgressTableName": (str, None),
    "includeWaiting": (bool, False),
    "retryFailed": (bool, False),
}
ALL_FIELDS = {**SEED_FIELDS, **EXTENSION_FIELDS}

ACTIONS = ("fail", "retry")
MAX_SEGMENTS = 64
# DynamoDB: table and index names are 3-255 of [a-zA-Z0-9_.-]; attribute names 1-255 bytes.
TABLE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{3,255}$")


class ParamsError(ValueError):
    """A parameter is missing, unknown or out of range; the message names it and its value."""


@dataclass(frozen=True)
class ReclaimParams:
    tableName: str
    idFieldName: str
    timeFieldName: str
    maximumExecutionSeconds: int = 60
    reclaimAgeMinutes: int = 0
    scanDelayMillis: int = 0
    targetBatchSize: int = 50
    objectScanLimit: int = 50
    logReclaimOnly: bool = False
    agendaProgressEndpointURL: str | None = None
    reclaimAction: str = "fail"
    retryPolicy: dict | None = field(default=None, hash=False, compare=False)
    indexName: str | None = None
    segments: int = 1
    operationProgressTableName: str | None = None
    includeWaiting: bool = False
    retryFailed: bool = False

    @property
    def dry_run(self) -> bool:
        return self.logReclaimOnly

    def cutoff_ms(self, now_ms: int) -> int:
        """Items whose time field is below this are stale: ``now - reclaimAgeMinutes``."""
        return now_ms - self.reclaimAgeMinutes * 60_000

    def as_config(self) -> dict[str, Any]:
        """The flat camelCase dict again (None values left out), e.g. for a run config."""
        return {name: getattr(self, name) for name in ALL_FIELDS if getattr(self, name) is not None}


def _check_type(name: str, value: Any, kind: type) -> Any:
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamsError(f"{name} must be an integer, got {value!r}")
    elif kind is bool:
        if not isinstance(value, bool):
            raise ParamsError(f"{name} must be true or false, got {value!r}")
    elif not isinstance(value, kind):
        raise ParamsError(f"{name} must be a {kind.__name__}, got {value!r}")
    return value


def parse_params(raw: dict[str, Any]) -> ReclaimParams:
    """Validate the flat JSON; unknown keys, missing required keys and bad ranges are errors."""
    if not isinstance(raw, dict):
        raise ParamsError(f"the reclaim parameters must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(ALL_FIELDS))
    if unknown:
        raise ParamsError(f"unknown parameter(s) {', '.join(unknown)}; known: {', '.join(ALL_FIELDS)}")
    values: dict[str, Any] = {}
    for name, (kind, default) in ALL_FIELDS.items():
        value = raw.get(name, default)
        if value is None:
            if name in REQUIRED:
                raise ParamsError(f"{name} is required")
            continue
        values[name] = _check_type(name, value, kind)
    params = ReclaimParams(**values)
    _check_ranges(params)
    return params


def _check_ranges(p: ReclaimParams) -> None:
    for name in ("tableName", "indexName", "operationProgressTableName"):
        value = getattr(p, name)
        if value is not None and not TABLE_NAME_RE.match(value):
            raise ParamsError(f"{name} {value!r} is not a valid DynamoDB name (3-255 of A-Z a-z 0-9 _ . -)")
    for name in ("idFieldName", "timeFieldName"):
        value = getattr(p, name)
        if not value or len(value.encode()) > 255:
            raise ParamsError(f"{name} {value!r} must be 1 to 255 bytes long")
    for name in ("targetBatchSize", "objectScanLimit", "maximumExecutionSeconds"):
        if getattr(p, name) < 1:
            raise ParamsError(f"{name} must be at least 1, got {getattr(p, name)}")
    if p.objectScanLimit > 1000:
        raise ParamsError(f"objectScanLimit must be at most 1000 (one DynamoDB page), got {p.objectScanLimit}")
    for name in ("reclaimAgeMinutes", "scanDelayMillis"):
        if getattr(p, name) < 0:
            raise ParamsError(f"{name} must not be negative, got {getattr(p, name)}")
    if p.reclaimAction not in ACTIONS:
        raise ParamsError(f"reclaimAction must be one of {', '.join(ACTIONS)}, got {p.reclaimAction!r}")
    if not 1 <= p.segments <= MAX_SEGMENTS:
        raise ParamsError(f"segments must be between 1 and {MAX_SEGMENTS}, got {p.segments}")
    if p.retryFailed and p.reclaimAction != "retry":
        raise ParamsError("retryFailed needs reclaimAction 'retry'")
    if p.retryPolicy is not None and p.reclaimAction != "retry":
        raise ParamsError("retryPolicy needs reclaimAction 'retry'")
    if p.agendaProgressEndpointURL is not None:
        check_url("agendaProgressEndpointURL", p.agendaProgressEndpointURL)


def check_url(name: str, value: str) -> str:
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ParamsError(f"{name} must be an http(s) URL, got {value!r}")
    return value.rstrip("/")


def check_max_runtime(params: ReclaimParams, max_runtime_tag: str | None) -> None:
    """The seed's warning: the scan budget must be below the run's own timeout (``dagster/max_runtime``)."""
    if max_runtime_tag is None:
        return
    try:
        max_runtime = float(max_runtime_tag)
    except ValueError:
        raise ParamsError(f"the run tag dagster/max_runtime={max_runtime_tag!r} is not a number") from None
    if params.maximumExecutionSeconds >= max_runtime:
        raise ParamsError(
            f"maximumExecutionSeconds={params.maximumExecutionSeconds} must be below the run's "
            f"dagster/max_runtime={max_runtime_tag} seconds, or the run is killed mid-batch"
        )
