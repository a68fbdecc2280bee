"""A moto server for the benchmarks, on 127.0.0.1 and a free port, optionally with performance patches.

The patches change how long moto takes, never what an API does:

- ``transactions``: moto's ``TransactWriteItems`` deep-copies every table it writes, whole, to roll
  back on failure (moto/dynamodb/models/__init__.py, ``original_table_state``), and a rollback puts
  the copies back in place of the tables. With the patch it backs up only the items the
  transaction writes and a rollback restores those: the same all-or-nothing answer, without a cost
  that grows with the table (a 10,000-job table makes every write take seconds), and without
  moto's rollback undoing other requests' writes made to the table meanwhile (DynamoDB does not).
- ``sqs-retention``: moto's ``ReceiveMessage`` checks each message it returns against the queue's
  retention period by computing *every* queue attribute (``get_queue_attributes``), approximate
  counts included, which scans the whole queue: a receive of 10 scans it 30 times. With the patch
  the check reads the retention period alone (same check). Without it, a receive from a
  10,000-message queue takes seconds.
- ``sqs-deletes``: moto's ``DeleteMessage`` rebuilds the queue's message list without the queue's
  lock, so two deletes at once (two drains of one queue) can each write back a list that still
  holds the other's message: a deleted message comes back after its visibility timeout, which SQS
  never does. With the patch a delete holds the queue's own lock (the one ``SendMessage`` takes).
- ``hot-paths``: two costs of moto's own that a receive or any request pays: every ``ReceiveMessage``
  asks each message of the queue whether it is visible and whether it is delayed, and each asks
  the clock through ``datetime`` objects (``unix_time_millis``); with the patch SQS's models read
  ``time.time()`` (the same milliseconds). And every request lists moto's package directory from
  disk to route it (``list_of_moto_modules``); with the patch the list is read once. And every
  ``SendMessage`` computes all the queue's attributes, counting its messages three times, to read
  one (``ContentBasedDeduplication``); with the patch a send skips the counts. And DynamoDB's
  update expressions: moto validates each by walking its syntax tree about ten times, asking at
  every node, through ``isinstance`` against abstract classes, which of the walker's node classes
  it is (and ``find_clauses`` likewise); a transaction of 100 updates of nine attributes spends
  about a third of its CPU there. With the patch the answer is looked up by the node's class, once
  per walker and node class (the same node processed by the same function, in the same order).
  And each update expression is parsed twice per item (once to check its names and values, once to
  apply it); with the patch a parse is kept by the expression's text (moto's validation works on a
  deep copy of it, so the kept tree is never changed; an expression that does not parse is
  refused as before, each time).
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ("transactions", "sqs-retention", "sqs-deletes", "hot-paths", "ec2-tags", "count-calls")


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
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table

    local = threading.local()

    class _NoTableCopy:
        """moto's ``copy`` module, except that inside a patched transaction a table "copied" for the
        rollback is the table itself: the items the transaction touches are backed up instead."""

        def deepcopy(self, obj, memo=None):
            if getattr(local, "active", False) and isinstance(obj, Table):
                return obj
            return copy.deepcopy(obj, memo)

        def __getattr__(self, name):
            return getattr(copy, name)

    models.copy = _NoTableCopy()
    original = models.DynamoDBBackend.transact_write_items

    def backups(backend, transact_items) -> list | None:
        """(table, hash key, range key, copy of the item or None) of every item the transaction
        writes; None if one cannot be named (then moto's own path answers, whole-table copies and all)."""
        found = []
        try:
            for entry in transact_items:
                _, op = next(iter(entry.items()))
                table = backend.tables.get(op.get("TableName"))
                if table is None:
                    continue
                attrs = op.get("Key") or op.get("Item") or {}
                hash_key = DynamoType(attrs[table.hash_key_attr])
                range_key = DynamoType(attrs[table.range_key_attr]) if table.range_key_attr else None
                found.append((table, hash_key, range_key, copy.deepcopy(table.get_item(hash_key, range_key))))
        except Exception:
            return None
        return found

    def restore(saved: list) -> None:
        for table, hash_key, range_key, item in reversed(saved):
            if range_key is None:
                if item is None:
                    table.items.pop(hash_key, None)
                else:
                    table.items[hash_key] = item
            elif item is None:
                table.items.get(hash_key, {}).pop(range_key, None)
            else:
                table.items[hash_key][range_key] = item

    def transact_write_items(self, transact_items):
        saved = backups(self, transact_items)
        if saved is None:
            return original(self, transact_items)
        local.active = True
        try:
            return original(self, transact_items)
        except Exception:
            restore(saved)  # moto's own rollback put back the same table objects: a no-op
            raise
        finally:
            local.active = False

    models.DynamoDBBackend.transact_write_items = transact_write_items


def patch_sqs_retention() -> None:
    from moto.core.utils import unix_time
    from moto.sqs.models import SQSBackend

    def is_message_valid_based_on_retention_period(self, queue_name, message) -> bool:
        retention_period = int(self.get_queue(queue_name).message_retention_period)
        return retention_period + message.sent_timestamp / 1000 > unix_time()

    SQSBackend.is_message_valid_based_on_retention_period = is_message_valid_based_on_retention_period


def patch_sqs_deletes() -> None:
    from moto.sqs.models import Queue

    original = Queue.delete_message

    def delete_message(self, receipt_handle: str) -> None:
        with self._messages_lock:
            return original(self, receipt_handle)

    Queue.delete_message = delete_message


def _patch_dynamodb_expressions() -> None:
    """moto's walks of an update expression's syntax tree, with their class tests looked up by class."""
    from moto.dynamodb.parsing import ast_nodes

    Node, Traverser = ast_nodes.Node, ast_nodes.DepthFirstTraverser
    nested_kinds = (ast_nodes.Expression, ast_nodes.UpdateExpressionFunction)
    is_node: dict[type, bool] = {}
    nested: dict[type, bool] = {}
    processed_as: dict[tuple[type, type], type | None] = {}  # (walker class, node class) -> its map's key

    def node_class(kind: type) -> bool:
        found = is_node.get(kind)
        if found is None:
            found = is_node[kind] = issubclass(kind, Node)
        return found

    def key_for(walker: Traverser, node: Node) -> type | None:
        """The first class of the walker's processing map that ``node`` is an instance of (moto's
        ``process`` takes the first), or None (moto's ``nodes_to_be_processed`` test fails)."""
        cache_key = (type(walker), type(node))
        try:
            return processed_as[cache_key]
        except KeyError:
            found = next((kind for kind in walker._processing_map() if isinstance(node, kind)), None)
            processed_as[cache_key] = found
            return found

    original_traverse = Traverser.traverse_node_recursively

    def traverse_node_recursively(self, node, child_id=-1):
        if type(self).process is not Traverser.process or type(self).nodes_to_be_processed is not (
            Traverser.nodes_to_be_processed
        ):
            return original_traverse(self, node, child_id)  # a walker of its own kind: moto's path
        if node_class(type(node)):
            parent_node = node.parent
            if node.children is not None:
                for i, child_node in enumerate(node.children):
                    self.pre_processing_of_child(node, i)
                    traverse_node_recursively(self, child_node, i)
            key = key_for(self, node)
            if key is not None:
                node = self._processing_map()[key](node)
                node.parent = parent_node
                if parent_node:
                    parent_node.children[child_id] = node
        return node

    def find_clauses(self, clause_types):
        clauses = []
        for child in self.children or []:
            kind = type(child)
            if kind in clause_types:
                clauses.append(child)
            else:
                inner = nested.get(kind)
                if inner is None:
                    inner = nested[kind] = issubclass(kind, nested_kinds)
                if inner:
                    clauses.extend(child.find_clauses(clause_types))
        return clauses

    Traverser.traverse_node_recursively = traverse_node_recursively
    Node.find_clauses = find_clauses

    from moto.dynamodb.parsing.expressions import UpdateExpressionParser

    parse = UpdateExpressionParser.make.__func__
    parsed: dict[tuple[type, str], Any] = {}

    @classmethod
    def make(cls, expression_str):
        key = (cls, expression_str)
        tree = parsed.get(key)
        if tree is None:
            tree = parse(cls, expression_str)  # an error is raised, not kept
            if len(parsed) < 10_000:
                parsed[key] = tree
        return tree

    UpdateExpressionParser.make = make


def patch_hot_paths() -> None:
    import functools
    import threading
    import time

    import moto.backends as backends
    import moto.sqs.models as sqs_models

    original_millis = sqs_models.unix_time_millis

    def unix_time_millis(dt=None) -> float:
        return time.time() * 1000.0 if dt is None else original_millis(dt)

    sqs_models.unix_time_millis = unix_time_millis
    original_modules = backends.list_of_moto_modules
    backends.list_of_moto_modules = functools.cache(lambda: tuple(original_modules()))

    # SendMessage reads one queue attribute (ContentBasedDeduplication) through ``Queue.attributes``,
    # which also counts the queue's messages three times: while sending, those counts are not asked
    sending = threading.local()
    for name in ("messages", "messages_not_visible", "messages_delayed"):
        counted = getattr(sqs_models.Queue, f"approximate_number_of_{name}")

        def count(self, _counted=counted) -> int:
            return 0 if getattr(sending, "active", False) else _counted.fget(self)

        setattr(sqs_models.Queue, f"approximate_number_of_{name}", property(count))
    original_send = sqs_models.SQSBackend.send_message

    def send_message(self, *args, **kwargs):
        sending.active = True
        try:
            return original_send(self, *args, **kwargs)
        finally:
            sending.active = False

    sqs_models.SQSBackend.send_message = send_message
    _patch_dynamodb_expressions()


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
            "sqs-deletes": patch_sqs_deletes,
            "hot-paths": patch_hot_paths,
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
