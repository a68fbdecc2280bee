"""Fleet queue processors benchmark (runs-fleet). Prints its figures; never part of the test suite.

Starts its own moto server on 127.0.0.1, deploys infra/template.yaml, and measures in one run:

1. termination, calls per message: the drain (full rounds) against the seed's own pattern (one call
   per action per message: ReceiveMessage of 10, then per message PutObject (archive), UpdateItem,
   DeleteParameter, PutMetricData, DeleteMessage, on 5 workers as pkg/events/handler.go does);
2. termination, throughput of one drain run (the ``process_termination_queue`` job, in process)
   against two bare boto3 loops doing the same work on the same server: the seed's pattern above,
   and a bare *batched* loop (the drain's own batch calls, inline, no validation, no threads);
3. backlog: N messages drained by the runs ``termination_queue_sensor`` launches under a real
   ``dagster-daemon`` (code location ``benchmarks/fleet_backlog_defs.py``: that job and sensor only),
   on a moto server of its own with the ``transactions``, ``sqs-retention`` and ``hot-paths`` patches
   (``benchmarks/moto_server.py``; same semantics: without them every write to a 10,000-job table,
   every receive from a 10,000-message queue and the seeding's every send take seconds), counting
   what was lost;
4. ``old_jobs``: calls per deleted record (archive writes not counted) against a naive scan +
   ``DeleteItem`` per record.

API calls are counted with botocore ``before-call`` event hooks on the clients. The termination
variants and old_jobs run ``--repeat`` times (3) in rotating order, each from fresh work
(``benchmarks/trials.py``); their ratios are taken per round. Termination's ratio baseline is
``fair``, a bare loop doing what the drain does (rounds of 100, flushed every 3 rounds).

Every termination variant and the backlog check their own work before a figure is printed: the
queue is empty (nothing visible, nothing in flight: a message in flight once a variant has returned
is work it never acknowledged), every job is final, and each was applied exactly once (its
variant's JobSuccess + JobFailure sum to the number of jobs; the drains' jobs also carry the digest
of their message and a done round marker). Otherwise the benchmark stops with a message saying what
is missing and exits 1. Rates and calls per message divide by the work verified.
``--break-variant NAME`` breaks one variant on purpose (every 10th DeleteMessageBatch call, or the
seed pattern's UpdateItem, pretends to succeed and does nothing) to show that the check catches it.

    .venv/bin/python benchmarks/fleet.py [--messages 2000] [--backlog 10000] [--old-jobs 3000]
        [--skip termination,old_jobs] [--patched] [--plain-backlog]
        [--break-variant seed|bare|drain|job]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import signal
import sys
import time
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import moto_server  # noqa: E402
import trials  # noqa: E402
from bench_support import all_pages, start_daemon, stop_daemon  # noqa: E402

from infra.deploy import deploy, wait_for_endpoint  # noqa: E402
from infra.local import local_aws_env  # noqa: E402
from pipelines.common import iso, to_item  # noqa: E402
from pipelines.common.aws_batches import chunks  # noqa: E402

SERVICES = ("sqs", "dynamodb", "ssm", "cloudwatch", "s3", "ec2")
log = logging.getLogger("bench")


class Incomplete(Exception):
    """A variant did not do all of its work: the benchmark must not print a figure for it."""


class Breaker:
    """``--break-variant``: every 10th call of the broken operations pretends to succeed and does
    nothing. The drains and the bare loop lose message deletes (DeleteMessage, DeleteMessageBatch:
    every entry reported "Successful"); the seed pattern, whose loop re-receives until nothing is in
    flight and so heals lost deletes, loses job updates (UpdateItem) instead."""

    OPERATIONS = {"seed": ("UpdateItem",), "bare": ("DeleteMessageBatch",), "drain": ("DeleteMessageBatch",)}

    def __init__(self):
        self.operations: tuple[str, ...] = ()
        self.calls = 0
        self.dropped = 0

    def arm(self, variant: str, broken: str) -> None:
        self.operations = self.OPERATIONS.get(variant, ("DeleteMessageBatch",)) if variant == broken else ()
        self.calls = self.dropped = 0

    def attach(self, client) -> None:
        client.meta.events.register("provide-client-params.*.*", self._remember)
        client.meta.events.register("before-call.*.*", self._drop)

    def _remember(self, params, context, **kwargs):
        context["bench_entries"] = [e["Id"] for e in params.get("Entries", []) if "Id" in e]

    def _drop(self, event_name, context, **kwargs):
        if event_name.rsplit(".", 1)[-1] not in self.operations:
            return None
        self.calls += 1
        if self.calls % 10:
            return None
        from botocore.awsrequest import AWSResponse

        ids = context.get("bench_entries") or []
        self.dropped += len(ids) or 1
        ok = AWSResponse("http://127.0.0.1/dropped", 200, {}, None)  # what a success looks like to the caller
        return ok, ({"Successful": [{"Id": i} for i in ids], "Failed": []} if ids else {})


BREAKER = Breaker()


class OpTimes:
    """Client wall time per operation (``before-call`` to ``after-call``), summed over threads: where
    a variant's time goes, request and moto's work included."""

    def __init__(self):
        self.seconds: Counter = Counter()

    def attach(self, client) -> None:
        client.meta.events.register("before-call.*.*", self._start)
        client.meta.events.register("after-call.*.*", self._stop)

    def _start(self, context, **kwargs):
        context["bench_started"] = time.perf_counter()

    def _stop(self, event_name, context, **kwargs):
        started = context.get("bench_started")
        if started is not None:
            self.seconds[event_name.rsplit(".", 1)[-1]] += time.perf_counter() - started

    def reset(self) -> Counter:
        out, self.seconds = self.seconds, Counter()
        return out


TIMES = OpTimes()


class Calls:
    """Counts API calls on the clients it hands out (botocore before-call hooks)."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.counts: Counter = Counter()
        self.clients = {}
        for service in SERVICES:
            client = boto3.client(service, endpoint_url=endpoint, region_name="us-east-1")
            client.meta.events.register("before-call.*.*", self._count)
            BREAKER.attach(client)
            TIMES.attach(client)
            self.clients[service] = client

    def _count(self, event_name, **kwargs):
        self.counts[event_name.rsplit(".", 1)[-1]] += 1

    def reset(self) -> Counter:
        out, self.counts = self.counts, Counter()
        return out


