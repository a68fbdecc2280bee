"""A local AgendaProgress HTTP endpoint plus identity service, for local development, the tests
and the reclaim benchmark.

It has the endpoint's semantics (``docs/contracts.md``) over a DynamoDB AgendaProgress table:

- ``POST /login`` with ``{"username", "password"}`` answers ``{"token"}`` (401 on a wrong password);
- ``GET /progress/{id}`` and ``PUT /progress/{id}`` (partial merge; ``null`` removes an attribute)
  need ``Authorization: Bearer <token>`` and answer ``{"all", "count", "errorResponse"}``;
- ids in ``error_ids`` get HTTP 200 with an ``errorResponse`` (a processing error); with
  ``echo_auth`` set, that error echoes the request's ``Authorization`` header, as a careless
  endpoint might (the tests check the token never reaches a log);
- a method in ``redirects`` (``"GET"``, ``"PUT"`` or ``"POST"``) is answered with that redirect:
  ``(status, base)`` sends ``Location: base + path`` (the tests check no credential follows it).

Local use only (never started in production); it binds 127.0.0.1 (``make dev`` on
``AGENDA_ENDPOINT_PORT``, default 5056; the tests on a free port). The password is the one given,
or a new random one for each endpoint (``.password``): there is no password in the code.
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import unquote

from infra.local_server import LocalServer
from pipelines.common import from_item, to_item

JSON_ATTRS = ("diagnosticEvents",)  # stored as JSON text in the table, sent as JSON in the API


def encrypt_password(kms, password: str) -> str:
    """``IDM_ENCRYPTED_PASS`` for ``password``: base64 of its ciphertext under a new KMS key."""
    key_id = kms.create_key(Description="groundskeeper local identity password")["KeyMetadata"]["KeyId"]
    blob = kms.encrypt(KeyId=key_id, Plaintext=password.encode())["CiphertextBlob"]
    return base64.b64encode(blob).decode()


class LocalAgendaEndpoint(LocalServer):
    def __init__(self, dynamodb, table: str, *, id_field: str = "id", username: str = "reclaimer",
                 password: str | None = None, port: int = 0) -> None:  # fmt: skip
        self.dynamodb = dynamodb
        self.table = table
        self.id_field = id_field
        self.username = username
        self.password = password or secrets.token_urlsafe(18)
        self.tokens: set[str] = set()
        self.error_ids: set[str] = set()
        self.echo_auth = False
        self.redirects: dict[str, tuple[int, str]] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path), for assertions and counting
        self.seen_auth: list[str] = []
        self._lock = threading.Lock()
        self._serve(self._handler(), port)

    @property
    def identity_url(self) -> str:
        return f"{self.base}/login"

    @property
    def progress_url(self) -> str:
        return f"{self.base}/progress"

    def deployment_env(self, kms) -> dict[str, str]:
        """The variables that make reclaim write through this endpoint: its URL, the identity
        service, the user and the password encrypted with a new KMS key (base64, as
        ``IDM_ENCRYPTED_PASS`` is in production; ``kms`` is the local, moto, KMS)."""
        return {
            "AGENDA_PROGRESS_URL": self.progress_url,
            "IDENTITY_URL": self.identity_url,
            "IDM_USER": self.username,
            "IDM_ENCRYPTED_PASS": encrypt_password(kms, self.password),
        }

    # ------------------------------------------------------------------ storage
    def _load(self, item_id: str) -> dict[str, Any] | None:
        item = self.dynamodb.get_item(
            TableName=self.table, Key={self.id_field: {"S": item_id}}, ConsistentRead=True
        ).get("Item")
        if item is None:
            return None
        plain = from_item(item)
        for name in JSON_ATTRS:
            if isinstance(plain.get(name), str):
                try:
                    plain[name] = json.loads(plain[name])
                except ValueError:
                    pass
        return plain

    def _store(self, plain: dict[str, Any]) -> None:
        stored = {k: (json.dumps(v) if k in JSON_ATTRS and not isinstance(v, str) else v) for k, v in plain.items()}
        self.dynamodb.put_item(TableName=self.table, Item=to_item(stored))

    # ------------------------------------------------------------------ HTTP
    def _handler(self):
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, status: int, body: Any) -> None:
                raw = json.dumps(body, default=str).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _redirected(self, method: str) -> bool:
                """Answers the redirect configured for ``method``, if any (the request is recorded)."""
                if method not in endpoint.redirects:
                    return False
                endpoint.requests.append((method, self.path))
                self.rfile.read(int(self.headers.get("Content-Length") or 0))  # read before answering
                status, base = endpoint.redirects[method]
                self.send_response(status)
                self.send_header("Location", base.rstrip("/") + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return True

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    return json.loads(self.rfile.read(length) or b"null")
                except ValueError:
                    return None

            def _authorized(self) -> bool:
                header = self.headers.get("Authorization", "")
                endpoint.seen_auth.append(header)
                return header.startswith("Bearer ") and header[7:] in endpoint.tokens

            def _answer(self, found: list, error: Any = None) -> None:
                self._send(200, {"all": found, "count": len(found), "errorResponse": error})

            def do_POST(self) -> None:  # noqa: N802
                if self._redirected("POST"):
                    return
                endpoint.requests.append(("POST", self.path))
                body = self._body() or {}
                if self.path != "/login":
                    return self._send(404, {"errorResponse": {"message": "no such path"}})
                if body.get("username") != endpoint.username or body.get("password") != endpoint.password:
                    return self._send(401, {"errorResponse": {"message": "bad credentials"}})
                token = secrets.token_hex(16)
                endpoint.tokens.add(token)
                self._send(200, {"token": token})

            def _item_id(self, method: str) -> str | None:
                """The id of an authorized /progress/{id} call; None once an error was sent."""
                endpoint.requests.append((method, self.path))
                prefix = "/progress/"
                if not self.path.startswith(prefix):
                    self._send(404, {"errorResponse": {"message": "no such path"}})
                    return None
                if not self._authorized():
                    self._send(401, {"errorResponse": {"message": "unauthorized"}})
                    return None
                return unquote(self.path[len(prefix) :])

            def do_GET(self) -> None:  # noqa: N802
                if self._redirected("GET"):
                    return
                item_id = self._item_id("GET")
                if item_id is not None:
                    found = endpoint._load(item_id)
                    self._answer([found] if found else [])

            def do_PUT(self) -> None:  # noqa: N802
                if self._redirected("PUT"):
                    return
                item_id = self._item_id("PUT")
                if item_id is None:
                    return
                if item_id in endpoint.error_ids:
                    echo = (
                        f" (request had Authorization: {self.headers.get('Authorization')})"
                        if endpoint.echo_auth
                        else ""
                    )
                    return self._answer([], {"code": "ProcessingError", "message": f"cannot update {item_id}{echo}"})
                partial = self._body()
                if not isinstance(partial, dict):
                    return self._send(400, {"errorResponse": {"message": "body must be a JSON object"}})
                with endpoint._lock:
                    current = endpoint._load(item_id) or {endpoint.id_field: item_id}
                    for key, value in partial.items():
                        if key == endpoint.id_field:
                            continue
                        if value is None:
                            current.pop(key, None)
                        else:
                            current[key] = value
                    endpoint._store(current)
                self._answer([current])

        return Handler
