"""Reclaim benchmark (POP's agenda reclaimer): a 100,000-item AgendaProgress table, 1% stale, in a local moto server.

Three ways to fail the same 1,000 stale items, measured in the same run, each ``--repeat`` times
in rotating order (``benchmarks/trials.py``; the stale items are put back before every run):

- baseline, the original Lambda's way: a filtered scan, then a GET and a PUT per item over HTTP
  (against the local AgendaProgress endpoint, ``infra.agenda_endpoint``);
- the scan path: the same scan, then one conditional UpdateItem per item (``reclaim_pass``);
- the index path: a query on ``processingState-updatedTime-index``, then one UpdateItem per item.

For each: wall time, reclaimed items per second, API calls per reclaimed item (AWS calls counted
with a botocore ``before-call`` hook, plus HTTP calls) and items read per reclaimed item
(DynamoDB's ScannedCount). After each path the benchmark checks its work: every stale item is read
back (BatchGetItem) and must be COMPLETE / failed; the figures divide by the items verified
reclaimed, and a path that left any stale item behind fails the benchmark (exit status 1).
``--break`` makes every 20th write of each path (UpdateItem, PutItem behind the HTTP endpoint)
return success without reaching the server (``benchmarks/breaking.py``): the benchmark must fail.

Then peak RSS of a fresh subprocess reclaiming a 10,000-item table and
the 100,000-item table through the scan path: memory is bounded by a page and a batch, not the table.

Then the writes, on DynamoDB Local (``infra/dynamodb_local.py``; moto ignores PartiQL conditions):
the index path with one conditional UpdateItem per item (the baseline) beside the same path with
its updates grouped 25 to a ``BatchExecuteStatement`` (``--local-items``, ``--local-stale-percent``),
each verified the same way.

    .venv/bin/python benchmarks/reclaim.py [--items 100000] [--small 10000] [--stale-percent 1] [--break]
        [--only moto|dynamodb-local]

moto's Scan costs O(table) per page (it walks the items to the start key), so small pages are
quadratic in moto though not in DynamoDB: the benchmark pages with ``--scan-limit 1000`` (the
largest ``objectScanLimit``) for every path, baseline included.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
import breaking  # noqa: E402
import moto_server  # noqa: E402
import trials  # noqa: E402

from infra import dynamodb_local  # noqa: E402
from infra.agenda_endpoint import LocalAgendaEndpoint  # noqa: E402
from infra.deploy import deploy, wait_for_endpoint  # noqa: E402
from pipelines.reclaim.engine import SegmentPlan, reclaim_pass  # noqa: E402
from pipelines.reclaim.params import parse_params  # noqa: E402
from pipelines.reclaim.source import TableInfo, inspect_table  # noqa: E402
from pipelines.reclaim.writers import DynamoWriter  # noqa: E402

REGION = "us-east-1"
DAY_MS = 86_400_000
INDEX = "processingState-updatedTime-index"


class CallCounter:
    """Counts AWS API calls made through the clients it is attached to."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def attach(self, client) -> None:
        client.meta.events.register("before-call", self._count)

    def _count(self, model, **_) -> None:
        self.calls[model.name] = self.calls.get(model.name, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def client(endpoint: str, service: str = "dynamodb"):
    return boto3.client(service, endpoint_url=endpoint, region_name=REGION)


def create_table(ddb, name: str) -> None:
    ddb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": "id", "AttributeType": "S"},
            {"AttributeName": "processingState", "AttributeType": "S"},
            {"AttributeName": "updatedTime", "AttributeType": "N"},
        ],
        BillingMode="PAY_PER_REQUEST",
        GlobalSecondaryIndexes=[
            {
                "IndexName": INDEX,
                "KeySchema": [
                    {"AttributeName": "processingState", "KeyType": "HASH"},
                    {"AttributeName": "updatedTime", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
    )


def row(n: int, now: int, stale_every: int) -> dict:
    """Item n: every ``stale_every``-th is stale EXECUTING; the rest fresh EXECUTING, WAITING or COMPLETE."""
    if n % stale_every == 0:
        state, message, age = "EXECUTING", None, 2 * DAY_MS + n
    else:
        state, message, age = [
            ("EXECUTING", None, 30_000),
            ("WAITING", "pending", 3 * DAY_MS),
            *[("COMPLETE", "succeeded", 5 * DAY_MS)] * 8,
        ][n % 10]
    item = {
        "id": {"S": f"agenda-{n:07d}"},
        "processingState": {"S": state},
        "updatedTime": {"N": str(now - age)},
        "addedTime": {"N": str(now - age - 1000)},
        "attemptsCompleted": {"N": "0"},
        "agendaId": {"S": f"agenda-{n % 50}"},
        "customerId": {"S": f"cust-{n % 5}"},
        "diagnosticEvents": {"S": "[]"},
        "params": {"S": "{}"},
    }
    if message:
        item["processingStateMessage"] = {"S": message}
    return item


def batch_write(endpoint: str, table: str, items: list[dict], threads: int = 2) -> None:
    def worker(part: list[dict]) -> None:
        ddb = client(endpoint)
        for start in range(0, len(part), 25):
            request = {table: [{"PutRequest": {"Item": i}} for i in part[start : start + 25]]}
            while request:
                request = ddb.batch_write_item(RequestItems=request).get("UnprocessedItems") or None

    chunk = (len(items) + threads - 1) // threads
    workers = [threading.Thread(target=worker, args=(items[i : i + chunk],)) for i in range(0, len(items), chunk)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def load(endpoint: str, table: str, count: int, stale_every: int) -> int:
    create_table(client(endpoint), table)
    now = int(time.time() * 1000)
    start = time.perf_counter()
    for first in range(0, count, 20_000):  # in slices: memory stays small on the client side too
        batch_write(endpoint, table, [row(n, now, stale_every) for n in range(first, min(count, first + 20_000))])
    print(f"  loaded {count:,} items into {table} in {time.perf_counter() - start:.0f}s", flush=True)
    return len(range(0, count, stale_every))


def reset_stale(endpoint: str, table: str, count: int, stale_every: int) -> None:
    """Put the stale items back (BatchWriteItem), so that every path reclaims the same set."""
    now = int(time.time() * 1000)
    batch_write(endpoint, table, [row(n, now, stale_every) for n in range(0, count, stale_every)])


def verify(endpoint: str, table: str, count: int, stale_every: int) -> tuple[int, list[str]]:
    """(stale items verified reclaimed, problems): every stale item read back must be COMPLETE / failed."""
    ddb = client(endpoint)
    ids = [row(n, 0, stale_every)["id"] for n in range(0, count, stale_every)]
    states: dict[str, tuple[str, str]] = {}
    for start in range(0, len(ids), 100):
        request = {table: {"Keys": [{"id": i} for i in ids[start : start + 100]], "ConsistentRead": True}}
        while request:
            page = ddb.batch_get_item(RequestItems=request)
            for item in page["Responses"].get(table, []):
                states[item["id"]["S"]] = (
                    item["processingState"]["S"],
                    item.get("processingStateMessage", {}).get("S", ""),
                )
            request = page.get("UnprocessedKeys") or None
    done = sum(1 for state in states.values() if state == ("COMPLETE", "failed"))
    problems = [f"{len(ids) - done} of {len(ids)} stale items not reclaimed"] if done != len(ids) else []
    return done, problems


def params_for(table: str, scan_limit: int):
    return parse_params(
        {
            "tableName": table,
            "idFieldName": "id",
            "timeFieldName": "updatedTime",
            "reclaimAgeMinutes": 24 * 60,
            "objectScanLimit": scan_limit,
            "targetBatchSize": 50,
            "maximumExecutionSeconds": 3600,
        }
    )


class QuietLog:
    def info(self, msg) -> None:
        if "page(s)" in msg:
            print(f"    {msg}", flush=True)

    def warning(self, msg) -> None:
        print(f"    WARNING {msg}", flush=True)

    error = warning


def run_ours(endpoint: str, table: str, scan_limit: int, use_index: bool, grouped: bool = False) -> dict:
    ddb = client(endpoint)
    counter = CallCounter()
    counter.attach(ddb)
    params = params_for(table, scan_limit)
    start = time.perf_counter()
    info = inspect_table(ddb, params)
    if not use_index:
        info = TableInfo(table=info.table, key_attrs=info.key_attrs, index=None)
    writer = DynamoWriter(ddb, params, grouped=grouped)
    counts = reclaim_pass(ddb, SegmentPlan(params, 0, time.time() + 3600, info), writer, log=QuietLog())
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "reclaimed": counts.reclaimed,
        "raced": counts.raced,
        "read": counts.scanned,
        "calls": counter.total,
        "call_detail": dict(counter.calls),
    }


def run_baseline(endpoint: str, table: str, scan_limit: int) -> dict:
    """The original Lambda: filtered scan, then GET + PUT per item over HTTP (no condition)."""
    from pipelines.reclaim.http import AgendaProgressEndpoint, Secret, login

    ddb = client(endpoint)
    counter = CallCounter()
    counter.attach(ddb)
    backend = client(endpoint)
    backend_counter = CallCounter()
    backend_counter.attach(backend)
    with LocalAgendaEndpoint(backend, table) as server:
        api = AgendaProgressEndpoint(
            server.progress_url, lambda: login(server.identity_url, server.username, Secret(server.password))
        )
        start = time.perf_counter()
        cutoff = int(time.time() * 1000) - DAY_MS
        kwargs = {
            "TableName": table,
            "Limit": scan_limit,
            "FilterExpression": "processingState = :e AND updatedTime < :cutoff",
            "ExpressionAttributeValues": {":e": {"S": "EXECUTING"}, ":cutoff": {"N": str(cutoff)}},
        }
        read = reclaimed = 0
        while True:
            page = ddb.scan(**kwargs)
            read += page["ScannedCount"]
            for item in page["Items"]:
                item_id = item["id"]["S"]
                current = api.get(item_id)
                events = json.loads(current.get("diagnosticEvents") or "[]") if isinstance(
                    current.get("diagnosticEvents"), str) else current.get("diagnosticEvents") or []  # fmt: skip
                now = int(time.time() * 1000)
                events.append({"message": "AgendaProgress timed out.", "time": now})
                api.put(item_id, {"processingState": "COMPLETE", "processingStateMessage": "failed",
                                  "updatedTime": now, "completedTime": now, "diagnosticEvents": events})  # fmt: skip
                reclaimed += 1
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        seconds = time.perf_counter() - start
        http_calls = len([r for r in server.requests if r[0] in ("GET", "PUT", "POST")])
    return {
        "seconds": seconds,
        "reclaimed": reclaimed,
        "raced": 0,
        "read": read,
        "calls": counter.total + http_calls,
        "call_detail": {**counter.calls, "HTTP GET/PUT/login": http_calls},
        "backend_calls": backend_counter.total,
    }


def child_memory(endpoint: str, table: str, scan_limit: int) -> None:
    """Subprocess mode: reclaim ``table`` through the scan path and print peak RSS (KiB) as JSON."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run_ours(endpoint, table, scan_limit, use_index=False)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"rss_before_kib": before, "peak_rss_kib": peak, **result}))


def measure_memory(endpoint: str, table: str, scan_limit: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", endpoint, table, "--scan-limit", str(scan_limit)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "AWS_ENDPOINT_URL": endpoint},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


LABELS = {
    "baseline": "baseline: scan + HTTP GET + PUT per item",
    "scan": "scan path (conditional UpdateItem)",
    "index": "index path (query GSI + conditional UpdateItem)",
    "single": "index path, conditional UpdateItem per item (baseline)",
    "grouped": "index path, grouped: BatchExecuteStatement of 25",
}


def checked(endpoint: str, table: str, count: int, stale_every: int, broken: bool, path) -> trials.Run:
    """Put the stale items back, run one path (broken if asked), then verify its work."""
    reset_stale(endpoint, table, count, stale_every)
    undo = breaking.install("UpdateItem,PutItem,TransactWriteItems,BatchExecuteStatement") if broken else None
    try:
        result = path()
    finally:
        if undo:
            undo()
    verified, problems = verify(endpoint, table, count, stale_every)
    if result["reclaimed"] != verified:
        problems.append(f"the path reported {result['reclaimed']:,} reclaimed")
    return trials.Run(
        seconds=result["seconds"],
        done=verified,
        problems=problems,
        calls=result["calls"],
        detail=result["call_detail"],
        extra={"read": result["read"], "backend_calls": result.get("backend_calls")},
    )


def read_lines(results: dict[str, list[trials.Run]]) -> list[str]:
    out = []
    for name, runs in results.items():
        reads = sorted({round(r.extra["read"] / max(r.done, 1), 2) for r in runs})
        out.append(
            f"- {name}: items read per reclaimed {', '.join(f'{x:.2f}' for x in reads)}; calls: {runs[0].detail}"
            + (
                f"; behind the HTTP API {runs[0].extra['backend_calls']:,} DynamoDB calls"
                if runs[0].extra.get("backend_calls")
                else ""
            )  # fmt: skip
        )
    return out


def run_moto(args, stale_every: int) -> tuple[dict, dict, dict, int, int]:
    moto, endpoint = moto_server.start()  # plain moto
    try:
        wait_for_endpoint(endpoint, timeout_seconds=300)
        deploy(client(endpoint, "cloudformation"))  # the real template: its table and index definitions
        print(f"moto on {endpoint}; loading tables ...", flush=True)
        big, small = "bench-agendas-big", "bench-agendas-small"
        stale = load(endpoint, big, args.items, stale_every)
        small_stale = load(endpoint, small, args.small, stale_every)
        check = (endpoint, big, args.items, stale_every, args.broken)
        paths = {
            "baseline": lambda: run_baseline(endpoint, big, args.scan_limit),
            "scan": lambda: run_ours(endpoint, big, args.scan_limit, use_index=False),
            "index": lambda: run_ours(endpoint, big, args.scan_limit, use_index=True),
        }
        results = trials.interleaved(list(paths), args.repeat, lambda name, _r: checked(*check, paths[name]),
                                     label="moto ")  # fmt: skip
        reset_stale(endpoint, big, args.items, stale_every)
        print("memory: subprocesses through the scan path ...", flush=True)
        mem = {"small": measure_memory(endpoint, small, args.scan_limit),
               "big": measure_memory(endpoint, big, args.scan_limit)}  # fmt: skip
    finally:
        moto_server.stop(moto)
    return results, mem["small"], mem["big"], stale, small_stale


def print_moto(args, results: dict, mem_small: dict, mem_big: dict, stale: int, small_stale: int) -> None:
    print()
    print(f"moto: {args.items:,} items, {stale:,} stale ({args.stale_percent:g}%), page limit {args.scan_limit}")
    print("\n".join(trials.table(results, baseline="baseline", unit="reclaimed", labels=LABELS)))
    print("\n".join(read_lines(results)))
    index = results["index"]
    read_ok = all(r.extra["read"] / max(r.done, 1) <= 1.1 for r in index)
    calls_ok = all(r.calls / max(r.done, 1) <= 1.2 for r in index)
    print(f"index path targets: read per reclaimed <= 1.1: {'met' if read_ok else 'NOT met'}; "
          f"calls per reclaimed <= 1.2: {'met' if calls_ok else 'NOT met'}")  # fmt: skip
    print()
    print("| scan-path subprocess | table items | stale reclaimed | RSS after imports MiB | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|")
    for label, count, m in (("small", args.small, mem_small), ("big", args.items, mem_big)):
        print(f"| {label} | {count:,} | {m['reclaimed']:,} | {m['rss_before_kib'] / 1024:.1f} | "
              f"{m['peak_rss_kib'] / 1024:.1f} |")  # fmt: skip
    ratio = mem_big["peak_rss_kib"] / mem_small["peak_rss_kib"]
    print(f"peak RSS ratio big/small: {ratio:.3f} ({'about equal' if ratio < 1.1 else 'NOT about equal'})")
    print(f"(small table stale items: {small_stale:,})")


def run_dynamodb_local(args) -> dict:
    """The index path's writes on DynamoDB Local: one UpdateItem per item against grouped statements."""
    stale_every = round(100 / args.local_stale_percent)
    table = "bench-agendas-local"
    with dynamodb_local.running() as endpoint:
        print(f"DynamoDB Local on {endpoint}; loading ...", flush=True)
        stale = load(endpoint, table, args.local_items, stale_every)
        check = (endpoint, table, args.local_items, stale_every, args.broken)
        paths = {
            "single": lambda: run_ours(endpoint, table, args.scan_limit, use_index=True),
            "grouped": lambda: run_ours(endpoint, table, args.scan_limit, use_index=True, grouped=True),
        }
        results = trials.interleaved(list(paths), args.local_repeat, lambda name, _r: checked(*check, paths[name]),
                                     label="DynamoDB Local ")  # fmt: skip
    print()
    print(f"DynamoDB Local 1.25.1: {args.local_items:,} items, {stale:,} stale ({args.local_stale_percent:g}%), "
          f"page limit {args.scan_limit}")  # fmt: skip
    print("\n".join(trials.table(results, baseline="single", unit="reclaimed", labels=LABELS)))
    print("\n".join(read_lines(results)))
    if trials.all_ok(results):
        writes = {n: sum(v for k, v in runs[0].detail.items() if k in ("UpdateItem", "BatchExecuteStatement"))
                  / runs[0].done for n, runs in results.items()}  # fmt: skip
        speed = trials.spread(trials.ratios(results, "grouped", "single"))
        print(f"grouped vs per item: {speed.fmt()}x the throughput (median (range) over rounds); write calls per "
              f"reclaimed {writes['grouped']:.3f} vs {writes['single']:.3f}")  # fmt: skip
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--stale-percent", type=float, default=1.0)
    parser.add_argument("--scan-limit", type=int, default=1000)
    parser.add_argument("--break", dest="broken", action="store_true", help="lose some writes: must fail")
    parser.add_argument("--local-items", type=int, default=20_000, help="DynamoDB Local table size")
    parser.add_argument("--local-stale-percent", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the moto paths (order rotates)")
    parser.add_argument("--local-repeat", type=int, default=5, help="rounds of the DynamoDB Local paths")
    parser.add_argument("--only", choices=("moto", "dynamodb-local"), help="run one of the two parts")
    parser.add_argument("--child", nargs=2, metavar=("ENDPOINT", "TABLE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    if args.child:
        child_memory(args.child[0], args.child[1], args.scan_limit)
        return 0

    print(trials.machine_line("reclaim.py"), flush=True)
    results: dict = {}
    if args.only in (None, "moto"):
        moto_results, mem_small, mem_big, stale, small_stale = run_moto(args, round(100 / args.stale_percent))
        print_moto(args, moto_results, mem_small, mem_big, stale, small_stale)
        results.update(moto_results)
    if args.only in (None, "dynamodb-local"):
        results.update({f"dynamodb-local {k}": v for k, v in run_dynamodb_local(args).items()})
    print(trials.after_line())
    failed = [name for name, runs in results.items() if not trials.ok(runs)]
    if failed:
        print(f"\nRECLAIM BENCHMARK FAILED: {', '.join(failed)} left stale items behind (see the check column).")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