class AllCalls:
    """Counts every API call made in this process while active, from any client (the job's own
    resources build their clients inside the run): a ``before-call`` hook on each new client."""

    def __init__(self):
        self.counts: Counter = Counter()

    def __enter__(self):
        import botocore.client

        self._original = original = botocore.client.BaseClient.__init__
        counts = self.counts

        def init(client, *args, **kwargs):
            original(client, *args, **kwargs)
            client.meta.events.register(
                "before-call.*.*", lambda event_name, **kw: counts.update([event_name.rsplit(".", 1)[-1]])
            )
            BREAKER.attach(client)
            TIMES.attach(client)

        botocore.client.BaseClient.__init__ = init
        return self

    def __exit__(self, *exc):
        import botocore.client

        botocore.client.BaseClient.__init__ = self._original


def reset(endpoint: str) -> dict[str, str]:
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=60).read()
    env = deploy(boto3.client("cloudformation", endpoint_url=endpoint, region_name="us-east-1"))
    os.environ.update(env)
    return env


def seed_jobs(clients, env, n: int, *, parameters: bool = True) -> list[dict]:
    """n running jobs on synthetic (valid) instance ids, with their runner parameters, and their messages."""
    now = dt.datetime.now(dt.UTC)
    jobs = [
        {
            "job_id": f"job-{uuid.uuid4().hex[:12]}",
            "instance_id": f"i-{uuid.uuid4().int % 16**17:017x}",
            "status": "running",
            "started_at": iso(now - dt.timedelta(minutes=3)),
        }
        for _ in range(n)
    ]
    ddb, table = clients["dynamodb"], env["RUNS_FLEET_JOBS_TABLE"]
    for start in range(0, n, 25):
        ddb.batch_write_item(
            RequestItems={table: [{"PutRequest": {"Item": to_item(j)}} for j in jobs[start : start + 25]]}
        )
    if parameters:
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda j: clients["ssm"].put_parameter(
                        Name=f"/runs-fleet/runners/{j['instance_id']}/config", Type="String", Value="{}"
                    ),
                    jobs,
                )
            )
    bodies = []
    for k, job in enumerate(jobs):
        status = "success" if k % 5 else "failure"
        bodies.append(
            json.dumps(
                {
                    "instance_id": job["instance_id"],
                    "job_id": job["job_id"],
                    "status": status,
                    "exit_code": 0 if status == "success" else 1,
                    "duration_seconds": 100 + k % 50,
                    "started_at": iso(now - dt.timedelta(minutes=3)),
                    "completed_at": iso(now),
                    "error": "" if status == "success" else "exit code 1",
                }
            )
        )
    sqs, url = clients["sqs"], env["RUNS_FLEET_TERMINATION_QUEUE_URL"]

    def send(start):
        sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies[start : start + 10])]
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(send, range(0, n, 10)))
    return jobs


def completed(clients, env) -> int:
    pages = all_pages(
        clients["dynamodb"].scan,
        TableName=env["RUNS_FLEET_JOBS_TABLE"],
        Select="COUNT",
        FilterExpression="#s <> :r",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":r": {"S": "running"}},
    )
    return sum(page["Count"] for page in pages)


