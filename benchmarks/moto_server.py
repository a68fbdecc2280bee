"""A moto server for the benchmarks, on 127.0.0.1 and a free port, optionally with performance patches.

The patches change how long moto takes, never what an API does:

- ``transactions``: moto's ``TransactWriteItems`` deep-copies the whole table once per item of the
  transaction, to roll back on failure (moto/dynamodb/models/__init__.py, ``original_table_state``).
  The copies are all taken before any write, so one copy per table per transaction is the same
  backup; the patch memoizes it. Without it a transaction costs O(items x table size), which real
  DynamoDB does not, and a 10,000-job table makes every write take seconds.
- ``sqs-retention``: moto's ``ReceiveMessage`` checks each message it returns against the queue's
  retention period by computing *every* queue attribute (``get_queue_attributes``), approximate
  counts included, which scans the whole queue: a receive of 10 scans it 30 times. With the patch
  the check reads the retention period alone (same check). Without it, a receive from a
  10,000-message queue takes seconds.
- ``ec2-tags``: moto looks up an EC2 resource's tags by scanning every tag of the account
  (``describe_tags`` with a ``resource-id`` filter), once per instance it launches, filters or
  describes: quadratic in the number of instances, hours for 10,000 on a 2-core machine. With the
  patch each resource reads its own tags from moto's tag dict directly (same result, same order).
- ``count-calls``: not a performance patch: counts every API request the server answers, by
  service and operation (``X-Amz-Target``, the query ``Action``, the CBOR path, or the S3 method),
  so that calls made in other processes (a ``dagster job execute`` run, a daemon's run worker) are
  counted too. ``GET /_bench/calls`` returns the counts as JSON, ``POST /_bench/calls`` resets them.
  ``/moto-api/`` requests are not counted.

    python benchmarks/moto_server.py --port 5099 --patch transactions   # serve until killed
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ("transactions", "sqs-retention", "ec2-tags", "count-calls")


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    """Stop a server started here: SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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


def patch_sqs_retention() -> None:
    from moto.core.utils import unix_time
    from moto.sqs.models import SQSBackend

    def is_message_valid_based_on_retention_period(self, queue_name, message) -> bool:
        retention_period = int(self.get_queue(queue_name).message_retention_period)
        return retention_period + message.sent_timestamp / 1000 > unix_time()

    SQSBackend.is_message_valid_based_on_retention_period = is_message_valid_based_on_retention_period


def patch_ec2_tags() -> None:
    from moto.ec2.models.core import TaggedEC2Resource
    from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix

    def get_tags(self) -> list[dict[str, str]]:
        if not self.id:
            return []
        resource_type = EC2_PREFIX_TO_RESOURCE.get(get_prefix(self.id), "")
        own = self.ec2_backend.tags.get(self.id, {})
        return [{"resource_id": self.id, "key": k, "value": v, "resource_type": resource_type} for k, v in own.items()]

    TaggedEC2Resource.get_tags = get_tags


def _operation(environ) -> str:
    """``service.Operation`` of one request, from what every protocol botocore speaks carries."""
    import re
    from urllib.parse import parse_qs

    auth = environ.get("HTTP_AUTHORIZATION", "")
    scope = re.search(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/", auth)
    service = scope.group(1) if scope else "?"
    target = environ.get("HTTP_X_AMZ_TARGET")
    if target:
        return f"{service}.{target.rsplit('.', 1)[-1]}"
    path = environ.get("PATH_INFO", "")
    if "/operation/" in path:  # smithy rpc-v2-cbor (CloudWatch)
        return f"{service}.{path.rsplit('/', 1)[-1]}"
    action = parse_qs(environ.get("QUERY_STRING", "")).get("Action")
    if action:
        return f"{service}.{action[0]}"
    if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        import io

        environ["wsgi.input"] = io.BytesIO(body)  # put the body back for moto
        action = parse_qs(body.decode("utf-8", "replace")).get("Action")
        if action:
            return f"{service}.{action[0]}"
    return f"{service}.{environ.get('REQUEST_METHOD', '?')}"


def patch_count_calls() -> None:
    import json
    import threading
    from collections import Counter

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    counts: Counter = Counter()
    lock = threading.Lock()
    original = DomainDispatcherApplication.__call__

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/_bench/calls":
            with lock:
                body = json.dumps(dict(counts)).encode()
                if environ.get("REQUEST_METHOD") == "POST":
                    counts.clear()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        if not path.startswith("/moto-api"):
            operation = _operation(environ)
            with lock:
                counts[operation] += 1
        return original(self, environ, start_response)

    DomainDispatcherApplication.__call__ = __call__


def calls(endpoint: str, *, reset: bool = False) -> dict[str, int]:
    """The counts of a server started with the ``count-calls`` patch (and reset them if asked)."""
    import json
    import urllib.request

    request = urllib.request.Request(f"{endpoint}/_bench/calls", method="POST" if reset else "GET")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def serve(port: int, patches: list[str]) -> None:
    from moto.server import main as moto_main

    for name in patches:
        patch = {
            "transactions": patch_transactions,
            "sqs-retention": patch_sqs_retention,
            "ec2-tags": patch_ec2_tags,
            "count-calls": patch_count_calls,
        }
        patch[name]()
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
