"""A local alerts webhook receiver: what would have paged someone, for ``make dev`` and the tests.

It takes Slack-compatible webhook POSTs (``{"text": ..., <the alert's fields>}``) on any path,
prints one line per alert (``ALERT <text> | <its page in the UI> | runbook <URL>``) to ``out``, lists
every alert received on its page (``GET /``, newest first: when, state, severity, key, the alert and
its links) and serves the runbooks, ``docs/runbooks/<kind>.md``, under ``GET /runbooks/``
(``runbooks``: the base URL ``make dev`` gives as ``ALERTS_RUNBOOK_BASE_URL``). For the tests it can
answer chosen statuses first (``failures``: one per request, then
200) or a redirect (``redirect_to``), and counts every request.

Local use only; it binds 127.0.0.1 (``make dev`` on ``ALERTS_RECEIVER_PORT``, default 5057; the
tests on a free port).
"""

from __future__ import annotations

import html
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, TextIO

from infra.local_server import LocalServer

RUNBOOKS_DIR = Path(__file__).resolve().parent.parent / "docs" / "runbooks"
_RUNBOOK = re.compile(r"^/runbooks/([a-z_]+\.md)$")


def alert_line(alert: dict[str, Any]) -> str:
    """The terminal's line for one alert: its text, then its links."""
    links = [str(alert[name]) for name in ("url",) if alert.get(name)]
    if alert.get("runbook"):
        links.append(f"runbook {alert['runbook']}")
    return " | ".join([f"ALERT {alert.get('text', '')}", *links])


def _link(href: Any, label: str) -> str:
    if not href:
        return ""
    text = html.escape(str(href))
    if str(href).startswith(("http://", "https://")):
        return f'<a href="{text}">{label}</a> '
    return f"{label}: {text} "


class LocalAlertsReceiver(LocalServer):
    def __init__(self, port: int = 0, *, path: str = "/hook", out: TextIO | None = None) -> None:
        self.failures: list[int] = []  # statuses to answer first, one per request
        self.redirect_to: str | None = None
        self.received: list[dict[str, Any]] = []  # the alerts it answered 2xx to
        self.requests = 0
        self._out = out
        self._serve(self._handler(), port)
        self.url = f"{self.base}{path}"
        self.page = f"{self.base}/"
        self.runbooks = f"{self.base}/runbooks"

    def _page(self) -> bytes:
        cells = ("last_seen", "state", "severity", "alert_key", "text")
        rows = "".join(
            "<tr>"
            + "".join(f"<td>{html.escape(str(a.get(name) or ''))}</td>" for name in cells)
            + f"<td>{_link(a.get('url'), 'open in Dagster')}{_link(a.get('runbook'), 'runbook')}</td></tr>"
            for a in reversed(self.received)  # newest first
        )
        return (
            "<!doctype html><title>Alerts (local)</title><h1>What would have paged someone</h1>"
            "<table><tr><th>when</th><th>state</th><th>severity</th><th>key</th><th>alert</th><th>links</th></tr>"
            f"{rows}</table>"
        ).encode()

    @staticmethod
    def _runbook(path: str) -> bytes | None:
        found = _RUNBOOK.match(path.split("?", 1)[0])
        if not found or not (RUNBOOKS_DIR / found.group(1)).is_file():
            return None
        return (RUNBOOKS_DIR / found.group(1)).read_bytes()

    def _handler(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: bytes = b"", kind: str = "text/plain") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path.startswith("/runbooks/"):
                    runbook = receiver._runbook(self.path)
                    if runbook is None:
                        self._answer(404, b"no such runbook")
                    else:
                        self._answer(200, runbook, "text/markdown; charset=utf-8")
                    return
                self._answer(200, receiver._page(), "text/html; charset=utf-8")

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests += 1
                if receiver.redirect_to:
                    self.send_response(302)
                    self.send_header("Location", receiver.redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = receiver.failures.pop(0) if receiver.failures else 200
                if status >= 300:
                    self._answer(status, b"failing on purpose")
                    return
                try:
                    alert = json.loads(body)
                except ValueError:
                    self._answer(400, b"not JSON")
                    return
                receiver.received.append(alert)
                if receiver._out is not None:
                    print(alert_line(alert), file=receiver._out, flush=True)
                self._answer(200, b"ok")

            def log_message(self, *args):
                pass

        return Handler


def subscribe_inbox(sns, sqs, topic_arn: str, queue_name: str) -> str:
    """An SQS queue subscribed to the alerts topic with raw delivery (each message body is the
    alert's JSON): what the topic's subscribers would get. Returns its URL."""
    url = sqs.create_queue(QueueName=queue_name)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"})
    return url


if __name__ == "__main__":  # a receiver on its own: python -m infra.alerts_receiver [port]
    with LocalAlertsReceiver(int(sys.argv[1]) if len(sys.argv) > 1 else 5057, out=sys.stdout) as running:
        print(f"alerts receiver: POST {running.url}, page {running.page}", flush=True)
        threading.Event().wait()