def depth(clients, url) -> int:
    a = clients["sqs"].get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(a["ApproximateNumberOfMessages"]) + int(a["ApproximateNumberOfMessagesNotVisible"])


def queue_state(clients, url) -> tuple[int, int]:
    a = clients["sqs"].get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(a["ApproximateNumberOfMessages"]), int(a["ApproximateNumberOfMessagesNotVisible"])


def verify(clients, env, jobs: list[dict], namespace: str, *, drain: bool, name: str) -> int:
    """Raise ``Incomplete`` unless the variant did all of its work; returns the jobs applied (all).

    The queue is empty: nothing visible and nothing in flight (once the variant has returned, a
    message in flight is one it received and never acknowledged). Every job is final. Each was
    applied exactly once: the variant's JobSuccess + JobFailure in ``namespace`` sum to the jobs
    (every variant counts a job when its conditional update succeeds, and only then); a drain's
    jobs also carry their message's digest and a round marker that exists."""
    n = len(jobs)
    problems = []
    visible, in_flight = queue_state(clients, env["RUNS_FLEET_TERMINATION_QUEUE_URL"])
    if visible or in_flight:
        problems.append(f"{visible} message(s) left visible and {in_flight} in flight (never acknowledged)")
    final = completed(clients, env)
    if final != n:
        problems.append(f"{n - final} of {n} job(s) still running")
    counted = metric_total(clients, namespace)
    if counted != n:
        problems.append(
            f"JobSuccess + JobFailure = {counted:.0f}, not {n}: applied {'twice' if counted > n else 'never'}"
        )
    if drain:
        problems += _drain_marks(clients, env, n)
    if problems:
        raise Incomplete(f"{name}: INCOMPLETE: " + "; ".join(problems))
    return n


def _drain_marks(clients, env, n: int) -> list[str]:
    """A drain's jobs: each stamped with a message digest and a round whose done marker exists."""
    from pipelines.fleet.termination import ROUNDS_PREFIX, round_marker_key

    s3, bucket, url = clients["s3"], env["RUNS_FLEET_ARCHIVE_BUCKET"], env["RUNS_FLEET_TERMINATION_QUEUE_URL"]
    markers = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=ROUNDS_PREFIX):
        markers |= {o["Key"] for o in page.get("Contents", [])}
    unmarked = 0
    for page in all_pages(clients["dynamodb"].scan, TableName=env["RUNS_FLEET_JOBS_TABLE"]):
        for item in page["Items"]:
            round_id = item.get("termination_round", {}).get("S")
            if "termination_digest" not in item or not round_id or round_marker_key(url, round_id) not in markers:
                unmarked += 1
    return [f"{unmarked} of {n} job(s) without a digest and a done round"] if unmarked else []


# ------------------------------------------------------------------------- baselines


def job_update(body: dict) -> dict:
    """The baselines' conditional job update: the fields of runs-fleet's termination message (status
    running or absent becomes the final status, with exit_code, duration_seconds, completed_at, error, instance_id)."""
    return {
        "Key": {"job_id": {"S": body["job_id"]}},
        "UpdateExpression": "SET #s = :f, exit_code = :c, duration_seconds = :d, completed_at = :t, #e = :e, "
        "instance_id = :i",
        "ConditionExpression": "#s = :running OR attribute_not_exists(#s)",
        "ExpressionAttributeNames": {"#s": "status", "#e": "error"},
        "ExpressionAttributeValues": {
            ":f": {"S": "completed" if body["status"] == "success" else "failed"},
            ":c": {"N": str(body["exit_code"])},
            ":d": {"N": str(body["duration_seconds"])},
            ":t": {"S": body["completed_at"]},
            ":e": {"S": body["error"]},
            ":i": {"S": body["instance_id"]},
            ":running": {"S": "running"},
        },
    }


SEED_VISIBILITY_SECONDS = 10


