"""The cluster profile: the same work on 1 Celery worker and on 2, in one run.

- reclaim: a ``reclaim_agendas`` scan in 8 parallel-scan segments of an AgendaProgress table without
  the GSI (``--items``, default 200,000; ``--stale-percent`` of them stuck, failed by the run);
- termination: a backlog of ``--messages`` (default 5,000) termination messages drained by two
  ``process_termination_queue`` runs at once (competing consumers).

Each is run with only ``w1`` up, then (the work put back as it was) with ``w1`` and ``w2``. Runs go
through ``dagster job execute`` with ``DAGSTER_DEPLOYMENT=cluster``: the run's process orchestrates,
its steps are Celery tasks. The seconds are a run's own (its start to its end in the run storage);
the ratio is the speedup. CPU seconds of moto, the workers and the brokers' client side are read
from /proc (psutil) around each run, to show what bounds it: moto serves every AWS call from one
Python process (one core at most), the machine has two.

Needs the local RabbitMQ (a vhost of its own, removed at the end) and PostgreSQL on 127.0.0.1:5432
(a database of its own, dropped at the end). Moto runs with the ``transactions``, ``sqs-retention``
and ``ec2-tags`` patches of ``benchmarks/moto_server.py`` (performance only, same API behaviour).

    PYTHONPATH=. .venv/bin/python benchmarks/cluster.py [--items 200000] [--messages 5000]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import os
import shutil
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

import moto_server  # noqa: E402

from infra import cluster as cl  # noqa: E402
from infra.deploy import deploy, wait_for_endpoint  # noqa: E402
from pipelines.common import iso, to_item  # noqa: E402

TABLE = "POP-ProgressAgenda-bench"
SEGMENTS = 8


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
    def __init__(self, env: dict, home: Path, logs: Path, moto_pid: int) -> None:
        self.env, self.home, self.logs, self.moto_pid = env, home, logs, moto_pid
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
        watched = [self.moto_pid] + [p.pid for p in self.workers.values()]
        moto_cpu, worker_cpu = cpu_seconds([self.moto_pid]), cpu_seconds(watched[1:])
        procs = [
            subprocess.Popen(args, env=self.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(copies)
        ]
        for proc in procs:
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"{job} failed: {err.decode()[-2000:]}")
        moto_cpu, worker_cpu = cpu_seconds([self.moto_pid]) - moto_cpu, cpu_seconds(watched[1:]) - worker_cpu
        with dg.DagsterInstance.from_config(str(self.home)) as instance:
            records = instance.get_run_records(dg.RunsFilter(tags={"bench": tag}))
            assert len(records) == copies and all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in records)
            counts: dict[str, int] = {}
            for r in records:
                for k, v in r.dagster_run.tags.items():
                    if k.startswith("groundskeeper/count/"):
                        key = k.removeprefix("groundskeeper/count/")
                        counts[key] = counts.get(key, 0) + int(v)
            workers = set()
            for r in records:
                workers |= {w.split("@")[0] for w in cl.step_workers(instance, r.dagster_run.run_id).values()}
        span = max(r.end_time for r in records) - min(r.start_time for r in records)
        return {"seconds": span, "moto_cpu": moto_cpu, "worker_cpu": worker_cpu, "counts": counts, "workers": workers}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--stale-percent", type=float, default=5.0)
    parser.add_argument("--messages", type=int, default=5_000)
    args = parser.parse_args()

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
    moto, endpoint = moto_server.start(("transactions", "sqs-retention", "ec2-tags"))
    bench = None
    try:
        wait_for_endpoint(endpoint, timeout_seconds=120)
        os.environ.update(
            {
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_REGION": "us-east-1",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": "bench",
                "AWS_SECRET_ACCESS_KEY": "bench",
            }
        )
        stack = deploy(boto3.client("cloudformation"))
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
        }
        cl.migrate(env)
        os.environ.update({k: env[k] for k in ("DAGSTER_PG_URL", "DAGSTER_HOME")})
        bench = Bench(env, home, logs, moto.pid)
        ddb = boto3.client("dynamodb")

        started = time.monotonic()
        stale_every = max(1, round(100 / args.stale_percent))
        rows, stale = cl.agenda_rows(args.items, stale_every, int(time.time() * 1000))
        cl.seed_scan_table(ddb, TABLE, 0)
        batch_put(ddb, TABLE, rows)
        del rows
        print(f"seeded {args.items:,} agendas ({len(stale):,} stale) in {time.monotonic() - started:.0f}s", flush=True)
        config = cl.reclaim_config(TABLE, SEGMENTS, objectScanLimit=1000, targetBatchSize=100)
        config["maximumExecutionSeconds"] = 850
        results = {}
        for names in (("w1",), ("w1", "w2")):
            bench.workers_up(names)
            if len(names) == 2:
                batch_put(ddb, TABLE, stale)  # put the reclaimed items back as they were
            results[("reclaim", len(names))] = r = bench.execute("reclaim_agendas", config)
            print(f"reclaim on {len(names)} worker(s): {r}", flush=True)
        for names in (("w1",), ("w1", "w2")):
            bench.workers_up(names)
            started = time.monotonic()
            termination_backlog(env, args.messages)
            print(f"seeded {args.messages:,} termination messages in {time.monotonic() - started:.0f}s", flush=True)
            drain = {"wait_seconds": 0, "concurrency": 4}
            results[("termination", len(names))] = r = bench.execute("process_termination_queue", drain, copies=2)
            print(f"termination on {len(names)} worker(s): {r}", flush=True)

        print()
        print("| work | workers | s | speedup | moto CPU s | moto CPU / s | workers' CPU s | counts |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for (work, n), r in results.items():
            base = results[(work, 1)]["seconds"]
            counts = ", ".join(f"{k} {v:,}" for k, v in r["counts"].items() if v)
            who = ", ".join(sorted(r["workers"]))
            print(
                f"| {work} | {n} ({who}) | {r['seconds']:.1f} | {base / r['seconds']:.2f} | "
                f"{r['moto_cpu']:.1f} | {r['moto_cpu'] / r['seconds']:.2f} | {r['worker_cpu']:.1f} | {counts} |"
            )
        return 0
    finally:
        if bench is not None:
            for proc in bench.workers.values():
                cl.stop(proc)
        moto.terminate()
        try:
            moto.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a loaded machine: do not leave the database and vhost behind
            moto.kill()
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.close()
        rabbit("delete_vhost", vhost)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
