"""The cluster profile: the same work on 1 Celery worker and on 2.

- reclaim: a ``reclaim_agendas`` scan in ``--segments`` (default 8) parallel-scan segments of an
  AgendaProgress table without the GSI (``--items``, default 200,000; ``--stale-percent`` of them
  stuck, failed by the run);
- termination: a backlog of ``--messages`` (default 5,000) termination messages drained by
  ``--drains`` (default 2) ``process_termination_queue`` runs at once (competing consumers).

Each is run with only ``w1`` up and with ``w1`` and ``w2`` (the work put back as it was before
every run), ``--repeat`` times, the two variants interleaved (1, 2; then 2, 1; ...), so that a
change in the machine's load hits both alike; the median run of each is compared. Every run's work
is checked: all stale agendas failed (none left EXECUTING as seeded), every message applied, the
queue empty and no bench job left running; a run that fell short stops the benchmark.

Runs go through ``dagster job execute`` with ``DAGSTER_DEPLOYMENT=cluster``: the run's process
orchestrates, its steps are Celery tasks. The seconds are a run's own (its start to its end in the
run storage; for the drains, the first start to the last end); the ratio is the speedup. CPU
seconds of moto and of the workers are read from /proc (psutil) around each run, to show what
bounds it: moto serves every AWS call from one Python process (one core at most), the machine has
two.

``--latency-ms N`` puts ``benchmarks/latency_proxy.py`` between the runs and workers and moto:
every AWS request waits N ms more, as over a network (15: about a round trip to a real AWS
region). Seeding and checking go to moto directly.

``--dynamodb moto`` serves DynamoDB from a moto process of its own, ``--dynamodb local`` from
DynamoDB Local (``infra/dynamodb_local.py``: Amazon's emulator, a JVM with threads of its own);
every other service stays on the first moto (``--dynamodb shared``, the default: one moto for
all). The DynamoDB server gets the stack's tables as deployed into the first moto (the same
key schemas and indexes), and boto3 sends DynamoDB's requests to ``AWS_ENDPOINT_URL_DYNAMODB``,
behind a latency proxy of its own. On AWS each service is a fleet of its own; one moto process
serving them all is one Python process (one core at most, one GIL) that every call of both
workers queues for.

Needs the local RabbitMQ (a vhost of its own, removed at the end) and PostgreSQL on 127.0.0.1:5432
(a database of its own, dropped at the end). Moto runs with the ``transactions``,
``sqs-retention``, ``sqs-deletes``, ``hot-paths`` and ``ec2-tags`` patches of
``benchmarks/moto_server.py`` (performance only, same API behaviour; ``sqs-deletes`` makes two
drains' deletes as safe as SQS's).

    PYTHONPATH=. .venv/bin/python benchmarks/cluster.py [--items 200000] [--messages 5000]
    PYTHONPATH=. .venv/bin/python benchmarks/cluster.py --latency-ms 15 --repeat 3 \\
        --items 2000 --stale-percent 50 --segments 4 --messages 2000 --dynamodb local
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import boto3
import psutil
import psycopg2

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import latency_proxy  # noqa: E402
import moto_server  # noqa: E402

from infra import cluster as cl  # noqa: E402
from infra import dynamodb_local  # noqa: E402
from infra.deploy import deploy, wait_for_endpoint  # noqa: E402
from pipelines.common import iso, to_item  # noqa: E402
from pipelines.common.summary import run_counters  # noqa: E402

TABLE = "POP-ProgressAgenda-bench"
SEGMENTS = 8


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def rabbit(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=120)


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def busy_seconds(times) -> float:
    """CPU-seconds the machine's cores spent busy (all but idle and iowait) since boot."""
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def batch_put(ddb, table: str, items: list[dict], threads: int = 4) -> None:
    def put(part: list[dict]) -> None:
        for start in range(0, len(part), 25):
            request = {table: [{"PutRequest": {"Item": to_item(i)}} for i in part[start : start + 25]]}
            while request:
                request = ddb.batch_write_item(RequestItems=request).get("UnprocessedItems") or None

    size = (len(items) + threads - 1) // threads
    with cf.ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, [items[k : k + size] for k in range(0, len(items), size)]))