def seed_pattern(clients, env) -> int:
    """The seed's handler: receive 10, then per message one call per action, 5 workers.

    Its DeleteMessage calls run on 5 threads at once, and moto's SQS loses some of those (a lost
    update in its ``Queue.delete_message``): those messages come back after their visibility
    timeout (10 s here, set by ``bench_termination``). So the loop goes on until nothing is visible
    or in flight, and a message that comes back is a duplicate: its update's condition fails, and
    it is counted neither in the metrics nor in the result. Returns the jobs it applied."""
    sqs, url = clients["sqs"], env["RUNS_FLEET_TERMINATION_QUEUE_URL"]
    table, bucket = env["RUNS_FLEET_JOBS_TABLE"], env["RUNS_FLEET_ARCHIVE_BUCKET"]
    applied = Counter()

    def handle(m):
        body = json.loads(m["Body"])
        clients["s3"].put_object(Bucket=bucket, Key=f"raw/seed/{m['MessageId']}.json", Body=m["Body"].encode())
        try:
            clients["dynamodb"].update_item(TableName=table, **job_update(body))
        except clients["dynamodb"].exceptions.ConditionalCheckFailedException:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])  # a redelivered duplicate
            return
        try:
            clients["ssm"].delete_parameter(Name=f"/runs-fleet/runners/{body['instance_id']}/config")
        except clients["ssm"].exceptions.ParameterNotFound:
            pass
        datum = [{"MetricName": "JobDuration", "Value": body["duration_seconds"], "Unit": "Seconds"}]
        datum.append({"MetricName": "JobSuccess" if body["status"] == "success" else "JobFailure", "Value": 1})
        clients["cloudwatch"].put_metric_data(Namespace="RunsFleetSeed", MetricData=datum)
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        applied["n"] += 1

    with ThreadPoolExecutor(5) as pool:
        while True:
            messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
            if messages:
                list(pool.map(handle, messages))
                continue
            visible, in_flight = queue_state(clients, url)
            if not visible and not in_flight:
                return applied["n"]
            time.sleep(0.5)  # lost deletes: those messages come back after the visibility timeout


def bare_batched(clients, env) -> int:
    """The drain's batch calls written as a bare loop: 10 per round, no validation, no threads."""
    sqs, url = clients["sqs"], env["RUNS_FLEET_TERMINATION_QUEUE_URL"]
    table, bucket = env["RUNS_FLEET_JOBS_TABLE"], env["RUNS_FLEET_ARCHIVE_BUCKET"]
    done, n = 0, 0
    while True:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        if not messages:
            return done
        n += 1
        clients["s3"].put_object(
            Bucket=bucket, Key=f"raw/bare/{n}.jsonl", Body="\n".join(m["Body"] for m in messages).encode()
        )
        bodies = [json.loads(m["Body"]) for m in messages]
        clients["dynamodb"].transact_write_items(
            TransactItems=[{"Update": {"TableName": table, **job_update(b)}} for b in bodies]
        )
        clients["ssm"].delete_parameters(Names=[f"/runs-fleet/runners/{b['instance_id']}/config" for b in bodies])
        ok = sum(1 for b in bodies if b["status"] == "success")
        clients["cloudwatch"].put_metric_data(
            Namespace="RunsFleetBare",
            MetricData=[
                {"MetricName": "JobDuration", "Values": [b["duration_seconds"] for b in bodies]},
                {"MetricName": "JobSuccess", "Value": ok},
                {"MetricName": "JobFailure", "Value": len(bodies) - ok},
            ],
        )
        sqs.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
        )
        done += len(messages)


FAIR_ROUND, FAIR_FLUSH_ROUNDS = 100, 3


def fair_batched(clients, env, round_size: int = FAIR_ROUND, flush_rounds: int = FAIR_FLUSH_ROUNDS) -> int:
    """What the drain does, as a bare loop: rounds of up to 100 messages (receives of 10), one
    TransactWriteItems of the round's conditional job updates; every 3 rounds one flush: the raw
    messages archived in one object, the runner parameters deleted 10 a call (on 10 threads, as the
    drain's pool does), one PutMetricData, the messages deleted 10 a call. About 0.32 calls per
    message. No validation, no duplicate, crash or take-over handling, no round markers, no Dagster."""
    sqs, url = clients["sqs"], env["RUNS_FLEET_TERMINATION_QUEUE_URL"]
    table, bucket = env["RUNS_FLEET_JOBS_TABLE"], env["RUNS_FLEET_ARCHIVE_BUCKET"]
    done, flushes = 0, 0
    held: list[dict] = []
    rounds = 0

    def flush(pool) -> int:
        nonlocal flushes
        if not held:
            return 0
        flushes += 1
        clients["s3"].put_object(
            Bucket=bucket, Key=f"raw/fair/{flushes}.jsonl", Body="\n".join(m["Body"] for m in held).encode()
        )
        bodies = [json.loads(m["Body"]) for m in held]
        names = [f"/runs-fleet/runners/{b['instance_id']}/config" for b in bodies]
        list(pool.map(lambda part: clients["ssm"].delete_parameters(Names=part), chunks(names, 10)))
        ok = sum(1 for b in bodies if b["status"] == "success")
        clients["cloudwatch"].put_metric_data(
            Namespace="RunsFleetFair",
            MetricData=[
                {"MetricName": "JobDuration", "Values": [b["duration_seconds"] for b in bodies]},
                {"MetricName": "JobSuccess", "Value": ok},
                {"MetricName": "JobFailure", "Value": len(bodies) - ok},
            ],
        )
        for part in chunks(held, 10):
            sqs.delete_message_batch(
                QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(part)]
            )
        n = len(held)
        held.clear()
        return n

    with ThreadPoolExecutor(10) as pool:
        while True:
            messages: list[dict] = []
            while len(messages) < round_size:
                got = sqs.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=min(10, round_size - len(messages)), WaitTimeSeconds=0
                ).get("Messages", [])
                messages += got
                if len(got) < 10:
                    break
            if not messages:
                return done + flush(pool)
            bodies = [json.loads(m["Body"]) for m in messages]
            clients["dynamodb"].transact_write_items(
                TransactItems=[{"Update": {"TableName": table, **job_update(b)}} for b in bodies]
            )
            held.extend(messages)
            rounds += 1
            if rounds % flush_rounds == 0:
                done += flush(pool)


