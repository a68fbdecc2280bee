"""Whole runs as a user pays for them, beside the core loop and the bare boto3 loops, in one invocation.

For each capability (termination drain, agenda reclaim, batching) and on one moto server, every
variant starts from the same freshly seeded work, does it, and is then **verified**: all messages
applied and deleted, all stale agendas reclaimed, all records batched. A variant that left work
undone fails the benchmark (exit status 1, ``FAILED`` in its row); its rate divides the work
actually verified done by its time, never the work asked for.

Variants:

- ``naive``: the original systems' per-item loop (the seed's termination handler; POP's reclaim:
  scan + HTTP GET + PUT per item; one conditional UpdateItem per record to lock and another to
  finalize);
- ``bare``: the bare *batched* boto3 loop: batched calls inline, no validation, no Dagster (for
  termination, rounds of 10: 0.60 calls per message);
- ``fair`` (termination only): a bare loop doing what the drain does, rounds of 100 flushed every
  3 rounds (``fleet.fair_batched``, 0.32 calls per message): termination's ratio baseline; the other
  capabilities' baseline is ``bare``;
- ``core``: the capability's plain module call in this process (no Dagster);
- ``cli``: ``dagster job execute -m pipelines.definitions -j <job> -c <config>`` with a fresh
  ``DAGSTER_HOME`` (the repo's ``dagster.yaml``), timed wall-clock end to end: the CLI's start-up,
  the code location's import, the instance, the event log, the run;
- ``daemon``: a real ``dagster-daemon`` (the repo's ``dagster.yaml`` in a temporary
  ``DAGSTER_HOME``) over ``benchmarks/whole_run_defs.py``, started once the work is in place.
  Termination: the product's own ``termination_queue_sensor`` with the job's default config
  (``wait_seconds`` 2, ``max_seconds`` 300). Reclaim and batching: a benchmark sensor launches one
  run of the real job with the CLI's config, through the same daemon, queue, run launcher and run
  worker. ``s`` is from the run's creation to its success (launch, run worker start-up and import,
  the work); ``e2e s`` from the daemon's start (its code server's start-up and the sensor's first
  tick included). The calls counted include the sensor's.

Every variant runs ``--repeat`` times (3), in an order that rotates each round
(``benchmarks/trials.py``); the tables give min / median / max seconds and each ratio per round
(median and range). ``--messages 500,2000`` measures termination at two sizes and fits time =
fixed + n x per message for each variant (the whole-run ratio at 2,000 and 10,000 messages
follows from it); ``--cprofile`` adds one untimed core run per capability under cProfile.

AWS calls are counted by the moto server itself (``count-calls`` in ``benchmarks/moto_server.py``),
so the calls made in a CLI or daemon subprocess are counted too; for the in-process variants a
botocore ``before-call`` hook counts them as well, as a check of the server's count.

``--break`` deliberately breaks every variant (``benchmarks/breaking.py``: a ``sitecustomize`` put
first on ``PYTHONPATH`` for the subprocesses, the same hook in this process): the 2nd, 22nd,
42nd... call of the capability's write operations returns success without reaching the server.
Every variant must then fail its verification, and the benchmark must exit 1.

    .venv/bin/python benchmarks/whole_run.py                      # all three, default sizes
    .venv/bin/python benchmarks/whole_run.py --only termination --messages 2000
    .venv/bin/python benchmarks/whole_run.py --only reclaim --break   # must fail

``--dynamodb-local`` runs reclaim against Amazon's DynamoDB Local (``infra/dynamodb_local.py``)
behind a counting proxy (``benchmarks/counting_proxy.py``), everything else on moto: there the
job writes grouped (``DYNAMODB_GROUPED_WRITES=true``, as in prod), ``core`` uses the grouped
writer and ``bare`` is the bare grouped loop (``BatchExecuteStatement`` of 25 conditional
statements); moto cannot serve that path faithfully (it ignores PartiQL conditions).

    .venv/bin/python benchmarks/whole_run.py --only reclaim --dynamodb-local

Sizes: termination ``--messages`` (2,000), reclaim ``--agendas`` with ``--stale-percent`` (10,000,
20%: 2,000 to reclaim), batching ``--records`` for one receiver (1,000). By default moto runs with
the ``transactions``, ``sqs-retention`` and ``hot-paths`` patches (same API behaviour, see moto_server.py);
``--plain`` runs plain moto (its transaction and receive costs grow with the table and queue).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
CODE_ROOT = ROOT  # --code-root: the checkout whose code the CLI and daemon runs load (e.g. a "before" commit)
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

import boto3  # noqa: E402
import breaking  # noqa: E402
import counting_proxy  # noqa: E402
import moto_server  # noqa: E402
import trials  # noqa: E402
from bench_support import all_pages, start_daemon, stop_daemon  # noqa: E402

from infra.deploy import deploy, wait_for_endpoint  # noqa: E402
from infra.local import local_aws_env  # noqa: E402
from pipelines.common import iso  # noqa: E402
from pipelines.common.aws_batches import chunks  # noqa: E402

SERVICES = ("sqs", "dynamodb", "ssm", "cloudwatch", "s3", "ec2")
BREAK_OPERATIONS = {  # the writes --break skips (the 2nd, 22nd, 42nd... call returns success, does nothing)
    "termination": ("TransactWriteItems", "UpdateItem"),
    "reclaim": ("UpdateItem", "TransactWriteItems", "PutItem", "BatchExecuteStatement"),
    "batching": ("TransactWriteItems", "UpdateItem"),
}


# ----------------------------------------------------------------------------- counting


class HookCalls:
    """Counts the API calls of every boto3 client created in this process while active."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()

    def __enter__(self) -> HookCalls:
        import botocore.client

        self._original = original = botocore.client.BaseClient.__init__
        counts = self.counts

        def init(client, *args, **kwargs):
            original(client, *args, **kwargs)
            client.meta.events.register("before-call.*.*", lambda model, **_: counts.update([model.name]))

        botocore.client.BaseClient.__init__ = init
        return self

    def __exit__(self, *exc) -> None:
        import botocore.client

        botocore.client.BaseClient.__init__ = self._original


