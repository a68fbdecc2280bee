"""A counting HTTP proxy in front of an AWS-compatible endpoint (DynamoDB Local), for the benchmarks.

Every request is forwarded unchanged to ``--target`` and counted by its operation (the
``X-Amz-Target`` header of a JSON-protocol service such as DynamoDB: ``BatchExecuteStatement``...).
The counts answer at ``/_bench/calls`` as moto_server.py's ``count-calls`` patch does (``GET`` reads
them, ``POST`` reads and resets them), so the calls of CLI and daemon runs, which happen in
subprocesses, are counted too. It runs in its own process, so it takes no CPU from the caller.

    python benchmarks/counting_proxy.py --target http://127.0.0.1:8000 --port 8001
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def serve(target: str, port: int) -> None:
    parsed = urlparse(target)
    counts: Counter = Counter()
    lock = threading.Lock()
    local = threading.local()

    def upstream() -> http.client.HTTPConnection:
        """A kept-alive connection to the target, one per handler thread, without Nagle's delay."""
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=300)
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # The status line and headers go out in one write (end_headers) and the body in another: with
        # Nagle's algorithm on, the body then waits for the client's delayed ACK (about 40 ms a call).
        disable_nagle_algorithm = True

        def log_message(self, *args) -> None:
            pass

        def _counts(self, reset: bool) -> None:
            with lock:
                body = json.dumps(dict(counts)).encode()
                if reset:
                    counts.clear()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _forward(self) -> None:
            if self.path == "/_bench/calls":
                self._counts(reset=self.command == "POST")
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            operation = (self.headers.get("X-Amz-Target") or self.command).rsplit(".", 1)[-1]
            with lock:
                counts[operation] += 1
            if getattr(local, "conn", None) is None:
                local.conn = upstream()
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            try:
                local.conn.request(self.command, self.path, body=body, headers=headers)
                response = local.conn.getresponse()
            except (OSError, http.client.HTTPException):
                local.conn.close()
                local.conn = upstream()
                local.conn.request(self.command, self.path, body=body, headers=headers)
                response = local.conn.getresponse()
            data = response.read()
            self.send_response(response.status)
            for key, value in response.getheaders():
                if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _forward

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print(f"counting proxy on http://127.0.0.1:{port} -> {target}", flush=True)
    server.serve_forever()


def start(target: str) -> tuple[subprocess.Popen, str]:
    """Start a proxy process in front of ``target``; returns it and its endpoint (wait for it to answer)."""
    from moto_server import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--target", target, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    serve(args.target, args.port)
