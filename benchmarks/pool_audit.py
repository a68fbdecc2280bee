"""Pool audit benchmark: 10,000 instances across 200 pools in moto.

Prints, for the audit as built (``run_pool_audit``) and for a naive baseline in the same run:
AWS API calls per audited instance, wall time and instances per second; and the pandas
computation alone (median of repeats). Targets: at most 0.1 AWS calls per audited instance,
pandas at most 2 s.

The naive baseline is the seed's loop written directly: for each pool, DescribeInstances filtered
on its tag; for each running instance, one Query of ``instance_id-index`` for a running job; three
PutMetricData calls per pool. It is slow in moto (minutes for a few hundred instances), so it visits
the first ``--naive-pools`` pools only; its calls per instance do not depend on how many it visits.

The audit and the naive loop run ``--rounds`` times in rotating order (``benchmarks/trials.py``),
each verified (the audit's instance count; the naive loop's agreement with the audit's rows).

Every instance is launched in its own reservation, as the fleet launches one runner per job:
moto pages DescribeInstances by reservation, AWS by instance, and this way both agree.

    .venv/bin/python benchmarks/pool_audit.py [--pools 200] [--instances 10000] [--repeat 5] [--naive-pools 10]
    .venv/bin/python benchmarks/pool_audit.py --pandas-only      # the pandas part alone, 10,000 x 200
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
from botocore.config import Config

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import moto_server  # noqa: E402
import trials  # noqa: E402

from infra.deploy import deploy, wait_for_endpoint  # noqa: E402
from infra.local import local_aws_env  # noqa: E402
from pipelines.common import to_item  # noqa: E402
from pipelines.fleet.context import FleetContext  # noqa: E402
from pipelines.fleet.pool_audit.audit import (  # noqa: E402
    AUDITED_STATES,
    list_fleet_instances,
    load_pools,
    run_pool_audit,
    running_job_instances,
)
from pipelines.fleet.pool_audit.compute import audit_pools, load_price_list  # noqa: E402

AMI = "ami-12c6146b"
MANAGED = {"Key": "runs-fleet:managed", "Value": "true"}


class CallCounter:
    def __init__(self, clients):
        self.calls: dict[str, int] = {}
        for client in clients:
            client.meta.events.register("before-call", self._count)

    def _count(self, model, **_):
        self.calls[model.name] = self.calls.get(model.name, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def seed(env: dict[str, str], pools: int, instances: int, workers: int = 4) -> dict[str, int]:
    """200 pools; instances 60% busy, 25% idle, 15% stopped; untagged, unknown-pool and
    unmanaged extras; running jobs for the busy ones and 2 completed jobs per instance for history."""
    rng = random.Random(42)
    prices = load_price_list()
    types = sorted(prices.on_demand_usd_per_hour)
    ddb = boto3.client("dynamodb")
    pool_items = [
        {
            "pool_name": f"pool-{n:03d}",
            "instance_type": rng.choice(types),
            "desired_idle": rng.choice([0, 0, 1, 2]),
            "spot": rng.random() < 0.3,
        }
        for n in range(pools)
    ]
    _batch_write(ddb, env["RUNS_FLEET_POOLS_TABLE"], pool_items)

    # moto's default subnets are /20 (4091 addresses): 10,000 runners need a bigger one.
    ec2 = boto3.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/16")["Subnet"]["SubnetId"]
    plan = []  # (pool tag or None, instance type, fate, managed)
    for n in range(instances):
        pool = pool_items[n % pools]
        fate = rng.choices(["busy", "idle", "stopped"], weights=[60, 25, 15])[0]
        plan.append((pool["pool_name"], pool["instance_type"], fate, True))
    plan += [(None, "t3.micro", "idle", True)] * 20 + [("ghost-pool", "t3.micro", "idle", True)] * 20
    plan += [("pool-000", "t3.small", "busy", False)] * 100  # unmanaged: never counted

    def launch(entry):  # one after the other: moto's subnet address generator is not thread-safe
        pool, itype, _, managed = entry
        tags = ([MANAGED] if managed else []) + ([{"Key": "runs-fleet:pool", "Value": pool}] if pool else [])
        return ec2.run_instances(
            ImageId=AMI,
            MinCount=1,
            MaxCount=1,
            InstanceType=itype,
            SubnetId=subnet,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )["Instances"][0]["InstanceId"]

    ids: list[str] = []
    started = time.perf_counter()
    for start in range(0, len(plan), 1000):
        ids += map(launch, plan[start : start + 1000])
        print(f"  launched {len(ids)}/{len(plan)} ({time.perf_counter() - started:.0f} s)", flush=True)
    # (No terminated runners: the audit filters them out server-side, and moto's bulk TerminateInstances
    # fails on its own volume bookkeeping at this size.)
    stopped = [i for i, (_, _, f, _) in zip(ids, plan, strict=True) if f == "stopped"]
    for start in range(0, len(stopped), 500):
        ec2.stop_instances(InstanceIds=stopped[start : start + 500])

    jobs = []
    for iid, (pool, _, fate, _) in zip(ids, plan, strict=True):
        if fate == "busy":
            jobs.append({"job_id": f"run-{iid}", "instance_id": iid, "pool": pool, "status": "running"})
        for k in range(2):
            jobs.append(
                {
                    "job_id": f"done-{iid}-{k}",
                    "instance_id": iid,
                    "pool": pool,
                    "status": "completed",
                    "completed_at": "2026-11-21T10:00:00.000Z",
                }
            )
    chunks = [jobs[i : i + 2500] for i in range(0, len(jobs), 2500)]
    with ThreadPoolExecutor(workers) as pool_exec:
        list(pool_exec.map(lambda c: _batch_write(boto3.client("dynamodb"), env["RUNS_FLEET_JOBS_TABLE"], c), chunks))
    return {
        "pools": pools,
        "managed_instances": sum(1 for p in plan if p[3]),
        "unmanaged_instances": sum(1 for p in plan if not p[3]),
        "jobs": len(jobs),
    }


def _batch_write(ddb, table: str, items: list[dict]) -> None:
    for start in range(0, len(items), 25):
        request = {table: [{"PutRequest": {"Item": to_item(i)}} for i in items[start : start + 25]]}
        while request:
            request = ddb.batch_write_item(RequestItems=request).get("UnprocessedItems") or None


def naive_audit(env: dict[str, str], ddb, ec2, cloudwatch, sample: int) -> dict[str, int]:
    """The seed's loop, one pool and one instance at a time, over the first ``sample`` pools."""
    pools = sorted(load_pools(ddb, env["RUNS_FLEET_POOLS_TABLE"]), key=lambda p: p["pool_name"])[:sample]
    totals = {"running": 0, "busy": 0, "audited": 0, "pools": [p["pool_name"] for p in pools]}
    now = dt.datetime.now(dt.UTC)
    for pool in pools:
        running = busy = 0
        for page in ec2.get_paginator("describe_instances").paginate(
            Filters=[
                {"Name": "tag:runs-fleet:managed", "Values": ["true"]},
                {"Name": "tag:runs-fleet:pool", "Values": [pool["pool_name"]]},
                {"Name": "instance-state-name", "Values": AUDITED_STATES},
            ]
        ):
            for reservation in page["Reservations"]:
                for inst in reservation["Instances"]:
                    totals["audited"] += 1
                    if inst["State"]["Name"] != "running":
                        continue
                    running += 1
                    jobs = ddb.query(
                        TableName=env["RUNS_FLEET_JOBS_TABLE"],
                        IndexName="instance_id-index",
                        KeyConditionExpression="instance_id = :i",
                        ExpressionAttributeValues={":i": {"S": inst["InstanceId"]}},
                    )["Items"]
                    busy += any(j.get("status", {}).get("S") == "running" for j in jobs)
        totals["running"] += running
        totals["busy"] += busy
        for name, value in (("PoolComputeCost", running), ("PoolIdleCost", running - busy), ("PoolUtilization", 0)):
            cloudwatch.put_metric_data(
                Namespace="RunsFleetNaive",
                MetricData=[
                    {
                        "MetricName": name,
                        "Dimensions": [{"Name": "PoolName", "Value": pool["pool_name"]}],
                        "Value": float(value),
                        "Timestamp": now,
                    }
                ],
            )
    return totals