def clients(endpoint: str, dynamodb: str | None = None) -> dict:
    """Clients of moto; DynamoDB's of ``dynamodb`` when given (DynamoDB Local behind its counting proxy)."""
    return {
        s: boto3.client(s, endpoint_url=dynamodb if s == "dynamodb" and dynamodb else endpoint, region_name="us-east-1")
        for s in SERVICES
    }


def server_calls(endpoint: str, dynamodb: str | None, *, reset: bool = False) -> dict[str, int]:
    """The calls moto answered, plus those DynamoDB Local's proxy forwarded (when it is used)."""
    out = Counter(moto_server.calls(endpoint, reset=reset))
    if dynamodb:
        out.update(moto_server.calls(dynamodb, reset=reset))
    return dict(out)


def reset_stack(endpoint: str) -> dict[str, str]:
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=120).read()
    env = deploy(boto3.client("cloudformation", endpoint_url=endpoint, region_name="us-east-1"))
    os.environ.update(env)
    return env


# ----------------------------------------------------------------------------- capabilities


@dataclass
class Capability:
    name: str
    job: str
    unit: str
    size: int
    seed: Callable  # (c, env) -> None: the work, before any variant starts
    verify: Callable  # (c, env) -> (done, problems): the work verified done, what is missing
    variants: dict[str, Callable]  # in-process variants: (c, env) -> None
    cli_config: Callable  # env -> run config
    tags: Callable = lambda env: {}
    sensor: str | None = None  # the product's own sensor (daemon variant), else a benchmark sensor
    setup_instance: Callable | None = None  # (home, env) -> None, before a run
    notes: list[str] = field(default_factory=list)
    dynamodb_endpoint: str | None = None  # DynamoDB Local's counting proxy, else moto serves DynamoDB too
    run_env: dict[str, str] = field(default_factory=dict)  # added to the CLI's and the daemon's environment
    baseline: str = "bare"  # the variant the ratios are taken against


# ---- termination (runs-fleet)


def termination(size: int) -> Capability:
    import fleet  # benchmarks/fleet.py: the seed's pattern and the bare batched loop

    def seed(c, env):
        fleet.seed_jobs(c, env, size)  # running jobs, their runner parameters, one message each (20% failures)

    def verify(c, env):
        final = fleet.completed(c, env)
        left = fleet.depth(c, env["RUNS_FLEET_TERMINATION_QUEUE_URL"])
        dead = fleet.depth(c, env["RUNS_FLEET_TERMINATION_DLQ_URL"])
        problems = []
        if final != size:
            problems.append(f"{size - final} of {size} jobs not final")
        if left:
            problems.append(f"{left} message(s) left in the queue")
        if dead:
            problems.append(f"{dead} message(s) dead-lettered")
        return final, problems

    def core(c, env):
        from pipelines.fleet.drain import TerminationLimits, queue_drain
        from pipelines.fleet.termination import TerminationHandler

        ctx = fleet.fleet_context(c, env)
        queue_drain(
            TerminationHandler,
            ctx,
            sqs=c["sqs"],
            queue_url=env["RUNS_FLEET_TERMINATION_QUEUE_URL"],
            dlq_url=env["RUNS_FLEET_TERMINATION_DLQ_URL"],
            run_id=uuid.uuid4().hex[:8],
            limits=TerminationLimits(wait_seconds=0, max_seconds=3600),
        ).run()

    return Capability(
        name="termination",
        job="process_termination_queue",
        unit="messages",
        size=size,
        seed=seed,
        verify=verify,
        variants={
            "naive": lambda c, env: fleet.seed_pattern(c, env),
            "bare": lambda c, env: fleet.bare_batched(c, env),
            "fair": lambda c, env: fleet.fair_batched(c, env),
            "core": core,
        },
        cli_config=lambda env: {"wait_seconds": 0, "max_seconds": 3600},
        sensor="termination_queue_sensor",
        baseline="fair",
        notes=[
            "seed pattern: ReceiveMessage of 10, then 5 calls per message on 5 threads; bare batched loop: rounds "
            "of 10, one TransactWriteItems, DeleteParameters, PutMetricData, DeleteMessageBatch each; the ratio's "
            "baseline is the bare loop doing what the drain does: rounds of 100 (one TransactWriteItems), every 3 "
            "rounds one archive object, DeleteParameters and DeleteMessageBatch of 10, one PutMetricData"
        ],
    )


# ---- reclaim (POP's agenda reclaimer)