def termination_backlog(env: dict, count: int) -> None:
    ddb, sqs = boto3.client("dynamodb"), boto3.client("sqs")
    now = dt.datetime.now(dt.UTC)
    jobs = [
        {
            "job_id": f"bench-job-{n:06d}",
            "instance_id": f"i-{n:08x}",
            "pool": "linux-small",
            "status": "running",
            "started_at": iso(now - dt.timedelta(minutes=5)),
        }
        for n in range(count)
    ]
    batch_put(ddb, env["RUNS_FLEET_JOBS_TABLE"], jobs)
    bodies = [
        json.dumps(
            {
                "instance_id": j["instance_id"],
                "job_id": j["job_id"],
                "status": "success",
                "exit_code": 0,
                "duration_seconds": 120,
                "started_at": iso(now - dt.timedelta(minutes=2)),
                "completed_at": iso(now),
                "error": "",
            }
        )
        for j in jobs
    ]

    def send(part: list[str]) -> None:
        for start in range(0, len(part), 10):
            entries = [{"Id": str(k), "MessageBody": b} for k, b in enumerate(part[start : start + 10])]
            sqs.send_message_batch(QueueUrl=env["RUNS_FLEET_TERMINATION_QUEUE_URL"], Entries=entries)

    size = (len(bodies) + 3) // 4
    with cf.ThreadPoolExecutor(4) as pool:
        list(pool.map(send, [bodies[k : k + size] for k in range(0, len(bodies), size)]))


class Bench:
    def __init__(self, env: dict, home: Path, logs: Path, server_pids: list[int]) -> None:
        self.env, self.home, self.logs, self.server_pids = env, home, logs, server_pids
        self.workers: dict[str, subprocess.Popen] = {}
        self.config_path = cl.write_worker_config(home / "celery.yaml", env["CELERY_BROKER_URL"])

    def workers_up(self, names: tuple[str, ...]) -> None:
        for name, proc in list(self.workers.items()):
            if name not in names:
                cl.stop(proc)
                del self.workers[name]
        for name in names:
            if name not in self.workers:
                (self.logs / f"{name}.log").write_text("")
                self.workers[name] = cl.start_worker(name, self.env, self.config_path, self.logs / f"{name}.log")
        for name in names:
            cl.wait_worker_ready(self.workers[name], name, self.logs / f"{name}.log")

    def execute(self, job: str, config: dict, copies: int = 1) -> dict:
        """``copies`` runs of ``job`` at once (``dagster job execute``); their span and CPU use."""
        import dagster as dg

        path = self.home / f"{job}-{uuid.uuid4().hex[:6]}.json"
        path.write_text(json.dumps(config))
        tag = uuid.uuid4().hex[:8]
        args = [str(cl.BIN / "dagster"), "job", "execute", "-m", "pipelines.definitions", "-j", job, "-c", str(path)]
        args += ["--tags", json.dumps({"bench": tag})]
        workers = [p.pid for p in self.workers.values()]
        server_cpu = [cpu_seconds([pid]) for pid in self.server_pids]
        worker_cpu = cpu_seconds(workers)
        machine, wall = psutil.cpu_times(), time.monotonic()
        procs = [
            subprocess.Popen(args, env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(copies)
        ]
        for proc in procs:
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"{job} failed: {err.decode()[-2000:]}")
        server_cpu = [cpu_seconds([pid]) - before for pid, before in zip(self.server_pids, server_cpu, strict=True)]
        worker_cpu = cpu_seconds(workers) - worker_cpu
        machine_busy = busy_seconds(psutil.cpu_times()) - busy_seconds(machine)
        wall = time.monotonic() - wall
        with dg.DagsterInstance.from_config(str(self.home)) as instance:
            records = instance.get_run_records(dg.RunsFilter(tags={"bench": tag}))
            assert len(records) == copies and all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in records)
            counts: dict[str, int] = {}
            for r in records:
                for key, value in run_counters(r.dagster_run.tags).items():
                    counts[key] = counts.get(key, 0) + value
            used = set()
            for r in records:
                used |= {w.split("@")[0] for w in cl.step_workers(instance, r.dagster_run.run_id).values()}
        span = max(r.end_time for r in records) - min(r.start_time for r in records)
        return {
            "seconds": span,
            "server_cpu": sum(server_cpu),
            "server_cpu_each": server_cpu,
            "worker_cpu": worker_cpu,
            "machine_cores": machine_busy / wall,  # over the commands' whole life, their start and exit too
            "counts": counts,
            "workers": used,
        }


