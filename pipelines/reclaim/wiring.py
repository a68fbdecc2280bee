"""Builds the writer a run uses (DynamoDB or the HTTP endpoint) and keeps the scan cursor. No Dagster."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pipelines.common.http import leaves_its_path, location
from pipelines.reclaim.http import AgendaProgressEndpoint, EndpointError, HttpWriter, decrypt_password, login
from pipelines.reclaim.params import ParamsError, ReclaimParams, check_url
from pipelines.reclaim.writers import DynamoWriter


@dataclass(frozen=True)
class EndpointSettings:
    """The AgendaProgress HTTP endpoint and its identity login (from the ``agenda`` settings resource)."""

    progress_url: str | None = None
    identity_url: str | None = None
    idm_user: str | None = None
    idm_encrypted_pass: str | None = None
    progress_allowed_urls: str | None = None  # comma-separated URL prefixes a run config may name


def url_allowed(url: str, prefixes: list[str]) -> bool:
    """True when ``url`` has a prefix's scheme, host and port and a path at or below its path
    (``https://a.example/p`` allows ``/p/x``, never ``/px``); a path that ``leaves_its_path`` never is."""
    target = urlsplit(url)
    if leaves_its_path(target.path):
        return False
    for prefix in prefixes:
        allowed = urlsplit(prefix)
        if (target.scheme, target.netloc.lower()) != (allowed.scheme, allowed.netloc.lower()):
            continue
        base = allowed.path.rstrip("/")
        if target.path.rstrip("/") == base or target.path.startswith(base + "/"):
            return True
    return False


def endpoint_url(params: ReclaimParams, endpoint: EndpointSettings) -> str | None:
    """``agendaProgressEndpointURL`` wins over ``AGENDA_PROGRESS_URL``; None = write to DynamoDB. The bearer
    token goes to it, so a run config may name only ``AGENDA_PROGRESS_URL`` or a URL under a prefix in
    ``AGENDA_PROGRESS_ALLOWED_URLS``; anything else is refused before any request."""
    configured = check_url("AGENDA_PROGRESS_URL", endpoint.progress_url) if endpoint.progress_url else None
    if not params.agendaProgressEndpointURL:
        return configured
    url = check_url("agendaProgressEndpointURL", params.agendaProgressEndpointURL)
    prefixes = [
        check_url("AGENDA_PROGRESS_ALLOWED_URLS", p)
        for p in (endpoint.progress_allowed_urls or "").split(",")
        if p.strip()
    ]
    if not url_allowed(url, prefixes + ([configured] if configured else [])):
        raise ParamsError(
            f"agendaProgressEndpointURL {location(url)} is not an endpoint this deployment names: it must be "
            "AGENDA_PROGRESS_URL or under a prefix in AGENDA_PROGRESS_ALLOWED_URLS (the bearer token goes to it)"
        )
    return url


def make_writer(
    params: ReclaimParams,
    *,
    dynamodb,
    kms,
    ready_table: str | None,
    endpoint: EndpointSettings,
    grouped_writes: bool = False,
) -> DynamoWriter | HttpWriter:
    """The endpoint's writer when the run (or the deployment) names one, else DynamoDB's (``grouped_writes``:
    fail, close and hold updates go 25 to a ``BatchExecuteStatement``)."""
    url = endpoint_url(params, endpoint)
    if url is None:
        return DynamoWriter(
            dynamodb,
            table=params.tableName,
            time_field=params.timeFieldName,
            ready_table=ready_table,
            action=params.reclaimAction,
            grouped=grouped_writes,
        )
    user, encrypted = endpoint.idm_user, endpoint.idm_encrypted_pass
    login_settings = {"IDENTITY_URL": endpoint.identity_url, "IDM_USER": user, "IDM_ENCRYPTED_PASS": encrypted}
    missing = [name for name, value in login_settings.items() if not value]
    if missing:
        raise EndpointError(
            f"the AgendaProgress endpoint {location(url)} needs {', '.join(missing)} in the environment"
        )
    identity_url = check_url("IDENTITY_URL", endpoint.identity_url, query=True)

    def authenticate():
        return login(identity_url, user, endpoint_client.remember(decrypt_password(kms, encrypted)))

    endpoint_client = AgendaProgressEndpoint(url, authenticate)
    return HttpWriter(
        endpoint_client,
        time_field=params.timeFieldName,
        action=params.reclaimAction,
        table=params.tableName,
        dynamodb=dynamodb,
        ready_table=ready_table,
    )


def write_mode(grouped: bool) -> str:
    """How the DynamoDB writer writes, for the run log's plan line."""
    if grouped:
        return "grouped writes (up to 25 conditional updates per BatchExecuteStatement)"
    return "one conditional UpdateItem per item (DYNAMODB_GROUPED_WRITES off)"


class KeyValueCursor:
    """The scan position of one (table, segment), kept in the Dagster instance's cursor values."""

    def __init__(self, storage: Any, params: ReclaimParams, segment: int) -> None:
        self.storage = storage
        self.key = f"groundskeeper/reclaim/{params.tableName}/{params.timeFieldName}/{segment}-of-{params.segments}"

    def load(self) -> dict[str, Any] | None:
        try:
            text = self.storage.get_cursor_values({self.key}).get(self.key)
            return json.loads(text) if text else None
        except ValueError:
            return None  # an unreadable cursor restarts the pass; it never fails the run

    def save(self, key: dict[str, Any] | None) -> None:
        self.storage.set_cursor_values({self.key: json.dumps(key, sort_keys=True) if key else ""})
