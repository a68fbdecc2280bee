"""Batching benchmark (ReportStream): decider tick, batching, partitions. Prints its figures.

Starts its own moto server on 127.0.0.1, deploys the infra template, loads ``--receivers`` receivers
with ``--records`` pending records each, then measures, each beside a naive baseline in the same run:

- decider tick: ``decide`` (receivers scan + one COUNT query per due receiver) against a baseline
  that scans the records table to count pending records per receiver;
- batching: ``ReceiverBatcher`` (grouped locks, one query, S3 puts, grouped final updates) against
  a baseline that takes and finalizes each record with its own conditional ``UpdateItem``;
- partitions: how many (receiver, day) partitions 100 receivers make over a year, and the time to
  load the asset's partition status (all keys + materialized subset) from a Dagster instance.

Each part runs ``--repeat`` rounds, the variants in rotating order (``benchmarks/trials.py``); a
batching run starts on a fresh deployment holding only the receivers it batches.
API calls are counted with a botocore ``before-call`` hook. Both batching variants are checked:
every record of the receivers they batched must be finalized in the table (``batch_id`` set,
no longer pending) and appear exactly once in the outbox files; the figures divide by the records
verified batched, and a variant that left records behind fails the benchmark (exit status 1).
``--break`` makes the 2nd, 22nd, 42nd... write (``TransactWriteItems``, ``UpdateItem``) return
success without reaching the server (``benchmarks/breaking.py``): the benchmark must fail.

    .venv/bin/python benchmarks/batching.py [--receivers 100] [--records 1000] [--batch-receivers 5] [--break]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import boto3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import breaking  # noqa: E402
import moto_server  # noqa: E402
import trials  # noqa: E402
from bench_support import all_pages  # noqa: E402

from infra.deploy import deploy, wait_for_endpoint  # noqa: E402
from pipelines.batching.batcher import BatchSettings, ReceiverBatcher  # noqa: E402
from pipelines.batching.decider import decide  # noqa: E402
from pipelines.common import iso, to_item  # noqa: E402
from pipelines.common.aws_batches import chunks  # noqa: E402

UTC = dt.UTC
TICK = dt.datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
DAY = "2026-11-20"
MAX_BATCH_SIZE = 100


class CallCounter:
    def __init__(self, *clients):
        self.calls: Counter = Counter()
        for client in clients:
            client.meta.events.register("before-call", self._count)

    def _count(self, model, **_kwargs):
        self.calls[f"{model.service_model.service_name}.{model.name}"] += 1

    def total(self) -> int:
        return sum(self.calls.values())

    def reset(self) -> None:
        self.calls.clear()


def load(ddb, env, receivers: int, records: int, tick: dt.datetime = TICK) -> list[str]:
    names = [f"bench-{i:03d}" for i in range(receivers)]
    for name in names:
        ddb.put_item(
            TableName=env["RECEIVERS_TABLE"],
            Item=to_item(
                {
                    "receiver": name,
                    "number_per_day": 24,
                    "initial_time": "00:00",
                    "time_zone": "UTC",
                    "max_batch_size": MAX_BATCH_SIZE,
                    "send_if_empty_batch": False,
                    "batching_enabled": True,
                }
            ),
        )
    table = env["BATCH_RECORDS_TABLE"]
    payload = json.dumps({"kind": "order", "value": 12345, "note": "x" * 60})
    for name in names:
        items = [
            {
                "record_id": f"{name}-{n:05d}",
                "receiver": name,
                "created_at": iso(tick - dt.timedelta(seconds=3 + n * 3)),
                "payload": payload,
                "next_action": "BATCH",
                "pending_receiver": name,
            }
            for n in range(records)
        ]
        for start in range(0, len(items), 25):
            request = {table: [{"PutRequest": {"Item": to_item(i)}} for i in items[start : start + 25]]}
            while request:
                request = ddb.batch_write_item(RequestItems=request).get("UnprocessedItems") or None
    return names


def naive_decider(ddb, env) -> dict[str, int]:
    """Baseline: count pending records per receiver by scanning the records table."""
    counts: Counter = Counter()
    kwargs = {
        "TableName": env["BATCH_RECORDS_TABLE"],
        "FilterExpression": "next_action = :b AND created_at < :t",
        "ExpressionAttributeValues": {":b": {"S": "BATCH"}, ":t": {"S": iso(TICK)}},
        "ProjectionExpression": "receiver",
    }
    while True:
        page = ddb.scan(**kwargs)
        for item in page["Items"]:
            counts[item["receiver"]["S"]] += 1
        if "LastEvaluatedKey" not in page:
            return dict(counts)
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def naive_batch(ddb, s3, env, name: str, before: str = iso(TICK)) -> int:
    """Baseline: one conditional UpdateItem per record to lock, one per record to finalize."""
    from pipelines.batching import store

    items = [i for i in store.query_pending(ddb, env["BATCH_RECORDS_TABLE"], name) if i["created_at"] < before]
    done = 0
    for n, group in enumerate(chunks(items, MAX_BATCH_SIZE), start=1):
        batch = f"{name}/naive/{n}"
        mine = []
        for item in group:
            try:
                ddb.update_item(
                    TableName=env["BATCH_RECORDS_TABLE"],
                    Key={"record_id": {"S": item["record_id"]}},
                    UpdateExpression="SET batch_id = :b",
                    ConditionExpression="next_action = :n AND attribute_not_exists(batch_id)",
                    ExpressionAttributeValues={":b": {"S": batch}, ":n": {"S": "BATCH"}},
                )
                mine.append(item)
            except ddb.exceptions.ConditionalCheckFailedException:
                continue
        store.put_file(
            s3, env["BATCH_OUTBOX_BUCKET"], f"naive/{name}/{n}.jsonl", [store.record_line(i, batch) for i in mine]
        )
        for item in mine:
            ddb.update_item(
                TableName=env["BATCH_RECORDS_TABLE"],
                Key={"record_id": {"S": item["record_id"]}},
                UpdateExpression="REMOVE next_action, pending_receiver",
                ConditionExpression="batch_id = :b",
                ExpressionAttributeValues={":b": {"S": batch}},
            )
        done += len(mine)
    return done


def verify_batched(ddb, s3, env, names: list[str], records: int) -> tuple[int, list[str]]:
    """(records verified batched, problems) for the receivers ``names``: each record finalized in the
    table and present exactly once in the outbox files."""
    wanted = set(names)
    finalized: set[str] = set()
    pending = 0
    for page in all_pages(ddb.scan, TableName=env["BATCH_RECORDS_TABLE"], ConsistentRead=True):
        for item in page["Items"]:
            if item["receiver"]["S"] not in wanted:
                continue
            if "next_action" in item:
                pending += 1
            elif "batch_id" in item:
                finalized.add(item["record_id"]["S"])
    sent: Counter = Counter()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=env["BATCH_OUTBOX_BUCKET"]):
        for obj in page.get("Contents", []):
            if not obj["Key"].endswith(".jsonl"):
                continue
            body = s3.get_object(Bucket=env["BATCH_OUTBOX_BUCKET"], Key=obj["Key"])["Body"].read().decode()
            for line in body.splitlines():
                if line.strip() and json.loads(line)["receiver"] in wanted:
                    sent[json.loads(line)["record_id"]] += 1
    expected = records * len(names)
    done = len([r for r in finalized if sent[r] == 1])
    problems = []
    if pending:
        problems.append(f"{pending} records still pending")
    if len(finalized) != expected:
        problems.append(f"{len(finalized)} of {expected} records finalized")
    if sum(sent.values()) != expected or any(n != 1 for n in sent.values()):
        problems.append(f"{sum(sent.values())} lines for {len(sent)} records in the outbox files, expected {expected}")
    return done, problems


def partitions_benchmark(receivers: int) -> dict[str, float]:
    """Partition count over a year and the time to load the asset's partition status."""
    os.environ.setdefault("BATCH_PARTITIONS_START_DATE", (dt.date.today() - dt.timedelta(days=365)).isoformat())
    import dagster as dg

    from pipelines.batching.defs import batch_partitions, receiver_batches

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as home, dg.instance_for_test(temp_dir=home) as instance:
        names = [f"bench-{i:03d}" for i in range(receivers)]
        instance.add_dynamic_partitions("receivers", names)
        keys = batch_partitions.get_partition_keys(dynamic_partitions_store=instance)
        out["partitions"] = len(keys)
        # A month of materializations for every receiver, as the decider would leave behind.
        recent = [
            k for k in keys if k.keys_by_dimension["day"] >= (dt.date.today() - dt.timedelta(days=30)).isoformat()
        ]
        for key in recent:
            instance.report_runless_asset_event(dg.AssetMaterialization(receiver_batches.key, partition=key))
        out["materialized"] = len(recent)
        start = time.perf_counter()
        all_keys = batch_partitions.get_partition_keys(dynamic_partitions_store=instance)
        materialized = instance.get_materialized_partitions(receiver_batches.key)
        subset = batch_partitions.subset_with_partition_keys(materialized)
        missing = len(all_keys) - len(subset)
        out["status_load_s"] = time.perf_counter() - start
        out["missing"] = missing
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--receivers", type=int, default=100)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--batch-receivers", type=int, default=5, help="receivers batched by ReceiverBatcher")
    parser.add_argument("--naive-receivers", type=int, default=2, help="receivers batched by the baseline")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (the variants' order rotates each round)")
    parser.add_argument("--break", dest="broken", action="store_true", help="lose some writes: must fail")
    args = parser.parse_args()
    print(trials.machine_line("batching.py"), flush=True)
    failed = False
    # moto's TransactWriteItems copies the whole table once per item; the server copies it once
    # per transaction (same semantics, see benchmarks/moto_server.py).
    moto, endpoint = moto_server.start(("transactions",))
    try:
        wait_for_endpoint(endpoint, timeout_seconds=300)
        os.environ.update(
            {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
        )

        def client(name):
            return boto3.client(name, endpoint_url=endpoint, region_name="us-east-1")

        env = deploy(client("cloudformation"))
        ddb, s3 = client("dynamodb"), client("s3")
        start = time.perf_counter()
        names = load(ddb, env, args.receivers, args.records)
        print(
            f"loaded {args.receivers} receivers x {args.records} pending records in {time.perf_counter() - start:.1f}s"
        )
        counter = CallCounter(ddb, s3)

        # ---- decider tick (reads only: every round on the same table)
        def tick(variant: str, _round: int) -> trials.Run:
            counter.reset()
            started = time.perf_counter()
            if variant == "decide":
                tables = BatchSettings(env["RECEIVERS_TABLE"], env["BATCH_RECORDS_TABLE"], env["BATCH_OUTBOX_BUCKET"])
                decision = decide(ddb, tables, tick=TICK)
                counts = {d.receiver: d.pending for d in decision.due}
            else:
                counts = naive_decider(ddb, env)
            seconds = time.perf_counter() - started
            right = sum(1 for n in names if counts.get(n) == args.records)
            problems = [] if right == len(names) else [f"{len(names) - right} receivers not due with {args.records}"]
            return trials.Run(seconds, right, problems, calls=counter.total(), detail=dict(counter.calls))

        labels = {
            "naive": "baseline: scan the records table",
            "decide": "decide: scan receivers + a keys query per due",
        }
        ticks = trials.interleaved(["naive", "decide"], args.repeat, tick, label="decider tick / ")
        print("\n## decider tick (verified: every receiver due with all its pending records)")
        print("\n".join(trials.table(ticks, baseline="naive", unit="due receivers", labels=labels)))
        print("(calls per item: calls per due receiver)")

        # ---- batching: each run on a fresh deployment holding only the receivers it batches (moto's
        # transactions cost O(table size); real DynamoDB transactions do not depend on it).
        def batch(variant: str, _round: int) -> trials.Run:
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=60)
            env = deploy(client("cloudformation"))
            count = args.batch_receivers if variant == "ours" else args.naive_receivers
            names = load(ddb, env, count, args.records)
            settings = BatchSettings(
                receivers_table=env["RECEIVERS_TABLE"],
                records_table=env["BATCH_RECORDS_TABLE"],
                outbox_bucket=env["BATCH_OUTBOX_BUCKET"],
            )
            # --break: the variants get clients of their own, made after the breaking hook is installed
            undo = breaking.install("TransactWriteItems,UpdateItem") if args.broken else None
            work_ddb, work_s3 = client("dynamodb"), client("s3")
            work_counter = CallCounter(work_ddb, work_s3)
            started = time.perf_counter()
            reported, raised = 0, []
            try:
                if variant == "ours":
                    for name in names:
                        # The decider's run at 10:00 (the day's earlier batch times are written to the ledger too).
                        try:
                            reported += (
                                ReceiverBatcher(work_ddb, work_s3, settings).run(name, DAY, now=TICK).records_batched
                            )
                        except Exception as exc:  # noqa: BLE001 (a broken run: recorded, then its work is verified)
                            raised.append(f"{name}: raised {type(exc).__name__}: {str(exc)[:100]}")
                else:
                    reported = sum(naive_batch(work_ddb, work_s3, env, name) for name in names)
            finally:
                if undo:
                    undo()
            seconds = time.perf_counter() - started
            done, problems = verify_batched(ddb, s3, env, names, args.records)
            problems += raised
            if reported != done and not raised:
                problems.append(f"the variant reported {reported} records batched")
            return trials.Run(seconds, done, problems, calls=work_counter.total(), detail=dict(work_counter.calls))

        labels = {"naive": "baseline: UpdateItem per record (lock + finalize)", "ours": "ReceiverBatcher (grouped)"}
        batches = trials.interleaved(["naive", "ours"], args.repeat, batch, label="batching / ")
        print(
            f"\n## batching ({args.records} records per receiver; ReceiverBatcher {args.batch_receivers} receivers, "
            f"baseline {args.naive_receivers}; verified: every record finalized and once in the outbox files)"
        )
        print("\n".join(trials.table(batches, baseline="naive", unit="records", labels=labels)))
        for key, runs in batches.items():
            print(f"{labels[key]} calls by operation: {json.dumps(runs[0].detail, sort_keys=True)}")
        if not trials.all_ok(ticks, batches):
            print("\nBATCHING BENCHMARK FAILED: a variant left work undone (see the check column).")
            failed = True
    finally:
        moto_server.stop(moto)

    # ---- partitions
    part = partitions_benchmark(args.receivers)
    print("\n## partitions")
    print("| receivers | partitions over a year | materialized (30 days) | status load s |")
    print("|---:|---:|---:|---:|")
    print(f"| {args.receivers} | {part['partitions']} | {part['materialized']} | {part['status_load_s']:.2f} |")
    print(trials.after_line())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