def stuck_left(ddb, table: str, stale: list[dict]) -> int:
    """How many of the ``stale`` agendas are still EXECUTING as seeded (0 once a reclaim has failed them)."""
    wanted = {row["id"]: row["updatedTime"] for row in stale}
    left = 0
    for page in ddb.get_paginator("scan").paginate(
        TableName=table, ProjectionExpression="id, processingState, updatedTime"
    ):
        for item in page["Items"]:
            key = item["id"]["S"]
            if key in wanted and item["processingState"]["S"] == "EXECUTING":
                left += int(item["updatedTime"]["N"]) == wanted[key]
    return left


def backlog_left(env: dict, count: int) -> tuple[int, int]:
    """(messages still in the termination queue, bench jobs still running) after a drain."""
    ddb, sqs = boto3.client("dynamodb"), boto3.client("sqs")
    attrs = sqs.get_queue_attributes(
        QueueUrl=env["RUNS_FLEET_TERMINATION_QUEUE_URL"],
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    queued = sum(int(v) for v in attrs.values())
    running = 0
    for page in ddb.get_paginator("scan").paginate(
        TableName=env["RUNS_FLEET_JOBS_TABLE"],
        ProjectionExpression="job_id, #s",
        ExpressionAttributeNames={"#s": "status"},
    ):
        running += sum(
            1 for i in page["Items"] if i["job_id"]["S"].startswith("bench-job-") and i["status"]["S"] == "running"
        )
    return queued, running


def leftovers(env: dict, patience: float = 400) -> list[dict]:
    """What a drain left in the termination queue, once visible again (at most ``patience`` s): each
    message's job id, receive count and send time, to tell a copy sent twice from one never handled."""
    sqs = boto3.client("sqs")
    url = env["RUNS_FLEET_TERMINATION_QUEUE_URL"]
    found: list[dict] = []
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=["All"]).get(
            "Messages", []
        )
        for m in got:
            found.append(
                {
                    "job_id": json.loads(m["Body"]).get("job_id"),
                    "receives": m["Attributes"].get("ApproximateReceiveCount"),
                    "sent": m["Attributes"].get("SentTimestamp"),
                    "first_received": m["Attributes"].get("ApproximateFirstReceiveTimestamp"),
                }
            )
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        if (
            not got
            and attrs["ApproximateNumberOfMessages"] == "0"
            and attrs["ApproximateNumberOfMessagesNotVisible"] == "0"
        ):
            break
        time.sleep(2)
    return found