# --------------------------------------------------------------------------- measures


def fleet_context(c: dict, env):
    """The FleetContext of the drains, over the clients ``c`` (service -> client)."""
    from pipelines.fleet.context import FleetContext

    return FleetContext(
        ec2=c["ec2"],
        ssm=c["ssm"],
        dynamodb=c["dynamodb"],
        cloudwatch=c["cloudwatch"],
        s3=c["s3"],
        jobs_table=env["RUNS_FLEET_JOBS_TABLE"],
        archive_bucket=env["RUNS_FLEET_ARCHIVE_BUCKET"],
        namespace="RunsFleet",
        log=log,
    )


def drain_pure(calls: Calls, env, concurrency=10):
    from pipelines.fleet.drain import TerminationLimits, queue_drain
    from pipelines.fleet.termination import TerminationHandler

    drain = queue_drain(
        TerminationHandler,
        fleet_context(calls.clients, env),
        sqs=calls.clients["sqs"],
        queue_url=env["RUNS_FLEET_TERMINATION_QUEUE_URL"],
        dlq_url=env["RUNS_FLEET_TERMINATION_DLQ_URL"],
        run_id=uuid.uuid4().hex[:8],
        limits=TerminationLimits(concurrency=concurrency, wait_seconds=0, max_seconds=3600),
    )
    result = drain.run()
    if result.stopped_by != "queue empty":
        raise Incomplete(f"drain, plain module: stopped by {result.stopped_by}, not by an empty queue")
    return result


def drain_job(run_config: dict, instance):
    from pipelines.definitions import build_definitions

    job = build_definitions("local").resolve_job_def("process_termination_queue")
    result = job.execute_in_process(run_config=run_config, instance=instance)
    out = result.output_for_node("drain_termination_queue")
    if out["stopped_by"] != "queue empty":
        raise Incomplete(f"drain run: stopped by {out['stopped_by']}, not by an empty queue")
    return out


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


VARIANTS = ("seed", "bare", "fair", "drain", "job")
LABELS = {
    "seed": "seed pattern (per-message calls, 5 workers)",
    "bare": "bare batched boto3 loop (rounds of 10)",
    "fair": "bare loop doing what the drain does (rounds of 100, flushed every 3)",
    "drain": "drain, plain module (defaults: rounds of 100, flushed every 3)",
    "job": "drain run: process_termination_queue job in process",
}


