"""The AgendaProgress HTTP endpoint writer (``docs/reclaim.md``, "HTTP writer"). No request follows a
redirect, and every message built from an answer goes through :func:`redact`."""

import base64
import dataclasses
import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from pipelines.common.aws_batches import conditional_write, error_code
from pipelines.common.http import NO_REDIRECTS, Redirected, leaves_its_path, location
from pipelines.reclaim.decide import QUEUE, RETRY, Decision
from pipelines.reclaim.params import ParamsError, ReclaimParams, check_url
from pipelines.reclaim.source import FAILED, WAITING, Candidate, parse_events
from pipelines.reclaim.writers import (
    DONE,
    RACED,
    DynamoWriter,
    ItemError,
    Outcome,
    apply_each,
    progress_update,
    ready_put,
)
from pipelines.retry import ATTEMPT_ID_ATTR

TIMEOUT_SECONDS = 15
BEARER_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")  # RFC 6750's b64token: nothing a header could break on


class EndpointError(RuntimeError):
    """The endpoint or the identity service cannot be used at all (fails the run, one line)."""


@dataclass(frozen=True)
class Secret:
    """A string that never shows itself in logs, reprs or the UI (``Secret()``); read it as ``.value``."""

    value: str = field(repr=False)


def redact(text: str, secrets: list[Secret]) -> str:
    """``text`` with every secret value replaced by ``***`` (before it is cut, so no prefix is left)."""
    for secret in secrets:
        if secret.value:
            text = text.replace(secret.value, "***")
    return text


def decrypt_password(kms, encrypted_b64: str) -> Secret:
    """``IDM_ENCRYPTED_PASS``: base64-decode, then KMS-decrypt."""
    try:
        blob = base64.b64decode(encrypted_b64.strip(), validate=True)
    except ValueError:  # binascii.Error
        raise EndpointError("IDM_ENCRYPTED_PASS is not valid base64") from None
    try:
        plaintext = kms.decrypt(CiphertextBlob=blob)["Plaintext"]
    except Exception as exc:  # botocore errors carry no secret, but keep the message short
        raise EndpointError(f"KMS could not decrypt IDM_ENCRYPTED_PASS ({error_code(exc)})") from None
    return Secret(plaintext.decode("utf-8"))


def _request(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body, default=str).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with NO_REDIRECTS.open(req, timeout=TIMEOUT_SECONDS) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            raise Redirected(exc.code, exc.headers.get("Location")) from None
        status, raw = exc.code, exc.read()
    except OSError as exc:  # URLError too
        reason = getattr(exc, "reason", exc)
        raise EndpointError(f"cannot reach {method} {location(url)}: {reason}") from None
    try:
        return status, json.loads(raw) if raw else None
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        return status, None


def login(identity_url: str, username: str, password: Secret) -> Secret:
    """The bearer token of the identity adapter (an assumed protocol: ``docs/reclaim.md``, "HTTP writer")."""
    try:
        status, body = _request("POST", identity_url, {"username": username, "password": password.value})
    except Redirected as exc:
        raise EndpointError(
            f"identity login at {location(identity_url)} answered HTTP {exc.status}, a redirect to "
            f"{redact(exc.where, [password])}: not followed (the password goes to IDENTITY_URL only)"
        ) from None
    token = body.get("token") if isinstance(body, dict) else None
    if status != 200 or not isinstance(token, str) or not token:
        raise EndpointError(f"identity login at {location(identity_url)} as {username!r} failed (HTTP {status})")
    if not BEARER_TOKEN.fullmatch(token):  # a header would refuse it, and show it in the error
        raise EndpointError(f"identity login at {location(identity_url)} answered a token that is not a bearer token")
    return Secret(token)


UNANSWERED_IN_A_ROW = 3
"""Item calls of one method (GET, PUT) in a row with no answer that end the pass: the endpoint is down."""