def reclaim(size: int, stale_percent: float, dynamodb_local: str | None = None) -> Capability:
    """``dynamodb_local``: DynamoDB Local's (proxy) endpoint: grouped writes there, as in prod."""
    import reclaim as rb  # benchmarks/reclaim.py

    stale_every = round(100 / stale_percent)
    stale = len(range(0, size, stale_every))
    cutoff_age_ms = rb.DAY_MS

    def params(env):
        return {
            "tableName": env["AGENDA_PROGRESS_TABLE"],
            "idFieldName": "id",
            "timeFieldName": "updatedTime",
            "reclaimAgeMinutes": 24 * 60,
            "objectScanLimit": 1000,
            "targetBatchSize": 50,
            "maximumExecutionSeconds": 600,
        }

    def seed(c, env):
        if dynamodb_local:  # the template's table, afresh in DynamoDB Local (moto's copy is not used)
            ddb, table = c["dynamodb"], env["AGENDA_PROGRESS_TABLE"]
            if table in ddb.list_tables()["TableNames"]:
                ddb.delete_table(TableName=table)
            rb.create_table(ddb, table)
        now = int(time.time() * 1000)
        items = [rb.row(n, now, stale_every) for n in range(size)]
        rb.batch_write(c["dynamodb"].meta.endpoint_url, env["AGENDA_PROGRESS_TABLE"], items)

    def count_stale(c, env) -> tuple[int, int]:
        """(stale EXECUTING left, items failed by a reclaim) over the index and a COUNT scan."""
        ddb, table = c["dynamodb"], env["AGENDA_PROGRESS_TABLE"]
        cutoff = int(time.time() * 1000) - cutoff_age_ms
        stale_left = all_pages(
            ddb.query,
            TableName=table,
            IndexName=rb.INDEX,
            Select="COUNT",
            KeyConditionExpression="processingState = :e AND updatedTime < :c",
            ExpressionAttributeValues={":e": {"S": "EXECUTING"}, ":c": {"N": str(cutoff)}},
        )
        left = sum(page["Count"] for page in stale_left)
        failed_pages = all_pages(
            ddb.scan,
            TableName=table,
            Select="COUNT",
            FilterExpression="processingStateMessage = :f",
            ExpressionAttributeValues={":f": {"S": "failed"}},
        )
        return left, sum(page["Count"] for page in failed_pages)

    def verify(c, env):
        left, failed = count_stale(c, env)
        problems = []
        if left:
            problems.append(f"{left} of {stale} stale agendas still EXECUTING")
        if failed != stale - left:
            problems.append(f"{failed} agendas failed, expected {stale - left}")
        return min(failed, stale - left), problems

    def naive(c, env):
        rb.run_baseline(c["dynamodb"].meta.endpoint_url, env["AGENDA_PROGRESS_TABLE"], 1000)

    def stale_pages(ddb, table):
        """Pages of stale EXECUTING items from the index, 1,000 a page."""
        cutoff = int(time.time() * 1000) - cutoff_age_ms
        pages = all_pages(
            ddb.query,
            TableName=table,
            IndexName=rb.INDEX,
            Limit=1000,
            KeyConditionExpression="processingState = :e AND updatedTime < :c",
            ExpressionAttributeValues={":e": {"S": "EXECUTING"}, ":c": {"N": str(cutoff)}},
        )
        for page in pages:
            yield page["Items"]

    def bare(c, env):
        """Query the index for stale EXECUTING items, one conditional UpdateItem each (what the index path does)."""
        ddb, table = c["dynamodb"], env["AGENDA_PROGRESS_TABLE"]
        for items in stale_pages(ddb, table):
            for item in items:
                now = int(time.time() * 1000)
                events = json.loads(item.get("diagnosticEvents", {}).get("S", "[]")) + [
                    {"message": "AgendaProgress timed out.", "time": now}
                ]
                try:
                    ddb.update_item(
                        TableName=table,
                        Key={"id": item["id"]},
                        UpdateExpression="SET processingState = :c, processingStateMessage = :f, updatedTime = :n, "
                        "completedTime = :n, diagnosticEvents = :d",
                        ConditionExpression="processingState = :e AND updatedTime = :seen",
                        ExpressionAttributeValues={
                            ":c": {"S": "COMPLETE"},
                            ":f": {"S": "failed"},
                            ":n": {"N": str(now)},
                            ":d": {"S": json.dumps(events)},
                            ":e": {"S": "EXECUTING"},
                            ":seen": item["updatedTime"],
                        },
                    )
                except ddb.exceptions.ConditionalCheckFailedException:
                    pass

    def bare_grouped(c, env):
        """The same, with the updates sent 25 to a BatchExecuteStatement (what the grouped writer does)."""
        ddb, table = c["dynamodb"], env["AGENDA_PROGRESS_TABLE"]
        statement = (
            f'UPDATE "{table}" SET processingState = ? SET processingStateMessage = ? SET updatedTime = ? '
            "SET completedTime = ? SET diagnosticEvents = ? WHERE id = ? AND processingState = ? AND updatedTime = ?"
        )
        for items in stale_pages(ddb, table):
            statements = []
            for item in items:
                now = int(time.time() * 1000)
                events = json.loads(item.get("diagnosticEvents", {}).get("S", "[]")) + [
                    {"message": "AgendaProgress timed out.", "time": now}
                ]
                statements.append({"Statement": statement, "Parameters": [
                    {"S": "COMPLETE"}, {"S": "failed"}, {"N": str(now)}, {"N": str(now)}, {"S": json.dumps(events)},
                    item["id"], {"S": "EXECUTING"}, item["updatedTime"]]})  # fmt: skip
            for start in range(0, len(statements), 25):
                ddb.batch_execute_statement(Statements=statements[start : start + 25])

    def core(c, env):
        from pipelines.reclaim.engine import SegmentPlan, reclaim_pass
        from pipelines.reclaim.params import parse_params
        from pipelines.reclaim.source import inspect_table
        from pipelines.reclaim.writers import DynamoWriter

        p = parse_params(params(env))
        ddb = c["dynamodb"]
        info = inspect_table(ddb, p)
        writer = DynamoWriter(ddb, p, grouped=bool(dynamodb_local))
        reclaim_pass(ddb, SegmentPlan(p, 0, time.time() + 3600, info), writer, log=rb.QuietLog())

    return Capability(
        name="reclaim",
        job="reclaim_agendas",
        unit="stale agendas",
        size=stale,
        seed=seed,
        verify=verify,
        variants={"naive": naive, "bare": bare_grouped if dynamodb_local else bare, "core": core},
        cli_config=params,
        notes=[
            f"{size:,} AgendaProgress items, {stale:,} stale EXECUTING ({stale_percent:g}%); index path "
            "(processingState-updatedTime-index); naive: POP's scan + HTTP GET + PUT per item through the "
            "local AgendaProgress endpoint",
            "DynamoDB Local 1.25.1 behind a counting proxy (the other services on moto); grouped writes: "
            "BatchExecuteStatement of 25 (bare loop, core, and the job with DYNAMODB_GROUPED_WRITES=true)"
            if dynamodb_local
            else "moto: one conditional UpdateItem per item (the local deployment's writes)",
        ],
        dynamodb_endpoint=dynamodb_local,
        run_env={"AWS_ENDPOINT_URL_DYNAMODB": dynamodb_local, "DYNAMODB_GROUPED_WRITES": "true"}
        if dynamodb_local
        else {},
    )