def bench_termination(endpoint: str, n: int, break_variant: str = "", repeat: int = 3) -> list[str]:
    import dagster as dg

    calls = Calls(endpoint)
    # key -> (run -> the variant's own count of jobs applied, metrics namespace, is a drain)
    variants = {
        "seed": (lambda env: seed_pattern(calls.clients, env), "RunsFleetSeed", False),
        "bare": (lambda env: bare_batched(calls.clients, env), "RunsFleetBare", False),
        "fair": (lambda env: fair_batched(calls.clients, env), "RunsFleetFair", False),
        "drain": (lambda env: drain_pure(calls, env).counts["applied"], "RunsFleet", True),
        "job": (
            lambda env: drain_job({"wait_seconds": 0, "max_seconds": 3600}, dg.DagsterInstance.ephemeral())["applied"],
            "RunsFleet",
            True,
        ),
    }

    def once(key: str, _round: int) -> trials.Run:
        run, namespace, is_drain = variants[key]
        name = LABELS[key]
        env = reset(endpoint)
        if key == "seed":  # its lost deletes come back after this, and it must wait for them
            calls.clients["sqs"].set_queue_attributes(
                QueueUrl=env["RUNS_FLEET_TERMINATION_QUEUE_URL"],
                Attributes={"VisibilityTimeout": str(SEED_VISIBILITY_SECONDS)},
            )
        jobs = seed_jobs(calls.clients, env, n)
        calls.reset()
        TIMES.reset()
        BREAKER.arm(key, break_variant)
        problems = []
        try:
            with AllCalls() as all_calls:
                own, seconds = timed(lambda: run(env))
        except Incomplete as exc:
            own, seconds, problems = -1, 0.0, [str(exc)]
        finally:
            dropped, BREAKER.operations = BREAKER.dropped, ()
        if key == break_variant:
            ops = "/".join(Breaker.OPERATIONS.get(key, ("DeleteMessageBatch",)))
            print(f"  {name}: BROKEN on purpose: {dropped} {ops} entries dropped", file=sys.stderr)
        counted = calls.reset() + all_calls.counts
        times = TIMES.reset()
        try:
            done = verify(calls.clients, env, jobs, namespace, drain=is_drain, name=name)
        except Incomplete as exc:
            done, problems = completed(calls.clients, env), [*problems, str(exc)]
        if own != done and not problems:
            problems.append(f"{name}: INCOMPLETE: it reports {own} applied, the table and metrics say {done}")
        return trials.Run(seconds, done, problems, calls=sum(counted.values()), detail=dict(counted),
                          extra={"times": times})  # fmt: skip

    results = trials.interleaved(list(variants), repeat, once, label="termination / ")
    lines = [f"Termination, {n} messages (all valid, full rounds), same moto server; every run verified:", ""]
    lines += trials.table(results, baseline="fair", unit="msgs", labels=LABELS)
    lines.append("")
    seed_ratio = trials.spread(trials.ratios(results, "drain", "seed"))
    if seed_ratio:
        lines.append(f"Drain vs seed pattern, per round: {seed_ratio.fmt()}")
    for key, runs in results.items():
        lines.append(f"{LABELS[key]} calls: " + ", ".join(f"{k} {v}" for k, v in sorted(runs[0].detail.items())))
    lines.append("")
    lines.append("Client seconds by operation (summed over threads), first round:")
    for key, runs in results.items():
        top = ", ".join(f"{k} {v:.1f}" for k, v in runs[0].extra["times"].most_common(5))
        lines.append(f"- {LABELS[key]} ({runs[0].seconds:.1f}s): {top}")
    if not trials.all_ok(results):
        raise Incomplete("\n".join(lines))
    return lines


def _run_outputs(instance, run) -> dict:
    """The drain op's output metadata of a finished run (its counts)."""
    import dagster as dg

    for record in instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.STEP_OUTPUT).records:
        data = record.event_log_entry.dagster_event.step_output_data
        return {k: getattr(v, "value", v) for k, v in data.metadata.items()}
    return {}