def variant_order(repeat: int) -> list[tuple[str, ...]]:
    """1 worker, 2 workers; then 2, 1; then 1, 2... (interleaved, so that a change of load hits both)."""
    order: list[tuple[str, ...]] = []
    for rep in range(repeat):
        pair = [("w1",), ("w1", "w2")]
        order += pair if rep % 2 == 0 else pair[::-1]
    return order


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=200_000, help="agendas in the reclaim table")
    parser.add_argument("--stale-percent", type=float, default=5.0, help="of them stuck, failed by the run")
    parser.add_argument("--segments", type=int, default=SEGMENTS, help="reclaim's parallel-scan segments")
    parser.add_argument("--messages", type=int, default=5_000, help="termination backlog of each drain")
    parser.add_argument("--drains", type=int, default=2, help="process_termination_queue runs started together")
    parser.add_argument("--concurrency", type=int, default=4, help="each drain's concurrency")
    parser.add_argument("--latency-ms", type=float, default=0, help="network latency added to every AWS request")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each variant (the median is reported)")
    parser.add_argument("--work", default="reclaim,termination", help="reclaim, termination or both")
    parser.add_argument(
        "--dynamodb",
        choices=("shared", "moto", "local"),
        default="shared",
        help="DynamoDB from the one moto (shared), a moto of its own, or DynamoDB Local",
    )
    args = parser.parse_args()
    works = [w.strip() for w in args.work.split(",") if w.strip()]

    tag = uuid.uuid4().hex[:8]
    vhost, db = f"groundskeeper-bench-{tag}", f"groundskeeper_bench_{tag}"
    rabbit("add_vhost", vhost)
    rabbit("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    admin = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{db}"')
    tmp = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    logs = tmp / "logs"
    logs.mkdir()
    patches = ("transactions", "sqs-retention", "sqs-deletes", "hot-paths", "ec2-tags")
    moto, endpoint = moto_server.start(patches)
    servers = [moto]  # the servers whose CPU is measured: the moto, then the DynamoDB server if apart
    ddb_endpoint = None
    if args.dynamodb == "moto":
        ddb_moto, ddb_endpoint = moto_server.start(patches)
        servers.append(ddb_moto)
    elif args.dynamodb == "local":
        ddb_local, ddb_endpoint = dynamodb_local.start()
        servers.append(ddb_local)
    proxies: list[subprocess.Popen] = []
    bench = None
    keep_logs = False
    try:
        wait_for_endpoint(endpoint, timeout_seconds=120)
        os.environ.update(
            {
                "AWS_ENDPOINT_URL": endpoint,  # this process seeds and checks without the latency
                "AWS_REGION": "us-east-1",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench",
            }
        )
        runs_endpoint, runs_ddb_endpoint = endpoint, ddb_endpoint
        if args.latency_ms:
            proxy, runs_endpoint = latency_proxy.start(endpoint, args.latency_ms)
            proxies.append(proxy)
            wait_for_endpoint(runs_endpoint, timeout_seconds=120)
        stack = deploy(boto3.client("cloudformation"))
        if ddb_endpoint:
            wait_for_endpoint(ddb_endpoint, timeout_seconds=180, proc=servers[-1])
            dynamodb_local.copy_tables(boto3.client("dynamodb"), boto3.client("dynamodb", endpoint_url=ddb_endpoint))
            os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = ddb_endpoint
            if args.latency_ms:
                proxy, runs_ddb_endpoint = latency_proxy.start(ddb_endpoint, args.latency_ms)
                proxies.append(proxy)
                wait_for_endpoint(runs_ddb_endpoint, timeout_seconds=120)
        home = tmp / "home"
        cl.write_instance(home)
        env = {
            **os.environ,
            **stack,
            **cl.cluster_env(
                home=home,
                pg_url=f"postgresql+psycopg2://postgres@127.0.0.1:5432/{db}",
                broker=f"pyamqp://guest:guest@127.0.0.1:5672/{vhost}",
            ),
            "AWS_ENDPOINT_URL": runs_endpoint,  # the runs and the workers: through the latency proxy
            **({"AWS_ENDPOINT_URL_DYNAMODB": runs_ddb_endpoint} if runs_ddb_endpoint else {}),
        }
        cl.migrate(env)
        os.environ.update({k: env[k] for k in ("DAGSTER_PG_URL", "DAGSTER_HOME")})
        bench = Bench(env, home, logs, [m.pid for m in servers])
        ddb = boto3.client("dynamodb")
        print(f"load average {load()} (start)", flush=True)

        results: dict[tuple[str, int], list[dict]] = {}
        if "reclaim" in works:
            started = time.monotonic()
            stale_every = max(1, round(100 / args.stale_percent))
            rows, stale = cl.agenda_rows(args.items, stale_every, int(time.time() * 1000))
            cl.seed_scan_table(ddb, TABLE, 0)
            batch_put(ddb, TABLE, rows)
            del rows
            print(
                f"seeded {args.items:,} agendas ({len(stale):,} stale) in {time.monotonic() - started:.0f}s", flush=True
            )
            config = cl.reclaim_config(TABLE, args.segments, objectScanLimit=1000, targetBatchSize=100)
            config["maximumExecutionSeconds"] = 850
            for n, names in enumerate(variant_order(args.repeat)):
                bench.workers_up(names)
                if n:
                    batch_put(ddb, TABLE, stale)  # put the reclaimed items back as they were
                r = bench.execute("reclaim_agendas", config)
                left = stuck_left(ddb, TABLE, stale)
                r["verified"] = r["counts"].get("reclaimed") == len(stale) and left == 0
                if not r["verified"]:
                    raise SystemExit(
                        f"reclaim on {len(names)} worker(s) did not fail every stale agenda: {r} ({left} left)"
                    )
                results.setdefault(("reclaim", len(names)), []).append(r)
                print(f"reclaim on {len(names)} worker(s): {r} (load {load()})", flush=True)
        if "termination" in works:
            for names in variant_order(args.repeat):
                bench.workers_up(names)
                started = time.monotonic()
                termination_backlog(env, args.messages)
                print(f"seeded {args.messages:,} termination messages in {time.monotonic() - started:.0f}s", flush=True)
                drain = {"wait_seconds": 0, "concurrency": args.concurrency}
                r = bench.execute("process_termination_queue", drain, copies=args.drains)
                queued, running = backlog_left(env, args.messages)
                r["verified"] = r["counts"].get("applied") == args.messages and queued == 0 and running == 0
                if not r["verified"]:
                    print(f"left in the queue: {leftovers(env)} (logs kept in {logs})", flush=True)
                    keep_logs = True
                    raise SystemExit(
                        f"termination on {len(names)} worker(s) left work: {r} ({queued} queued, {running} running)"
                    )
                results.setdefault(("termination", len(names)), []).append(r)
                print(f"termination on {len(names)} worker(s): {r} (load {load()})", flush=True)

        print(f"load average {load()} (end)")
        print()
        served = {
            "shared": "one moto process for every service",
            "moto": "DynamoDB from a moto process of its own, the rest from another",
            "local": "DynamoDB from DynamoDB Local, the rest from moto",
        }[args.dynamodb]
        print(
            f"latency {args.latency_ms:g} ms a request; {served}; {args.repeat} run(s) of each variant, "
            "interleaved; s: the median run (every run listed); server CPU / s: all servers (moto/DynamoDB's)"
        )
        print()
        print(
            "| work | workers | s (median) | runs, s | speedup | server CPU / s | workers' CPU s "
            "| machine's busy cores | counts | verified |"
        )
        print("|---|---:|---:|---|---:|---:|---:|---:|---|---|")
        for (work, n), runs in results.items():
            median = statistics.median(r["seconds"] for r in runs)
            base = statistics.median(r["seconds"] for r in results[(work, 1)])
            mid = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
            counts = ", ".join(f"{k} {v:,}" for k, v in mid["counts"].items() if v)
            who = ", ".join(sorted(set().union(*(r["workers"] for r in runs))))
            each = ", ".join(f"{r['seconds']:.1f}" for r in runs)
            server_share = statistics.median(r["server_cpu"] / r["seconds"] for r in runs)
            server_each = "/".join(
                f"{statistics.median(r['server_cpu_each'][k] / r['seconds'] for r in runs):.2f}"
                for k in range(len(servers))
            )
            print(
                f"| {work} | {n} ({who}) | {median:.1f} | {each} | {base / median:.2f} | "
                f"{server_share:.2f} ({server_each}) | {statistics.median(r['worker_cpu'] for r in runs):.1f} | "
                f"{statistics.median(r['machine_cores'] for r in runs):.2f} | {counts} | "
                f"{'all' if all(r['verified'] for r in runs) else 'NO'} |"
            )
        return 0
    finally:
        if bench is not None:
            for proc in bench.workers.values():
                cl.stop(proc)
        for proc in (*proxies, *servers):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a loaded machine: do not leave the database and vhost behind
                proc.kill()
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.close()
        rabbit("delete_vhost", vhost)
        if not keep_logs:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