class AgendaProgressEndpoint:
    """GET / PUT one AgendaProgress; logs in lazily and once more on HTTP 401."""

    def __init__(self, url: str, authenticate: Callable[[], Secret]) -> None:
        self.url = url.rstrip("/")
        self._authenticate = authenticate
        self._token: Secret | None = None
        self._secrets: list[Secret] = []  # every token of this run, and the password once decrypted
        self._unanswered = {"GET": 0, "PUT": 0}  # item calls of each method in a row that got no answer

    def remember(self, secret: Secret) -> Secret:
        """Redact ``secret`` from every message built from now on; returns it."""
        self._secrets.append(secret)
        return secret

    def _call(self, method: str, item_id: str, body: Any = None) -> dict[str, Any]:
        segment = quote(item_id, safe="")  # keeps dots, and a server or proxy may decode it again
        if not (item_id.isascii() and item_id.isprintable()) or leaves_its_path(segment):
            raise ItemError(
                f"{method} {item_id[:80]!r}: not sent, this id would name a path outside {location(self.url)}"
            )
        url = f"{self.url}/{segment}"
        for _ in range(2):  # a second try after a fresh login
            if self._token is None:
                self._token = self.remember(self._authenticate())
            try:
                status, answer = _request(method, url, body, {"Authorization": f"Bearer {self._token.value}"})
            except Redirected as exc:
                raise ItemError(
                    f"{method} {item_id}: HTTP {exc.status}, a redirect to {redact(exc.where, self._secrets)}: "
                    "not followed (the bearer token goes to the endpoint URL only)"
                ) from None
            except EndpointError as exc:  # no answer (timeout, reset): this item's error, the pass goes on,
                self._unanswered[method] += 1  # unless the endpoint is down (each call waits out its timeout)
                if self._unanswered[method] >= UNANSWERED_IN_A_ROW:
                    raise EndpointError(
                        f"{exc} ({UNANSWERED_IN_A_ROW} {method} calls in a row got no answer)"
                    ) from None
                raise ItemError(str(exc)) from None
            self._unanswered[method] = 0
            if status != 401:
                break
            self._token = None  # expired: log in again, once
        if status == 401:
            raise EndpointError(f"{method} {location(self.url)}/...: HTTP 401 after a fresh login")
        if status != 200 or not isinstance(answer, dict):
            raise ItemError(f"{method} {item_id}: HTTP {status}")
        if error := answer.get("errorResponse"):
            detail = error.get("message") or error.get("code") if isinstance(error, dict) else error
            raise ItemError(
                f"{method} {item_id}: errorResponse on HTTP 200: {redact(str(detail), self._secrets)[:200]}"
            )
        return answer

    def get(self, item_id: str) -> dict[str, Any] | None:
        """The AgendaProgress the endpoint has, None when it has none; an answer of another shape is an item error."""
        found = self._call("GET", item_id).get("all")
        if found is None or found == []:
            return None
        if not isinstance(found, list) or not isinstance(found[0], dict):
            kind = f"a list of {type(found[0]).__name__}" if isinstance(found, list) else type(found).__name__
            raise ItemError(f"GET {item_id}: HTTP 200 with 'all' {kind}, not a list of AgendaProgress objects")
        return found[0]

    def put(self, item_id: str, partial: dict[str, Any]) -> dict[str, Any]:
        return self._call("PUT", item_id, partial)


def _plain_time(attr: dict[str, Any]) -> Any:
    if "N" in attr:
        number = float(attr["N"])
        return int(number) if number.is_integer() else number
    return next(iter(attr.values()), None)