# ---- batching (ReportStream)

RECEIVER = "bench-000"


def batching(size: int) -> Capability:
    import batching as bb  # benchmarks/batching.py

    today = dt.datetime.now(dt.UTC).date().isoformat()

    def seed(c, env):
        # Records created before this hour's batch time (the receiver batches hourly from 00:00), so
        # that a run now sends them all in the batch that is due.
        hour = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
        bb.load(c["dynamodb"], env, 1, size, tick=hour)

    def verify(c, env):
        from pipelines.batching import store

        ddb = c["dynamodb"]
        pending = len(store.query_pending(ddb, env["BATCH_RECORDS_TABLE"], RECEIVER))
        finalized = all_pages(
            ddb.scan,
            TableName=env["BATCH_RECORDS_TABLE"],
            Select="COUNT",
            FilterExpression="attribute_exists(batch_id) AND attribute_not_exists(next_action)",
        )
        batched = sum(page["Count"] for page in finalized)
        lines = 0
        for page in c["s3"].get_paginator("list_objects_v2").paginate(Bucket=env["BATCH_OUTBOX_BUCKET"]):
            for obj in page.get("Contents", []):
                if obj["Key"].endswith(".jsonl"):
                    body = c["s3"].get_object(Bucket=env["BATCH_OUTBOX_BUCKET"], Key=obj["Key"])["Body"].read()
                    lines += len([x for x in body.splitlines() if x.strip()])
        problems = []
        if pending:
            problems.append(f"{pending} of {size} records still pending")
        if batched != size:
            problems.append(f"{batched} records batched and finalized, expected {size}")
        if lines != size:
            problems.append(f"{lines} record lines in the outbox files, expected {size}")
        return min(batched, lines), problems

    def settings(env):
        from pipelines.batching.batcher import BatchSettings

        return BatchSettings(
            receivers_table=env["RECEIVERS_TABLE"],
            records_table=env["BATCH_RECORDS_TABLE"],
            outbox_bucket=env["BATCH_OUTBOX_BUCKET"],
        )

    def core(c, env):
        from pipelines.batching.batcher import ReceiverBatcher

        ReceiverBatcher(c["dynamodb"], c["s3"], settings(env)).run(RECEIVER, today, now=dt.datetime.now(dt.UTC))

    def naive(c, env):
        bb.naive_batch(c["dynamodb"], c["s3"], env, RECEIVER, before=iso(dt.datetime.now(dt.UTC)))

    def bare(c, env):
        """The batcher's grouped calls inline: one query, locks in transactions of 100, a file, final
        updates in transactions of 100 (no lease, no ledger, no validation)."""
        from pipelines.batching import store

        ddb, table = c["dynamodb"], env["BATCH_RECORDS_TABLE"]

        def update_all(group: list[dict], update: str, condition: str, values: dict) -> None:
            ddb.transact_write_items(
                TransactItems=[
                    {
                        "Update": {
                            "TableName": table,
                            "Key": {"record_id": {"S": i["record_id"]}},
                            "UpdateExpression": update,
                            "ConditionExpression": condition,
                            "ExpressionAttributeValues": values,
                        }
                    }
                    for i in group
                ]
            )

        before = iso(dt.datetime.now(dt.UTC))
        items = [i for i in store.query_pending(ddb, table, RECEIVER) if i["created_at"] < before]
        for n, group in enumerate(chunks(items, bb.MAX_BATCH_SIZE), start=1):
            batch = f"{RECEIVER}/bare/{n}"
            lock = "next_action = :n AND attribute_not_exists(batch_id)"
            update_all(group, "SET batch_id = :b", lock, {":b": {"S": batch}, ":n": {"S": "BATCH"}})
            store.put_file(
                c["s3"],
                env["BATCH_OUTBOX_BUCKET"],
                f"bare/{RECEIVER}/{n}.jsonl",
                [store.record_line(i, batch) for i in group],
            )
            update_all(group, "REMOVE next_action, pending_receiver", "batch_id = :b", {":b": {"S": batch}})

    def setup_instance(home: Path, env: dict[str, str]) -> None:
        code = f"import dagster as dg; dg.DagsterInstance.get().add_dynamic_partitions('receivers', [{RECEIVER!r}])"
        subprocess.run(
            [sys.executable, "-c", code], env={**env, "DAGSTER_HOME": str(home)}, check=True, capture_output=True
        )

    return Capability(
        name="batching",
        job="receiver_batches_job",
        unit="records",
        size=size,
        seed=seed,
        verify=verify,
        variants={"naive": naive, "bare": bare, "core": core},
        cli_config=lambda env: {"ops": {"receiver_batches": {"config": {"dry_run": False}}}},
        tags=lambda env: {
            "dagster/partition": f"{today}|{RECEIVER}",
            "dagster/partition/day": today,
            "dagster/partition/receiver": RECEIVER,
        },
        setup_instance=setup_instance,
        notes=[
            f"one receiver, {size:,} pending records, max_batch_size {bb.MAX_BATCH_SIZE}, the day's first run "
            "(the day's earlier empty batch times go to the ledger too); naive: one conditional UpdateItem per "
            "record to lock and another to finalize"
        ],
    )


