"""A moto server for the benchmarks, on 127.0.0.1 and a free port, optionally with performance patches.

The patches change how long moto takes, never what an API does:

- ``transactions``: moto's ``TransactWriteItems`` deep-copies the whole table once per item of the
  transaction, to roll back on failure (moto/dynamodb/models/__init__.py, ``original_table_state``).
  The copies are all taken before any write, so one copy per table per transaction is the same
  backup; the patch memoizes it. Without it a transaction costs O(items x table size), which real
  DynamoDB does not, and a 10,000-job table makes every write take seconds.

    python benchmarks/moto_server.py --port 5099 --patch transactions   # serve until killed
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ("transactions",)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def patch_transactions() -> None:
    import copy
    import threading

    import moto.dynamodb.models as models
    from moto.dynamodb.models.table import Table

    local = threading.local()

    class _CopyOncePerTransaction:
        def deepcopy(self, obj, memo=None):
            cache = getattr(local, "cache", None)
            if cache is None or not isinstance(obj, Table):
                return copy.deepcopy(obj, memo)
            if id(obj) not in cache:
                cache[id(obj)] = copy.deepcopy(obj, memo)
            return cache[id(obj)]

        def __getattr__(self, name):
            return getattr(copy, name)

    models.copy = _CopyOncePerTransaction()
    original = models.DynamoDBBackend.transact_write_items

    def transact_write_items(self, transact_items):
        local.cache = {}
        try:
            return original(self, transact_items)
        finally:
            local.cache = None

    models.DynamoDBBackend.transact_write_items = transact_write_items


def serve(port: int, patches: list[str]) -> None:
    from moto.server import main as moto_main

    for name in patches:
        {"transactions": patch_transactions}[name]()
    moto_main(["-H", "127.0.0.1", "-p", str(port)])


def start(patches: tuple[str, ...] = (), log=subprocess.DEVNULL) -> tuple[subprocess.Popen, str]:
    """Start a server in a subprocess. Returns (process, endpoint); wait with infra.deploy.wait_for_endpoint."""
    port = free_port()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--port", str(port)]
    for name in patches:
        cmd += ["--patch", name]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), f"http://127.0.0.1:{port}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--patch", action="append", choices=PATCHES, default=[])
    args = parser.parse_args()
    serve(args.port, args.patch)
