"""What one ``TransactWriteItems`` of 100 job updates costs moto, by the shape of the update.

The termination drain's per-message time against the fair loop's (``benchmarks/whole_run.py``)
is mostly moto answering the 20 transactions of a 2,000-message drain. Both send 100 conditional
updates per transaction; the drain's update is larger: 9 ``SET`` clauses (the message's fields, the
round id and the message digest that make a redelivery idempotent, ``started_at`` through
``if_not_exists``), a 3-part condition (the job exists and is still running) and
``ReturnValuesOnConditionCheckFailure``; the fair loop's (``fleet.job_update``) has 6 ``SET`` clauses
and a 2-part condition. moto parses and validates each update on its own, so its time grows with
the expression; DynamoDB's does not in any way a client sees.

Each round seeds 100 running jobs per shape, submits one transaction of 100 updates per shape (the
order alternating), times it, and verifies that every job is final afterwards.

    PYTHONPATH=. .venv/bin/python benchmarks/transaction_shapes.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

import boto3

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import fleet  # noqa: E402
import moto_server  # noqa: E402

from infra.deploy import wait_for_endpoint  # noqa: E402
from pipelines.fleet.messages import parse_termination  # noqa: E402
from pipelines.fleet.termination import _Job, _update  # noqa: E402

TABLE = "jobs"


def bodies(tag: str, now: str) -> list[dict]:
    return [
        {
            "instance_id": f"i-{n:08x}",
            "job_id": f"{tag}-{n}",
            "status": "success",
            "exit_code": 0,
            "duration_seconds": 100,
            "started_at": now,
            "completed_at": now,
            "error": "",
        }
        for n in range(100)
    ]


def updates(shape: str, batch: list[dict]) -> list[dict]:
    if shape == "fair":
        return [{"Update": {"TableName": TABLE, **fleet.job_update(b)}} for b in batch]
    received = dt.datetime.now(dt.UTC)
    return [
        _update(
            TABLE,
            "round-1",
            _Job(term=parse_termination(json.dumps(b), received_at=received), digest="d" * 16, messages=[]),
        )
        for b in batch
    ]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    proc, endpoint = moto_server.start(("transactions", "sqs-retention", "hot-paths"))
    try:
        wait_for_endpoint(endpoint, timeout_seconds=120)
        ddb = boto3.client(
            "dynamodb", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
        )
        ddb.create_table(
            TableName=TABLE,
            KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        times: dict[str, list[float]] = {"fair": [], "drain": []}
        for rnd in range(args.rounds):
            for shape in ("fair", "drain") if rnd % 2 == 0 else ("drain", "fair"):
                batch = bodies(f"{shape}{rnd}", now)
                for b in batch:
                    ddb.put_item(TableName=TABLE, Item={"job_id": {"S": b["job_id"]}, "status": {"S": "running"}})
                items = updates(shape, batch)
                started = time.perf_counter()
                ddb.transact_write_items(TransactItems=items)
                times[shape].append(time.perf_counter() - started)
                for b in batch:
                    item = ddb.get_item(TableName=TABLE, Key={"job_id": {"S": b["job_id"]}})["Item"]
                    if item["status"]["S"] != "completed":
                        print(f"FAILED: {shape} left {b['job_id']} {item['status']['S']}")
                        return 1
        print(f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}; {args.rounds} rounds, verified")
        print("| update shape | s min | s median | s max (one TransactWriteItems of 100) |")
        print("|---|---:|---:|---:|")
        for shape, label in (
            ("fair", "fair loop (6 SET, 2-part condition)"),
            ("drain", "drain (9 SET, 3-part condition)"),
        ):
            ts = times[shape]
            print(f"| {label} | {min(ts):.3f} | {statistics.median(ts):.3f} | {max(ts):.3f} |")
        print(f"drain / fair (medians): {statistics.median(times['drain']) / statistics.median(times['fair']):.2f}")
        return 0
    finally:
        moto_server.stop(proc)


if __name__ == "__main__":
    raise SystemExit(main())