class HttpWriter:
    """Applies decisions through the endpoint: GET, check what the scan saw, then PUT a partial object;
    a retry's ReadyAgenda item goes to DynamoDB first (``docs/reclaim.md``, "HTTP writer")."""

    def __init__(self, endpoint: AgendaProgressEndpoint, params: ReclaimParams, *, dynamodb, ready_table=None):
        self.endpoint = endpoint
        self.params = params
        self.dynamodb = dynamodb
        self.ready_table = ready_table

    def _unchanged(self, c: Candidate, current: dict[str, Any], cutoff: int) -> bool:
        if current.get(ATTEMPT_ID_ATTR) != c.attempt_id:
            return False  # the fence: a retry superseded the attempt the scan saw
        if c.kind == "held":
            return current.get("processingState") == WAITING and current.get("retryAt") == _plain_time(c.retry_at_attr)
        seen = current.get(self.params.timeFieldName)
        if current.get("processingState") != c.state or seen != _plain_time(c.time_attr):
            return False
        if c.kind == "failed":
            return current.get("processingStateMessage") == FAILED and not current.get("retryDecision")
        return not isinstance(seen, int | float) or seen < cutoff

    def apply_many(self, pairs: list[tuple[Candidate, Decision]], *, now: int, cutoff: int) -> list[Outcome]:
        return apply_each(self, pairs, now=now, cutoff=cutoff)  # the endpoint has no batch write

    def apply(self, c: Candidate, d: Decision, *, now: int, cutoff: int) -> str:
        current = self.endpoint.get(c.id)
        if current is None:
            raise ItemError(f"GET {c.id}: not found at the endpoint")
        if not self._unchanged(c, current, cutoff):
            return RACED
        put = ready_put(self.ready_table, self.params.tableName, c, d, now) if d.kind in (RETRY, QUEUE) else None
        if d.kind == RETRY and conditional_write(lambda: self.dynamodb.put_item(**put)) is None:
            current = self.endpoint.get(c.id)  # refused: this attempt is queued already
            if current is None or not self._unchanged(c, current, cutoff):
                return RACED  # the pass that queued it wrote the endpoint
            d = self._queued_attempt(c, d, put)  # that pass died before its PUT
        body = progress_update(c, d, self.params, now=now, cutoff=cutoff).plain()
        if "diagnosticEvents" in body:  # a list, the event appended to those the endpoint has now
            body["diagnosticEvents"] = parse_events(current.get("diagnosticEvents") or []) + [d.event]
        if d.kind == QUEUE:  # the body removes retryAt and sets the time to now, as the DynamoDB update does
            conditional_write(lambda: self.dynamodb.put_item(**put))  # idempotent: a repeated put is refused
        self.endpoint.put(c.id, body)
        return DONE

    def _queued_attempt(self, c: Candidate, d: Decision, put: dict[str, Any]) -> Decision:
        """``d`` with the ``attemptId`` of the ReadyAgenda item already queued for its attempt."""
        key = {"id": put["Item"]["id"]}
        queued = self.dynamodb.get_item(TableName=put["TableName"], Key=key, ConsistentRead=True).get("Item")
        attempt_id = (queued or {}).get(ATTEMPT_ID_ATTR, {}).get("S")
        if not attempt_id:
            raise ItemError(f"{c.id}: retry attempt {d.attempt} is queued without a readable attemptId")
        event = {**d.event, "payload": {**d.event["payload"], ATTEMPT_ID_ATTR: attempt_id}}
        return dataclasses.replace(d, attempt_id=attempt_id, event=event)


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


def endpoint_url(params: ReclaimParams, agenda) -> str | None:
    """``agendaProgressEndpointURL`` wins over ``AGENDA_PROGRESS_URL``; None = write to DynamoDB. Which URLs
    a run config may name: ``docs/reclaim.md``, "HTTP writer". ``agenda``: the settings resource, or its like."""
    configured = check_url("AGENDA_PROGRESS_URL", agenda.progress_url) if agenda.progress_url else None
    if not params.agendaProgressEndpointURL:
        return configured
    url = check_url("agendaProgressEndpointURL", params.agendaProgressEndpointURL)
    prefixes = [
        check_url("AGENDA_PROGRESS_ALLOWED_URLS", p)
        for p in (agenda.progress_allowed_urls or "").split(",")
        if p.strip()
    ]
    if url != configured and not url_allowed(url, prefixes):
        raise ParamsError(
            f"agendaProgressEndpointURL {location(url)} is not an endpoint this deployment names: it must be "
            "AGENDA_PROGRESS_URL or under a prefix in AGENDA_PROGRESS_ALLOWED_URLS (the bearer token goes to it)"
        )
    return url


def make_writer(params: ReclaimParams, *, dynamodb, kms, agenda, grouped_writes=False) -> DynamoWriter | HttpWriter:
    """The endpoint's writer when the run (or the deployment) names one, else DynamoDB's."""
    url = endpoint_url(params, agenda)
    if url is None:
        return DynamoWriter(dynamodb, params, ready_table=agenda.ready_table, grouped=grouped_writes)
    user, encrypted = agenda.idm_user, agenda.idm_encrypted_pass
    login_settings = {"IDENTITY_URL": agenda.identity_url, "IDM_USER": user, "IDM_ENCRYPTED_PASS": encrypted}
    if missing := [name for name, value in login_settings.items() if not value]:
        raise EndpointError(
            f"the AgendaProgress endpoint {location(url)} needs {', '.join(missing)} in the environment"
        )
    identity_url = check_url("IDENTITY_URL", agenda.identity_url, query=True)

    def authenticate():
        return login(identity_url, user, endpoint_client.remember(decrypt_password(kms, encrypted)))

    endpoint_client = AgendaProgressEndpoint(url, authenticate)
    return HttpWriter(endpoint_client, params, dynamodb=dynamodb, ready_table=agenda.ready_table)