# ----------------------------------------------------------------------------- runners


def subprocess_env(endpoint: str, env: dict[str, str], home: Path, broken: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE",)}
    out.update(local_aws_env(endpoint))
    out.update(env)
    out["DAGSTER_HOME"] = str(home)
    out["PYTHONPATH"] = str(CODE_ROOT)
    if broken:
        out.update(breaking.env_for(broken, home, str(CODE_ROOT)))
    return out


def fresh_home(base: Path, label: str, broken: str) -> Path:
    home = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=base))
    shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")
    with open(home / "dagster.yaml", "a") as f:
        f.write("\ntelemetry:\n  enabled: false\n")
    return home


def run_cli(
    cap: Capability,
    endpoint: str,
    env: dict[str, str],
    home: Path,
    broken: str,
    profile: bool = False,
    cprofile: Path | None = None,
) -> dict:
    config = home / "config.json"
    config.write_text(json.dumps(cap.cli_config(env)))
    cmd = [
        sys.executable,
        "-m",
        "dagster",
        "job",
        "execute",
        "-m",
        "pipelines.definitions",
        "-j",
        cap.job,
        "-c",
        str(config),
    ]
    tags = cap.tags(env)
    if tags:
        cmd += ["--tags", json.dumps(tags)]
    sub_env = subprocess_env(endpoint, env, home, broken)
    if cap.setup_instance:
        cap.setup_instance(home, sub_env)
    if cprofile:  # the CLI's process (the run is in process) under cProfile
        cmd = [sys.executable, "-m", "cProfile", "-o", str(cprofile), *cmd[1:]]
    if profile:  # every process of the run (the CLI and anything it starts), 100 samples a second
        cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "--subprocesses", "--rate", "100",
               "--format", "raw", "--output", str(home / "profile.txt"), "--", *cmd]  # fmt: skip
    server_calls(endpoint, cap.dynamodb_endpoint, reset=True)
    start, started_at = time.perf_counter(), time.time()
    with open(home / "cli.log", "wb") as log:
        rc = subprocess.run(cmd, cwd=CODE_ROOT, env=sub_env, stdout=log, stderr=subprocess.STDOUT).returncode
    seconds, ended_at = time.perf_counter() - start, time.time()
    calls = server_calls(endpoint, cap.dynamodb_endpoint)
    out = {"seconds": seconds, "server_calls": calls, "rc": rc, "log": home / "cli.log"}
    out["phases"] = run_phases(home, started_at, ended_at)
    if profile:
        out["profile"] = profile_breakdown(home / "profile.txt")
    return out