def bench_backlog(n: int, *, patched: bool = True, drain_runs: int = 1, timeout: float = 3 * 3600) -> list[str]:
    """A backlog of n messages drained by the runs ``termination_queue_sensor`` launches under a real
    ``dagster-daemon`` (sensor ticks every 30 s; each run is a subprocess of the code server, with the
    sensor's default config: concurrency 5, max_seconds 300), on its own moto server."""
    import shutil
    import tempfile

    import dagster as dg

    server, endpoint = moto_server.start(("transactions", "sqs-retention", "hot-paths") if patched else ())
    home = Path(tempfile.mkdtemp(prefix="fleet-backlog-"))
    daemon = None
    try:
        wait_for_endpoint(endpoint, timeout_seconds=300)
        calls = Calls(endpoint)
        env = reset(endpoint)
        seeding = time.perf_counter()
        jobs = seed_jobs(calls.clients, env, n, parameters=False)  # parameters already gone: "already gone is fine"
        seeding = time.perf_counter() - seeding
        queue, dlq = env["RUNS_FLEET_TERMINATION_QUEUE_URL"], env["RUNS_FLEET_TERMINATION_DLQ_URL"]
        assert depth(calls.clients, queue) == n
        print(f"  backlog: {n} jobs and messages seeded in {seeding:.0f}s", file=sys.stderr)
        shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")
        daemon_env = {**os.environ, **env, "AWS_ENDPOINT_URL": endpoint, "DAGSTER_HOME": str(home)}
        daemon_env["RUNS_FLEET_TERMINATION_DRAIN_RUNS"] = str(drain_runs)
        start = time.perf_counter()
        daemon = start_daemon(
            home, ROOT / "benchmarks" / "fleet_backlog_defs.py", "fleet_backlog", cwd=ROOT, env=daemon_env
        )
        instance = dg.DagsterInstance.from_config(str(home))
        active = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
        last = None
        while time.perf_counter() - start < timeout:
            left = depth(calls.clients, queue)
            running = instance.get_runs(filters=dg.RunsFilter(statuses=active))
            if left == 0 and not running and instance.get_runs():
                break
            if last is None or time.perf_counter() - last >= 60:
                last = time.perf_counter()
                print(
                    f"  backlog: {time.perf_counter() - start:.0f}s, {left} left, "
                    f"{len(instance.get_runs())} run(s) launched",
                    file=sys.stderr,
                )
            time.sleep(5)
        seconds = time.perf_counter() - start
        runs = list(reversed(instance.get_runs()))
        outputs = [_run_outputs(instance, r) for r in runs]
        statuses = Counter(r.status.value for r in runs)
        done = completed(calls.clients, env)
        left, dead = depth(calls.clients, queue), depth(calls.clients, dlq)
        counted = metric_total(calls.clients)
        applied = sum(int(o.get("applied", 0)) for o in outputs)
        per_run = ", ".join(f"{o.get('applied', '?')} in {float(o.get('seconds', 0)):.0f}s" for o in outputs)
        instance.dispose()
        verify(calls.clients, env, jobs, "RunsFleet", drain=True, name=f"backlog of {n}")
        if applied != n:
            raise Incomplete(f"backlog of {n}: INCOMPLETE: the runs report {applied} applied, not {n}")
        return [
            f"Backlog: {n} messages ({'patched' if patched else 'plain'} moto); a real `dagster-daemon` ran "
            f"`termination_queue_sensor` (RUNS_FLEET_TERMINATION_DRAIN_RUNS={drain_runs}), which launched "
            f"{len(runs)} drain run(s) "
            f"({', '.join(f'{v} {k}' for k, v in statuses.items())}; applied per run: {per_run}).",
            f"Verified: {applied} applied, {done} of {n} jobs final, {left} left in the queue, {dead} dead-lettered, "
            f"JobSuccess + JobFailure = {counted:.0f}, lost {n - done}; {seconds:.0f}s from daemon start to empty "
            f"queue ({n / seconds:.0f} msgs/s); seeding took {seeding:.0f}s.",
        ]
    finally:
        if daemon is not None and daemon.poll() is None:
            stop_daemon(daemon)
        moto_server.stop(server)
        shutil.rmtree(home, ignore_errors=True)


def metric_total(clients, namespace: str = "RunsFleet") -> float:
    """JobSuccess + JobFailure over every dimension in ``namespace``."""
    now = dt.datetime.now(dt.UTC)
    cw, total, seen = clients["cloudwatch"], 0.0, set()
    for page in cw.get_paginator("list_metrics").paginate(Namespace=namespace):
        for metric in page["Metrics"]:
            key = (metric["MetricName"], json.dumps(metric.get("Dimensions", []), sort_keys=True))
            if metric["MetricName"] not in ("JobSuccess", "JobFailure") or key in seen:
                continue  # moto lists a metric once per datum put
            seen.add(key)
            points = cw.get_metric_statistics(
                Namespace=namespace,
                MetricName=metric["MetricName"],
                Dimensions=metric.get("Dimensions", []),
                StartTime=now - dt.timedelta(hours=6),
                EndTime=now + dt.timedelta(hours=1),
                Period=3600 * 7,
                Statistics=["Sum"],
            )["Datapoints"]
            total += sum(p["Sum"] for p in points)
    return total