def pandas_only(pools: int, instances: int, repeat: int) -> bool:
    """The pandas computation alone on a synthetic fleet of the target size (no AWS at all)."""
    rng = random.Random(7)
    prices = load_price_list()
    types = sorted(prices.on_demand_usd_per_hour)
    pool_items = [
        {"pool_name": f"pool-{n:03d}", "instance_type": rng.choice(types), "desired_idle": 1, "spot": n % 3 == 0}
        for n in range(pools)
    ]
    rows, busy = [], set()
    for n in range(instances):
        state = rng.choices(["running", "pending", "stopped"], weights=[85, 5, 10])[0]
        pool = f"pool-{n % pools:03d}"
        rows.append({"instance_id": f"i-{n:017x}", "state": state, "pool": pool, "instance_type": "x"})
        if state == "running" and rng.random() < 0.7:
            busy.add(f"i-{n:017x}")
    timings, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = audit_pools(pool_items, rows, busy, prices)
        timings.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)  # the work itself, whatever else the machine runs
    print(
        f"pandas computation alone, synthetic ({instances} instances, {pools} pools, n={repeat}): "
        f"median {statistics.median(timings):.3f} s, min {min(timings):.3f} s, max {max(timings):.3f} s; "
        f"CPU seconds median {statistics.median(cpu):.3f}, min {min(cpu):.3f}, max {max(cpu):.3f} "
        f"(running={result.totals['running']}, busy={result.totals['busy']})"
    )
    ok = statistics.median(timings) <= 2.0
    print(f"target pandas <= 2 s: {'met' if ok else 'NOT met'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pools", type=int, default=200)
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--naive-pools", type=int, default=10, help="pools the naive baseline visits (it is slow in moto)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of audit and naive loop (order rotates)")
    parser.add_argument("--pandas-only", action="store_true", help="time the pandas computation alone, no moto")
    args = parser.parse_args()
    print(trials.machine_line("pool_audit.py"), flush=True)
    if args.pandas_only:
        return 0 if pandas_only(args.pools, args.instances, args.repeat) else 1
    log = tempfile.NamedTemporaryFile(prefix="moto-bench-", suffix=".log", delete=False)
    # moto scans every EC2 tag per instance it touches; the server reads each resource's own tags
    # (same results, see benchmarks/moto_server.py).
    moto, endpoint = moto_server.start(("ec2-tags",), log=log)
    os.environ.update(local_aws_env(endpoint))  # the same variables make dev uses
    try:
        wait_for_endpoint(endpoint, timeout_seconds=300)
        env = deploy(boto3.client("cloudformation"))
        started = time.perf_counter()
        seeded = seed(env, args.pools, args.instances)
        print(f"seeded in {time.perf_counter() - started:.1f} s: " + ", ".join(f"{k}={v}" for k, v in seeded.items()))

        # moto answers a page of 1,000 instances slowly on a loaded machine: wait for it, as AWS would answer.
        patient = Config(read_timeout=600)
        clients = {name: boto3.client(name, config=patient) for name in ("dynamodb", "ec2", "cloudwatch", "s3")}
        counter = CallCounter(clients.values())
        naive_clients = {name: boto3.client(name, config=patient) for name in ("dynamodb", "ec2", "cloudwatch")}
        naive_counter = CallCounter(naive_clients.values())
        expected_managed = seeded.get("managed_instances")
        outcome: dict = {}

        # Both read the same fleet (their writes are metrics and a CSV): every round on the same data.
        # Verified: the audit's instance count is the fleet's managed instances, and the naive loop's
        # running and busy agree with the audit's rows for the pools it visited.
        def once(variant: str, _round: int) -> trials.Run:
            problems: list[str] = []
            if variant == "audit":
                counter.calls.clear()
                started = time.perf_counter()
                ctx = FleetContext(
                    **clients,
                    jobs_table=env["RUNS_FLEET_JOBS_TABLE"],
                    pools_table=env["RUNS_FLEET_POOLS_TABLE"],
                    archive_bucket=env["RUNS_FLEET_ARCHIVE_BUCKET"],
                    namespace="RunsFleet",
                    log=logging.getLogger("pool_audit"),  # progress lines at INFO: not printed
                )
                run = run_pool_audit(ctx)
                seconds = time.perf_counter() - started
                outcome["run"] = run
                if expected_managed is not None and run.instances != expected_managed:
                    problems.append(f"audited {run.instances}, the fleet has {expected_managed} managed")
                return trials.Run(seconds, run.instances, problems, calls=sum(counter.calls.values()),
                                  detail=dict(counter.calls))  # fmt: skip
            naive_counter.calls.clear()
            started = time.perf_counter()
            naive = naive_audit(
                env, naive_clients["dynamodb"], naive_clients["ec2"], naive_clients["cloudwatch"], args.naive_pools
            )
            seconds = time.perf_counter() - started
            outcome["naive"] = naive
            if "run" in outcome:
                sampled = outcome["run"].audit.table.loc[outcome["run"].audit.table["pool"].isin(naive["pools"])]
                if naive["busy"] != sampled["busy"].sum() or naive["running"] != sampled["running"].sum():
                    problems.append("running / busy differ from the audit's rows for the same pools")
            return trials.Run(seconds, naive["audited"], problems, calls=naive_counter.total,
                              detail=dict(naive_counter.calls))  # fmt: skip

        results = trials.interleaved(["audit", "naive"], args.rounds, once, label="pool audit / ")
        run, naive = outcome["run"], outcome["naive"]
        ours_calls = next((r.detail for r in results["audit"] if r.ok), {})

        # The pandas computation alone, on the inputs the audit read.
        prices = load_price_list()
        pools = load_pools(clients["dynamodb"], env["RUNS_FLEET_POOLS_TABLE"])
        rows = list_fleet_instances(clients["ec2"])
        busy = running_job_instances(clients["dynamodb"], env["RUNS_FLEET_JOBS_TABLE"])
        timings = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            audit_pools(pools, rows, busy, prices)
            timings.append(time.perf_counter() - t0)
    finally:
        moto_server.stop(moto)
        log.close()

    audited = run.instances
    totals = run.audit.totals
    print(
        f"audited {audited} managed instances in {len(pools)} pools: running={totals['running']} busy={totals['busy']} "
        f"idle={totals['idle']} (+{totals['untagged_instances']} untagged, {totals['unknown_pool_instances']} in "
        f"unknown pools), {run.running_jobs} instances with running jobs"
    )
    sampled = run.audit.table.loc[run.audit.table["pool"].isin(naive["pools"])]
    agree = naive["busy"] == sampled["busy"].sum() and naive["running"] == sampled["running"].sum()
    print(
        f"naive baseline over {len(naive['pools'])} pools ({naive['audited']} instances) agrees with the audit's rows "
        f"for them on running and busy: {agree}"
    )
    print()
    labels = {
        "audit": "pool audit (`run_pool_audit`), all pools",
        "naive": f"naive baseline, {len(naive['pools'])} pools",
    }
    print("\n".join(trials.table(results, baseline="naive", unit="instances", labels=labels)))
    print("pool audit calls by operation: " + ", ".join(f"{k}={v}" for k, v in sorted(ours_calls.items())))
    naive_calls = next((r.detail for r in results["naive"] if r.ok), {})
    print("naive calls by operation: " + ", ".join(f"{k}={v}" for k, v in sorted(naive_calls.items())))
    print(
        f"pandas computation alone ({len(rows)} instances, {len(pools)} pools, n={args.repeat}): "
        f"median {statistics.median(timings):.3f} s, min {min(timings):.3f} s, max {max(timings):.3f} s"
    )
    calls_ok = sum(ours_calls.values()) / audited <= 0.1
    pandas_ok = statistics.median(timings) <= 2.0
    print(f"target <= 0.1 AWS calls per instance: {'met' if calls_ok else 'NOT met'}")
    print(f"target pandas <= 2 s: {'met' if pandas_ok else 'NOT met'}")
    print(trials.after_line())
    return 0 if calls_ok and pandas_ok and trials.all_ok(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