def run_phases(home: Path, started_at: float, ended_at: float) -> dict[str, float]:
    """The CLI's wall time split at the run's RUN_START and RUN_SUCCESS/FAILURE (its event log):
    ``startup`` (CLI, imports, instance, run creation), ``run``, ``exit`` (after the run's last event)."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(home))
    try:
        runs = instance.get_runs(limit=1)
        if not runs:
            return {}
        stats = instance.get_run_stats(runs[0].run_id)
        if not stats.start_time or not stats.end_time:
            return {}
        return {
            "startup": stats.start_time - started_at,
            "run": stats.end_time - stats.start_time,
            "exit": ended_at - stats.end_time,
        }
    finally:
        instance.dispose()


# Where a sample's time goes, by the first rule that matches its stack (root first).
PROFILE_RULES = (
    ("module imports", lambda frames: any("_find_and_load" in f for f in frames)),
    # a pool thread waiting for work, a thread waiting on a condition, a socket waiting for moto's answer
    ("waiting (idle pool threads, reading moto's answers)",
     lambda frames: any(k in frames[-1] for k in ("_worker (concurrent", "Condition.wait", "readinto", "do_poll"))),
    ("botocore", lambda frames: "botocore/" in frames[-1] or "boto3/" in frames[-1]),
    ("urllib3, http, sockets",
     lambda frames: any(k in frames[-1] for k in ("urllib3/", "http/client", "socket", "ssl"))),
    ("Dagster event log and storage (SQLAlchemy, SQLite)",
     lambda frames: any(k in f for f in frames for k in ("sqlalchemy/", "sqlite", "event_log", "_core/storage"))),
    ("Groundskeeper's own code", lambda frames: any(k in frames[-1] for k in ("pipelines/", "resources/"))),
    ("Dagster execution and CLI", lambda frames: any("dagster" in f for f in frames)),
    ("other (Python, threads, json, ...)", lambda frames: True),
)  # fmt: skip


def profile_breakdown(path: Path) -> dict[str, float]:
    """Share of py-spy's samples (all processes, all threads, CPU only) per category of PROFILE_RULES."""
    shares: Counter = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith("process ")]  # py-spy's per-process root
        if not frames:
            continue
        category = next(name for name, rule in PROFILE_RULES if rule(frames))
        shares[category] += int(count)
        total += int(count)
    return {name: shares[name] / total for name, _ in PROFILE_RULES} if total else {}


DAEMON_TIMEOUT = 900  # seconds from daemon start to a finished run


def run_daemon(cap: Capability, endpoint: str, env: dict[str, str], home: Path, broken: str, c: dict) -> dict:
    import dagster as dg

    sub_env = subprocess_env(endpoint, env, home, broken)
    sub_env["WHOLE_RUN_JOB"] = cap.job
    if cap.sensor:
        sub_env["WHOLE_RUN_SENSOR"] = cap.sensor
    else:
        sub_env["WHOLE_RUN_CONFIG"] = json.dumps(cap.cli_config(env))
        sub_env["WHOLE_RUN_TAGS"] = json.dumps(cap.tags(env))
    if cap.setup_instance:
        cap.setup_instance(home, sub_env)
    instance = dg.DagsterInstance.from_config(str(home))
    server_calls(endpoint, cap.dynamodb_endpoint, reset=True)
    daemon = start_daemon(home, BENCH / "whole_run_defs.py", "whole_run", cwd=CODE_ROOT, env=sub_env)
    started = time.perf_counter()
    try:
        while True:
            _alive(daemon, home, started)
            runs = instance.get_runs()
            done = [r for r in runs if r.is_finished]
            if done:
                break
            time.sleep(0.5)
        e2e = time.perf_counter() - started
        counted = server_calls(endpoint, cap.dynamodb_endpoint)
        run = done[0]
        record = instance.get_run_record_by_id(run.run_id)
        stats = instance.get_run_stats(run.run_id)
        created = record.create_timestamp.timestamp()
        seconds = (stats.end_time or time.time()) - created
        return {
            "seconds": seconds,
            "e2e": e2e,
            "server_calls": counted,
            "rc": 0 if run.status.value == "SUCCESS" else 1,
            "runs": len(runs),
            "status": run.status.value,
            "log": home / "daemon.log",
        }
    finally:
        stop_daemon(daemon)
        instance.dispose()


def _alive(daemon: subprocess.Popen, home: Path, started: float) -> None:
    if time.perf_counter() - started > DAEMON_TIMEOUT:
        raise RuntimeError(f"no finished run after {DAEMON_TIMEOUT}s; see {home / 'daemon.log'}")
    if daemon.poll() is not None:
        raise RuntimeError(f"dagster-daemon exited with {daemon.returncode}; see {home / 'daemon.log'}")


LABELS = {
    "naive": "naive per-item loop (the original system's pattern)",
    "bare": "bare batched boto3 loop",
    "fair": "bare loop doing what the drain does (rounds of 100, flushed every 3)",
    "core": "core loop: plain module call, in process",
    "cli": "whole run: `dagster job execute` (wall clock, CLI start to exit)",
    "daemon": "whole run: launched by a sensor under `dagster-daemon` (run creation to its end)",
    "profile": "whole run: `dagster job execute` under py-spy (slower: not a throughput figure)",
}
SUBPROCESS_VARIANTS = ("cli", "daemon", "profile")