def bench_old_jobs(endpoint: str, n: int, repeat: int = 3) -> list[str]:
    """old_jobs against a naive scan + PutObject + DeleteItem per record, each run on a fresh table:
    n finished records older than 7 days among n / 10 running ones. Verified: every old record gone
    from the table and archived in S3, every running one left."""
    from pipelines.fleet.housekeeping import Housekeeping

    calls = Calls(endpoint)

    def archived_objects(env) -> Counter:
        """Objects in the archive bucket by their first path segment (jobs/, archived-jobs/, naive/)."""
        out: Counter = Counter()
        for page in (
            calls.clients["s3"].get_paginator("list_objects_v2").paginate(Bucket=env["RUNS_FLEET_ARCHIVE_BUCKET"])
        ):
            out.update(o["Key"].split("/", 1)[0] + "/" for o in page.get("Contents", []))
        return out

    def once(variant: str, _round: int) -> trials.Run:
        env = reset(endpoint)
        ddb, table = calls.clients["dynamodb"], env["RUNS_FLEET_JOBS_TABLE"]
        old = iso(dt.datetime.now(dt.UTC) - dt.timedelta(days=9))
        statuses = ["completed", "failed", "timeout", "interrupted"]
        items = [{"job_id": f"old-{k}", "status": statuses[k % 4], "completed_at": old} for k in range(n)]
        items += [{"job_id": f"live-{k}", "status": "running"} for k in range(n // 10)]
        for start in range(0, len(items), 25):
            ddb.batch_write_item(
                RequestItems={table: [{"PutRequest": {"Item": to_item(i)}} for i in items[start : start + 25]]}
            )
        calls.reset()
        start = time.perf_counter()
        if variant == "naive":
            kwargs = {"TableName": table}
            cutoff = iso(dt.datetime.now(dt.UTC) - dt.timedelta(days=7))
            while True:
                page = ddb.scan(**kwargs)
                for item in page["Items"]:
                    if (
                        item.get("status", {}).get("S") in statuses
                        and item.get("completed_at", {}).get("S", "z") < cutoff
                    ):
                        calls.clients["s3"].put_object(
                            Bucket=env["RUNS_FLEET_ARCHIVE_BUCKET"], Key=f"naive/{item['job_id']['S']}", Body=b"{}"
                        )
                        ddb.delete_item(TableName=table, Key={"job_id": item["job_id"]})
                if "LastEvaluatedKey" not in page:
                    break
                kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
            reported = n
        else:
            ctx = fleet_context(calls.clients, env)
            tasks = Housekeeping()
            reported = tasks.run(ctx, tasks.parse({"task_type": "old_jobs", "params": {}})).summary["archived"]
        seconds = time.perf_counter() - start
        counted = calls.reset()
        left = ddb.scan(TableName=table, Select="COUNT")["Count"]
        objects = archived_objects(env)
        problems = []
        if left != n // 10:
            problems.append(f"{left} records left, expected the {n // 10} running ones")
        if reported != n:
            problems.append(f"reported {reported} archived, expected {n}")
        if not objects:
            problems.append("nothing archived in S3")
        archive = counted.get("PutObject", 0)
        return trials.Run(seconds, n + (n // 10) - left, problems, calls=sum(counted.values()) - archive,
                          detail=dict(counted), extra={"archive_writes": archive, "objects": objects})  # fmt: skip

    labels = {"naive": "naive: Scan + PutObject + DeleteItem per record", "task": "`old_jobs` task"}
    results = trials.interleaved(["naive", "task"], repeat, once, label="old_jobs / ")
    out = [f"old_jobs: {n} finished records older than 7 days among {n // 10} running ones, every run verified:", ""]
    out += trials.table(results, baseline="naive", unit="records", labels=labels)
    out.append("(calls per item: API calls per deleted record, archive writes excluded)")
    out.append("")
    for key, runs in results.items():
        r = runs[0]
        out.append(
            f"- {labels[key]}: PutObject calls {r.extra['archive_writes']}; objects in the archive bucket by prefix "
            + ", ".join(f"{k} {v}" for k, v in sorted(r.extra["objects"].items()))
            + "; calls: "
            + ", ".join(f"{k} {v}" for k, v in sorted(r.detail.items()))
        )
    if not trials.all_ok(results):
        raise Incomplete("\n".join(out))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--backlog", type=int, default=10000)
    parser.add_argument("--skip", default="", help="comma list of parts to skip: termination,old_jobs")
    parser.add_argument(
        "--plain-backlog",
        action="store_true",
        help="backlog on plain moto (default: patched, see moto_server)",
    )
    parser.add_argument("--old-jobs", type=int, default=3000)
    parser.add_argument(
        "--break-variant",
        choices=VARIANTS,
        default="",
        help="break one termination variant on purpose (drops every 10th message delete): the benchmark must fail",
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds (the variants' order rotates each round)")
    parser.add_argument("--backlog-drain-runs", type=int, default=1, help="RUNS_FLEET_TERMINATION_DRAIN_RUNS")
    parser.add_argument(
        "--patched",
        action="store_true",
        help="termination and old_jobs on moto with the transactions and sqs-retention patches",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so that `finally` stops the moto server
    moto, endpoint = moto_server.start(("transactions", "sqs-retention") if args.patched else ())
    os.environ.update(local_aws_env(endpoint))  # the same variables make dev uses
    print(trials.machine_line("fleet.py"), flush=True)
    try:
        wait_for_endpoint(endpoint, timeout_seconds=300)
        if "termination" not in args.skip:
            print(
                "\n".join(bench_termination(endpoint, args.messages, args.break_variant, args.repeat) + [""]),
                flush=True,
            )
        if "old_jobs" not in args.skip:
            print("\n".join(bench_old_jobs(endpoint, args.old_jobs, args.repeat) + [""]), flush=True)
        if args.backlog:
            lines = bench_backlog(args.backlog, patched=not args.plain_backlog, drain_runs=args.backlog_drain_runs)
            print("\n".join(lines), flush=True)
    except Incomplete as exc:
        print(f"FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        moto_server.stop(moto)
        print(trials.after_line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
