"""Builds the writer a run uses (DynamoDB or the HTTP endpoint) and keeps the scan cursor. No Dagster."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pipelines.reclaim.engine import decode_cursor, encode_cursor
from pipelines.reclaim.http import AgendaProgressEndpoint, EndpointError, HttpWriter, decrypt_password, login
from pipelines.reclaim.params import ParamsError, ReclaimParams, check_url
from pipelines.reclaim.writers import DynamoWriter

ENDPOINT_ENV = ("IDENTITY_URL", "IDM_USER", "IDM_ENCRYPTED_PASS")


def endpoint_url(params: ReclaimParams, environ: Mapping[str, str] = os.environ) -> str | None:
    """``agendaProgressEndpointURL`` wins over ``AGENDA_PROGRESS_URL``; None = write to DynamoDB."""
    url = params.agendaProgressEndpointURL or environ.get("AGENDA_PROGRESS_URL") or None
    return check_url("AGENDA_PROGRESS_URL", url) if url else None


def make_writer(
    params: ReclaimParams, *, dynamodb, kms, ready_table: str | None, environ: Mapping[str, str] = os.environ
) -> DynamoWriter | HttpWriter:
    url = endpoint_url(params, environ)
    if url is None:
        return DynamoWriter(
            dynamodb,
            table=params.tableName,
            time_field=params.timeFieldName,
            ready_table=ready_table,
            action=params.reclaimAction,
        )
    missing = [name for name in ENDPOINT_ENV if not environ.get(name)]
    if missing:
        raise EndpointError(f"the AgendaProgress endpoint {url} needs {', '.join(missing)} in the environment")
    identity_url = check_url("IDENTITY_URL", environ["IDENTITY_URL"])
    user, encrypted = environ["IDM_USER"], environ["IDM_ENCRYPTED_PASS"]

    def authenticate():
        return login(identity_url, user, decrypt_password(kms, encrypted))

    return HttpWriter(
        AgendaProgressEndpoint(url, authenticate),
        time_field=params.timeFieldName,
        action=params.reclaimAction,
        table=params.tableName,
        dynamodb=dynamodb,
        ready_table=ready_table,
    )


class KeyValueCursor:
    """The scan position of one (table, segment), kept in a key-value store (the Dagster instance)."""

    def __init__(self, get: Any, put: Any, key: str) -> None:
        self._get, self._put, self.key = get, put, key

    def load(self) -> dict[str, Any] | None:
        try:
            return decode_cursor(self._get(self.key))
        except ValueError:
            return None  # an unreadable cursor restarts the pass; it never fails the run

    def save(self, key: dict[str, Any] | None) -> None:
        self._put(self.key, encode_cursor(key))


def cursor_key(params: ReclaimParams, segment: int) -> str:
    return f"groundskeeper/reclaim/{params.tableName}/{params.timeFieldName}/{segment}-of-{params.segments}"


__all__ = ["EndpointError", "KeyValueCursor", "ParamsError", "cursor_key", "endpoint_url", "make_writer"]
