"""The local HTTP servers' common part (the AgendaProgress endpoint, the alerts receiver): a threaded
server on 127.0.0.1 that serves while its ``with`` block lasts. Local use only."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

POLL_SECONDS = 0.02


class LocalServer:
    def _serve(self, handler: type[BaseHTTPRequestHandler], port: int) -> None:
        """Bind 127.0.0.1:``port`` (0: a free port); serving starts with the ``with`` block."""
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._server.daemon_threads = True
        # serve_forever notices shutdown() at its next poll: a short poll stops the server at once
        # instead of up to half a second later (an idle poll costs next to nothing)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(POLL_SECONDS,), daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