def measure(
    cap: Capability, endpoint: str, variants: list[str], work: Path, broken: bool, repeat: int
) -> dict[str, list[trials.Run]]:
    """Every variant of ``cap`` ``repeat`` times, in rotating order, each from fresh work, each verified."""
    operations = ",".join(BREAK_OPERATIONS[cap.name]) if broken else ""
    variants = [v for v in variants if v in cap.variants or v in SUBPROCESS_VARIANTS]

    def once(variant: str, round_index: int) -> trials.Run:
        env = {**reset_stack(endpoint), **cap.run_env}
        c = clients(endpoint, cap.dynamodb_endpoint)
        cap.seed(c, env)
        note, extra = "", {}
        if variant in cap.variants:
            uninstall = breaking.install(operations) if broken else None
            server_calls(endpoint, cap.dynamodb_endpoint, reset=True)
            with HookCalls() as hook_counter:
                start = time.perf_counter()
                try:
                    cap.variants[variant](clients(endpoint, cap.dynamodb_endpoint), env)
                except Exception as exc:  # a broken variant may also crash: record it, verify what was done
                    note = f"raised {type(exc).__name__}: {str(exc)[:120]}"
                seconds = time.perf_counter() - start
            server = server_calls(endpoint, cap.dynamodb_endpoint)
            if uninstall:
                uninstall()
            hook = sum(hook_counter.counts.values())
            if hook != sum(server.values()):
                extra["hook_mismatch"] = f"botocore hook counted {hook} calls, the server {sum(server.values())}"
        else:
            home = fresh_home(work, f"{cap.name}-{variant}-{round_index}", operations)
            if variant in ("cli", "profile"):
                out = run_cli(cap, endpoint, env, home, operations, profile=variant == "profile")
                extra["phases"] = out["phases"]
                if variant == "profile":
                    extra["profile"] = out["profile"]
            else:
                out = run_daemon(cap, endpoint, env, home, operations, c)
                note = f"{out['runs']} run(s), {out['status']}"
                extra["e2e"] = out["e2e"]
            seconds, server = out["seconds"], out["server_calls"]
            if out["rc"] != 0:
                note = (note + "; " if note else "") + f"exit status {out['rc']}, see {out['log']}"
        done, problems = cap.verify(c, env)
        if note.startswith("raised") or "exit status" in note:
            problems = [*problems, note]
        return trials.Run(seconds, done, problems, calls=sum(server.values()), detail=server, note=note, extra=extra)

    return trials.interleaved(variants, repeat, once, label=f"{cap.name} / ")


def table(cap: Capability, results: dict[str, list[trials.Run]]) -> tuple[list[str], bool]:
    baseline = cap.baseline if cap.baseline in results else None
    out = [f"#### {cap.name}: {cap.size:,} {cap.unit}", ""]
    out += [f"- {n}" for n in cap.notes]
    out += [""] + trials.table(results, baseline=baseline, unit=cap.unit, labels=LABELS, digits=1) + [""]
    for variant, runs in results.items():
        first = next((r for r in runs if r.ok), runs[0])
        detail = ", ".join(f"{k} {v}" for k, v in sorted(first.detail.items()))
        line = f"- {variant} calls: {detail}"
        phases = [r.extra["phases"] for r in runs if r.extra.get("phases")]
        if phases:
            parts = {k: trials.spread([p[k] for p in phases]) for k in ("startup", "run", "exit")}
            line += (
                f" (median (range) over {len(phases)} runs: start-up {parts['startup'].fmt(1)} s, run "
                f"{parts['run'].fmt(1)} s, exit {parts['exit'].fmt(1)} s)"
            )
        e2e = [r.extra["e2e"] for r in runs if r.extra.get("e2e")]
        if e2e:
            line += f" (from the daemon's start to the run's end: {trials.spread(e2e).fmt(1)} s)"
        mismatches = {r.extra["hook_mismatch"] for r in runs if r.extra.get("hook_mismatch")}
        if mismatches:
            line += "; " + "; ".join(sorted(mismatches))
        for r in runs:
            if r.extra.get("profile"):
                line += "; samples: " + "; ".join(f"{k} {v:.0%}" for k, v in r.extra["profile"].items())
        out.append(line)
    return out, trials.all_ok(results)


