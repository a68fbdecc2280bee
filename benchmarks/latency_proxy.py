"""A TCP proxy that adds network latency in front of an HTTP endpoint (the benchmarks' moto server).

Each request waits ``--latency-ms`` before it is passed on, as a round trip to a real AWS region
would make it wait (15 ms is about one from a machine in the same region's neighbourhood). The
proxy works on bytes, not on HTTP: every client connection gets its own connection to the target
and two threads (one each way), so keep-alive connections stay open and concurrent requests wait
concurrently, each on its own connection. A request is recognised as the first bytes a client
sends after the target's last answer on that connection (or after connecting): those bytes wait,
the rest of the request follows at once. (A request with ``Expect: 100-continue``, as boto3 sends
for S3 uploads, waits twice: once for its headers and once for its body, as it would on a network.)

It runs in its own process, so its threads do not compete with the caller's for one GIL.

    python benchmarks/latency_proxy.py --target http://127.0.0.1:5055 --port 5099 --latency-ms 15
"""

from __future__ import annotations

import argparse
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

CHUNK = 1 << 16


def serve(target: str, port: int, latency_ms: float) -> None:
    parsed = urlparse(target)
    upstream_address = (parsed.hostname, parsed.port)
    delay = latency_ms / 1000

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            client: socket.socket = self.request
            try:
                upstream = socket.create_connection(upstream_address)
            except OSError:
                return
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            answered = threading.Event()  # set: the next bytes from the client begin a new request
            answered.set()

            def answers() -> None:
                try:
                    while data := upstream.recv(CHUNK):
                        # acknowledge at once: a server that writes its headers and body apart (moto)
                        # would otherwise wait for the delayed ACK (40 ms) before sending the body
                        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
                        answered.set()
                        client.sendall(data)
                except OSError:
                    pass
                finally:
                    for sock in (client, upstream):
                        try:
                            sock.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass

            back = threading.Thread(target=answers, daemon=True)
            back.start()
            try:
                while data := client.recv(CHUNK):
                    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
                    if answered.is_set():
                        answered.clear()
                        time.sleep(delay)
                    upstream.sendall(data)
            except OSError:
                pass
            finally:
                try:
                    upstream.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                back.join()
                upstream.close()

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 256

    with Server(("127.0.0.1", port), Handler) as server:
        print(f"latency proxy on http://127.0.0.1:{port} -> {target} (+{latency_ms:g} ms a request)", flush=True)
        server.serve_forever()


def start(target: str, latency_ms: float, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start a proxy process in front of ``target``; returns it and its endpoint (wait for it to answer)."""
    if port is None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--target", target, "--port", str(port)]
    cmd += ["--latency-ms", str(latency_ms)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), f"http://127.0.0.1:{port}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency-ms", type=float, default=15)
    args = parser.parse_args()
    serve(args.target, args.port, args.latency_ms)
