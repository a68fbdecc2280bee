"""A local webhook receiver for the alerting tests: a real HTTP server on 127.0.0.1 that answers a
chosen status a chosen number of times (then 200), or a redirect, and records what it was sent."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Receiver:
    url: str
    failures: list[int] = field(default_factory=list)  # statuses to answer first, one per request
    redirect_to: str | None = None
    received: list[dict] = field(default_factory=list)  # bodies it answered 2xx to
    requests: int = 0


@contextmanager
def webhook_receiver(path: str = "/services/T000/B000/secret-token") -> Iterator[Receiver]:
    receiver = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            receiver.requests += 1
            if receiver.redirect_to:
                self.send_response(302)
                self.send_header("Location", receiver.redirect_to)
                self.end_headers()
                return
            status = receiver.failures.pop(0) if receiver.failures else 200
            if status < 300:
                receiver.received.append(json.loads(body))
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