def fit(by_size: dict[int, dict[str, list[trials.Run]]], baseline: str) -> list[str]:
    """time = fixed + n x per_item from each variant's median seconds at the two sizes; the per-item
    part against the baseline's, and the whole-run ratio it gives at 2,000 and 10,000 items."""
    sizes = sorted(by_size)[:1] + sorted(by_size)[-1:]
    if len(set(sizes)) < 2:
        return []
    n1, n2 = sizes
    med = {(n, v): trials.spread([r.seconds for r in runs if r.ok]) for n in sizes for v, runs in by_size[n].items()}
    variants = [v for v in by_size[n2] if med.get((n1, v)) and med.get((n2, v))]
    if baseline not in variants:
        return []
    coef = {}
    for v in variants:
        per = (med[(n2, v)].median - med[(n1, v)].median) / (n2 - n1)
        coef[v] = (med[(n1, v)].median - per * n1, per)
    out = [
        f"Fit of the median seconds at {n1:,} and {n2:,}: time = fixed + n x per item.",
        "",
        f"| variant | fixed s | per item ms | per item vs {baseline} | whole-run ratio at 2,000 "
        f"(rate vs {baseline}) | at 10,000 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    bf, bp = coef[baseline]
    for v in variants:
        fixed, per = coef[v]
        at = [(bf + n * bp) / (fixed + n * per) for n in (2000, 10_000)]
        out.append(
            f"| {LABELS.get(v, v)} | {fixed:.1f} | {per * 1000:.2f} | {per / bp:.2f}x | {at[0]:.2f} | {at[1]:.2f} |"
        )
    return out


def cprofile_runs(cap: Capability, endpoint: str, work: Path, top: int = 30) -> list[str]:
    """One more core run under cProfile, and one CLI run with its process under cProfile (neither
    timed): where their time goes."""
    import cProfile
    import io
    import pstats

    def stats_lines(stats: pstats.Stats, title: str) -> list[str]:
        out = []
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            stats.stream = buf
            stats.sort_stats(key).print_stats(top)
            body = [x for x in buf.getvalue().splitlines() if x.strip()]
            first = next((k for k, x in enumerate(body) if x.lstrip().startswith("ncalls")), 0)
            out += ["", f"{title}, top {top} by {key}:", "```", *body[first:], "```"]
        return out

    out = []
    env = {**reset_stack(endpoint), **cap.run_env}
    c = clients(endpoint, cap.dynamodb_endpoint)
    cap.seed(c, env)
    profiler = cProfile.Profile()
    profiler.enable()
    cap.variants["core"](clients(endpoint, cap.dynamodb_endpoint), env)
    profiler.disable()
    done, problems = cap.verify(c, env)
    title = f"cProfile of the {cap.name} core loop ({done:,} {cap.unit} verified: {'ok' if not problems else problems})"
    out += stats_lines(pstats.Stats(profiler), title)

    env = {**reset_stack(endpoint), **cap.run_env}
    c = clients(endpoint, cap.dynamodb_endpoint)
    cap.seed(c, env)
    home = fresh_home(work, f"{cap.name}-cprofile", "")
    result = run_cli(cap, endpoint, env, home, "", cprofile=home / "cli.prof")
    done, problems = cap.verify(c, env)
    title = (
        f"cProfile of the {cap.name} CLI run's process ({done:,} {cap.unit} verified: "
        f"{'ok' if not problems else problems}; {result['seconds']:.1f} s under the profiler)"
    )
    out += stats_lines(pstats.Stats(str(home / "cli.prof")), title)
    return out


def _head(path: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path, capture_output=True, text=True)
    return out.stdout.strip() or "not a git checkout"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="termination,reclaim,batching")
    parser.add_argument("--variants", default="naive,bare,fair,core,cli,daemon")
    parser.add_argument("--messages", default="2000", help="termination sizes, comma separated (two: a fit)")
    parser.add_argument("--agendas", type=int, default=10_000)
    parser.add_argument("--stale-percent", type=float, default=20.0)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the variants' order rotates each round")
    parser.add_argument("--cprofile", action="store_true", help="then one core run per capability under cProfile")
    parser.add_argument(
        "--plain", action="store_true", help="plain moto (default: transactions, sqs-retention, hot-paths)"
    )
    parser.add_argument("--break", dest="broken", action="store_true", help="break every variant: must fail")
    parser.add_argument("--dynamodb-local", action="store_true", help="reclaim on DynamoDB Local, grouped writes")
    parser.add_argument("--code-root", type=Path, default=ROOT, help="checkout the CLI and daemon runs load")
    args = parser.parse_args()
    global CODE_ROOT
    CODE_ROOT = args.code_root.resolve()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    patches = ("count-calls",) if args.plain else ("count-calls", "transactions", "sqs-retention", "hot-paths")
    work = Path(tempfile.mkdtemp(prefix="whole-run-"))
    lines = [
        trials.machine_line("whole_run.py")
        + f"; moto {'plain' if args.plain else 'with the transactions, sqs-retention and hot-paths patches'}"
        + f"; code {_head(CODE_ROOT)}"
        + ("; **--break: every variant deliberately loses writes**" if args.broken else ""),
        "",
    ]
    moto, endpoint = moto_server.start(patches, log=open(work / "moto.log", "wb"))
    os.environ.update(local_aws_env(endpoint))
    stack = contextlib.ExitStack()
    local = None
    if args.dynamodb_local:
        from infra import dynamodb_local

        target = stack.enter_context(dynamodb_local.running())
        proxy, local = counting_proxy.start(target)
        stack.callback(moto_server.stop, proxy)
        dynamodb_local.wait_until_serving(local, proxy)
    caps = {
        "termination": [lambda n=int(n): termination(n) for n in args.messages.split(",")],
        "reclaim": [lambda: reclaim(args.agendas, args.stale_percent, local)],
        "batching": [lambda: batching(args.records)],
    }
    all_ok = True
    try:
        wait_for_endpoint(endpoint, timeout_seconds=120)
        for name in args.only.split(","):
            by_size = {}
            for make in caps[name]:
                cap = make()
                results = measure(cap, endpoint, args.variants.split(","), work, args.broken, args.repeat)
                by_size[cap.size] = results
                out, ok = table(cap, results)
                all_ok = all_ok and ok
                lines += out + [""]
                print("\n".join(out) + "\n", file=sys.stderr, flush=True)
            if len(by_size) > 1:
                out = fit(by_size, cap.baseline)
                lines += out + [""]
                print("\n".join(out) + "\n", file=sys.stderr, flush=True)
            if args.cprofile and "core" in cap.variants:
                out = cprofile_runs(cap, endpoint, work)
                lines += out + [""]
    finally:
        moto_server.stop(moto)
        stack.close()
    lines.append(trials.after_line() + f"; work files in {work}")
    print("\n".join(lines))
    if not all_ok:
        print("\nWHOLE RUN BENCHMARK FAILED: a variant did not do all its work (see the check column).")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
