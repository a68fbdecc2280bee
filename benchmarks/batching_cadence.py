"""Batching at its real cadence: the deployment (a real ``dagster-daemon`` and its code server, the
decider's minute runs) beside the bare loop over the same batching code. Prints its figures; not a test.

Starts moto (S3, the stack from ``infra/template.yaml``) and DynamoDB Local (``infra/dynamodb_local.py``)
on 127.0.0.1, makes ``--receivers`` receivers at numberPerDay 1440 (or imports ReportStream's settings,
``--reportstream PATH``, through ``import_receiver_settings``), then runs two phases of ``--minutes``
minutes each, with records arriving at ``--rate`` a second spread over the receivers (each phase's
receivers are first batched once with nothing pending, outside the measure: a receiver's first run
writes a ledger entry for every batch time of the day so far):

- loop: this process, each minute, ``decide`` for the minute and ``ReceiverBatcher.run`` for each due
  receiver, one after another (what batching costs without Dagster);
- deployment: ``dagster-daemon run`` over ``benchmarks/batching_cadence_defs.py`` (batching's own
  definitions, local resources; the daemon starts the code server, each run is a process of it),
  with the repository's ``dagster.yaml``; the decider's schedule launches the runs.

Each phase has receivers of its own (``loop-NN``, ``dag-NN``; the other phase's are disabled) and ends
with ``--grace`` seconds without new records for the last batches. Per phase it prints: Dagster runs a
minute; CPU-seconds per record delivered (loop: its own process + the servers' share; deployment:
daemon + code server + run processes + the servers' share), and their ratio; p50/p90 lateness (record
created to ``batched_at``); records lost (not in any batch file and not pending at the end) and
batched twice (in two batch files); the instance folder's growth an hour. A separate process
writes the records in both phases; the servers' CPU includes serving it, alike in both.

    PYTHONPATH=. .venv/bin/python benchmarks/batching_cadence.py [--receivers 5] [--rate 1] [--minutes 2]
    # the real figures: --receivers 50 --rate 3 --minutes 10 (on a quiet machine)
    # production's instance (PostgreSQL) instead of make dev's SQLite: --instance postgres
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import moto_server  # noqa: E402
from bench_support import all_pages, start_daemon, stop_daemon  # noqa: E402
from idle_cost import sample  # noqa: E402

from infra import dynamodb_local  # noqa: E402
from infra.deploy import deploy, wait_for_endpoint  # noqa: E402
from pipelines.batching import store  # noqa: E402
from pipelines.batching.batcher import BatchSettings, ReceiverBatcher  # noqa: E402
from pipelines.batching.decider import decide  # noqa: E402
from pipelines.common import iso, to_item  # noqa: E402

UTC = dt.UTC


def cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def _admin(statement: str, database: str = "postgres"):
    """One statement on this machine's PostgreSQL (127.0.0.1, trust), outside a transaction; its rows."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname=database)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def parts(home: Path, database: str | None = None) -> dict[str, int]:
    """The instance's bytes by part: the instance folder's run storage, per-run event logs, captured
    compute logs, schedule and sensor ticks, and anything else by its top-level name; with
    ``database`` (a PostgreSQL instance), that database's size."""
    out: dict[str, int] = {}
    if database:
        ((size,),) = _admin(f"SELECT pg_database_size('{database}')")
        out["postgres database"] = size
    for f in home.rglob("*"):
        if not f.is_file():
            continue
        rel = f.relative_to(home).parts
        if rel[0] == "history" and len(rel) > 2:
            part = "history/runs/*.db (event logs)"
        elif rel[0] == "storage":
            part = "storage/ (compute logs)"
        else:
            part = "/".join(rel[:2])
        out[part] = out.get(part, 0) + f.stat().st_size
    return out


def tables(database: str) -> dict[str, int]:
    """A PostgreSQL instance's tables by their bytes (with indexes and TOAST), and its event log's
    rows by event type (``events <type>``): where the database's growth goes."""
    sizes = _admin("SELECT relname, pg_total_relation_size(relid) FROM pg_catalog.pg_statio_user_tables", database)
    events = _admin(
        "SELECT coalesce(dagster_event_type, 'log line'), count(*), sum(length(event)) FROM event_logs GROUP BY 1",
        database,
    )
    out = {f"table {name}": size for name, size in sizes}
    out |= {f"events {kind} (rows)": rows for kind, rows, _ in events}
    out |= {f"events {kind} (bytes of body)": body for kind, _, body in events}
    return out


def make_receivers(ddb, table: str, names: list[str], template: dict | None = None) -> None:
    for name in names:
        generated = {"number_per_day": 1440, "initial_time": "00:00", "time_zone": "UTC", "max_batch_size": 100}
        item = {**(template or generated), "receiver": name, "batching_enabled": False}
        ddb.put_item(TableName=table, Item=to_item(item))


def set_enabled(ddb, table: str, names: list[str], enabled: bool) -> None:
    for name in names:
        ddb.update_item(
            TableName=table,
            Key={"receiver": {"S": name}},
            UpdateExpression="SET batching_enabled = :e",
            ExpressionAttributeValues={":e": {"BOOL": enabled}},
        )


def settle(env: dict, names: list[str]) -> None:
    """Enable ``names`` and batch each once, with nothing pending: a receiver's first run writes a
    ledger entry for every batch time of the day so far (hundreds at 1440 a day), a one-off cost
    that is set-up here, not the steady state the phases measure."""
    ddb, s3 = boto3.client("dynamodb"), boto3.client("s3")
    settings = BatchSettings(env["RECEIVERS_TABLE"], env["BATCH_RECORDS_TABLE"], env["BATCH_OUTBOX_BUCKET"])
    set_enabled(ddb, env["RECEIVERS_TABLE"], names, True)
    now = dt.datetime.now(UTC)
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda n: ReceiverBatcher(ddb, s3, settings).run(n, now.strftime("%Y-%m-%d"), now), names))


def reportstream_receivers(env: dict, path: str) -> list[dict]:
    """ReportStream's receivers with a timing block, imported by ``import_receiver_settings`` into the
    stack's receivers table, as items (their timing kept; then removed, to be copied per phase)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "import_receiver_settings",
            "--config-json",
            json.dumps({"path": path}),
        ],
        cwd=ROOT,
        env={**env, "RECEIVER_SETTINGS_DIR": os.path.dirname(os.path.abspath(path))},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"import_receiver_settings failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    ddb = boto3.client("dynamodb")
    items = store.scan_receivers(ddb, env["RECEIVERS_TABLE"])
    for item in items:
        ddb.delete_item(TableName=env["RECEIVERS_TABLE"], Key={"receiver": {"S": item["receiver"]}})
    keep = ("timing", "customerStatus", "organization")
    return [{k: v for k, v in i.items() if k in keep} | {"name": i["receiver"]} for i in items]


def writer(env: dict, table: str, names: list[str], rate: float, seconds: float, out) -> None:
    """A process of its own: ``rate`` records a second, round robin over ``names``, for ``seconds``."""
    os.environ.update(env)
    ddb = boto3.client("dynamodb")
    start, n = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        due = start + n / rate
        if due > time.monotonic():
            time.sleep(due - time.monotonic())
        name = names[n % len(names)]
        created = dt.datetime.now(UTC)
        item = {
            "record_id": f"{name}-{n:07d}-{uuid.uuid4().hex[:6]}",
            "receiver": name,
            "created_at": iso(created),
            "payload": json.dumps({"n": n}),
            "next_action": "BATCH",
            "pending_receiver": name,
        }
        ddb.put_item(TableName=table, Item=to_item(item))
        n += 1
    out.put(n)


PRIME = "prime-"
"""Record ids of the records :func:`prime` writes (left out of the outcome)."""


def prime(env: dict, names: list[str], home: Path, timeout: float = 300) -> None:
    """One record for each receiver, then wait for the minute run that batches them: a partition's
    first batch of the day is its materialization (once a day, about 8 KB), not the steady state
    that the measured window is; it comes before the window, as the loop's first pass does."""
    import dagster as dg

    ddb, started = boto3.client("dynamodb"), dt.datetime.now(UTC)
    for name in names:
        item = {
            "record_id": f"{PRIME}{name}",
            "receiver": name,
            "created_at": iso(started),
            "payload": "{}",
            "next_action": "BATCH",
        }
        ddb.put_item(TableName=env["BATCH_RECORDS_TABLE"], Item=to_item({**item, "pending_receiver": name}))
    deadline = time.monotonic() + timeout
    with dg.DagsterInstance.from_config(str(home)) as instance:
        while time.monotonic() < deadline:
            runs = instance.get_run_records(dg.RunsFilter(job_name="batch_minute_job", created_after=started))
            if any(r.dagster_run.is_finished for r in runs):
                return
            time.sleep(2)
    raise SystemExit(f"no batch_minute_job run finished within {timeout:.0f} s of priming")


def start_writer(env: dict, names: list[str], rate: float, seconds: float):
    queue = multiprocessing.Queue()
    proc = multiprocessing.Process(target=writer, args=(env, env["BATCH_RECORDS_TABLE"], names, rate, seconds, queue))
    proc.start()
    return proc, queue


def outcome(ddb, s3, env: dict, names: list[str]) -> dict:
    """Lateness, lost and twice-batched records of ``names``, from the records table and the outbox."""
    wanted = set(names)
    records = {
        raw["record_id"]["S"]: raw
        for page in all_pages(ddb.scan, TableName=env["BATCH_RECORDS_TABLE"])
        for raw in page["Items"]
        if raw.get("receiver", {}).get("S") in wanted and not raw["record_id"]["S"].startswith(PRIME)
    }
    in_files: dict[str, int] = {}
    bucket = env["BATCH_OUTBOX_BUCKET"]
    for name in names:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"batches/{name}/"):
            for obj in page.get("Contents", []):
                body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read().decode()
                for line in body.splitlines():
                    if line:
                        rid = json.loads(line)["record_id"]
                        if rid.startswith(PRIME):
                            continue
                        in_files[rid] = in_files.get(rid, 0) + 1
    late = []
    for raw in records.values():
        if "batched_at" in raw:
            created = dt.datetime.fromisoformat(raw["created_at"]["S"])
            late.append((dt.datetime.fromisoformat(raw["batched_at"]["S"]) - created).total_seconds())
    pending = sum(1 for r in records.values() if "next_action" in r)
    lost = sum(1 for rid, r in records.items() if rid not in in_files and "next_action" not in r)
    q = statistics.quantiles(late, n=10) if len(late) >= 2 else [late[0]] * 9 if late else [float("nan")] * 9
    return {
        "records": len(records),
        "delivered": len(late),
        "pending": pending,
        "lost": lost,
        "twice": sum(1 for n in in_files.values() if n > 1),
        "p50": statistics.median(late) if late else float("nan"),
        "p90": q[8],
    }


def loop_phase(env: dict, names: list[str], args, servers: list[int]) -> dict:
    ddb, s3 = boto3.client("dynamodb"), boto3.client("s3")
    settings = BatchSettings(env["RECEIVERS_TABLE"], env["BATCH_RECORDS_TABLE"], env["BATCH_OUTBOX_BUCKET"])
    settle(env, names)
    me = psutil.Process()
    before_me, before_servers = sum(me.cpu_times()[:2]), cpu(servers)
    proc, queue = start_writer(env, names, args.rate, args.minutes * 60)
    end = time.time() + args.minutes * 60 + args.grace
    while True:
        tick = (dt.datetime.now(UTC) + dt.timedelta(minutes=1)).replace(second=0, microsecond=0)
        if tick.timestamp() > end:
            break
        time.sleep(max(0.0, tick.timestamp() - time.time()))
        decision = decide(ddb, settings, tick=tick)
        for d in decision.due:
            ReceiverBatcher(ddb, s3, settings).run(d.receiver, d.day, dt.datetime.now(UTC))
    written = queue.get()
    proc.join()
    used_me, used_servers = sum(me.cpu_times()[:2]) - before_me, cpu(servers) - before_servers
    set_enabled(ddb, env["RECEIVERS_TABLE"], names, False)
    return {"written": written, "cpu": used_me + used_servers, "cpu_servers": used_servers, "runs": 0}


def deployment_phase(env: dict, names: list[str], args, servers: list[int], home: Path) -> dict:
    import dagster as dg

    ddb = boto3.client("dynamodb")
    daemon_env = {**env, "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    database = None
    if args.instance == "postgres":  # production's instance file, on a scratch database of this server
        database = f"bench_batching_{uuid.uuid4().hex[:8]}"
        _admin(f"CREATE DATABASE {database}")
        shutil.copy(ROOT / "infra" / "dagster.prod.yaml", home / "dagster.yaml")
        pg = {"DAGSTER_PG_HOST": "127.0.0.1", "DAGSTER_PG_PORT": "5432", "DAGSTER_PG_DB": database}
        daemon_env |= {**pg, "DAGSTER_PG_USER": "postgres", "DAGSTER_PG_PASSWORD": ""}
        os.environ.update({k: v for k, v in daemon_env.items() if k.startswith("DAGSTER_PG_")})
    else:
        shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")
    defs_file = ROOT / "benchmarks" / "batching_cadence_defs.py"
    daemon = start_daemon(home, defs_file, "batching_cadence", cwd=ROOT, env=daemon_env)
    try:
        settle(env, names)
        time.sleep(args.warmup)  # the daemon and its code server up, before the measured window
        if daemon.poll() is not None:
            raise SystemExit(f"dagster-daemon exited: {(home / 'daemon.log').read_text()[-3000:]}")
        prime(env, names, home)
        # The daemon's whole tree: its own threads, the code server it started, the run processes.
        groups = {"deployment": [psutil.Process(daemon.pid)]}
        first, before_servers, before_parts = sample(groups), cpu(servers), parts(home, database)
        before_tables = tables(database) if database else {}
        started = dt.datetime.now(UTC)
        proc, queue = start_writer(env, names, args.rate, args.minutes * 60)
        written = queue.get()
        proc.join()
        time.sleep(args.grace)
        last, used_servers = sample(groups), cpu(servers) - before_servers
        seconds = (dt.datetime.now(UTC) - started).total_seconds()
        used_deploy = sum(last[g][0] + last[g][1] - first[g][0] - first[g][1] for g in last)
        after_parts = parts(home, database)
        after_tables = tables(database) if database else {}
        # daemon.log is this benchmark's capture of the daemon's output, not the instance
        growth = {k: v - before_parts.get(k, 0) for k, v in after_parts.items() if k != "daemon.log"}
        grown = sum(growth.values())
        with dg.DagsterInstance.from_config(str(home)) as instance:
            runs = instance.get_run_records(dg.RunsFilter(created_after=started))
            by_job: dict[str, int] = {}
            for r in runs:
                key = f"{r.dagster_run.job_name} ({r.dagster_run.status.value.lower()})"
                by_job[key] = by_job.get(key, 0) + 1
    finally:
        stop_daemon(daemon)
        if database:
            _admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    set_enabled(ddb, env["RECEIVERS_TABLE"], names, False)
    return {
        "written": written,
        "cpu": used_deploy + used_servers,
        "cpu_servers": used_servers,
        "runs": len(runs),
        "runs_by_job": by_job,
        "seconds": seconds,
        "growth_per_hour": grown / seconds * 3600,
        "growth_parts_per_hour": {k: v / seconds * 3600 for k, v in sorted(growth.items(), key=lambda kv: -kv[1])},
        "tables_per_hour": {
            k: (v - before_tables.get(k, 0)) / seconds * 3600
            for k, v in sorted(after_tables.items())
            if v != before_tables.get(k, 0)
        },
        "daemon_log_per_hour": (after_parts.get("daemon.log", 0) - before_parts.get("daemon.log", 0)) / seconds * 3600,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--receivers", type=int, default=5, help="receivers at numberPerDay 1440 (each phase)")
    parser.add_argument("--rate", type=float, default=1.0, help="records a second, over all receivers")
    parser.add_argument("--minutes", type=float, default=2, help="minutes of records in each phase")
    parser.add_argument("--grace", type=float, default=90, help="seconds after the last record for the last batches")
    parser.add_argument("--warmup", type=float, default=45, help="seconds for the daemon to come up, not measured")
    parser.add_argument(
        "--reportstream",
        help="ReportStream's settings to import (e.g. tests/data/reportstream/organizations-2022-04-29.yml) "
        "instead of --receivers generated ones: its receivers, with their own timing",
    )
    parser.add_argument(
        "--instance",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="the deployment's instance: the repository's dagster.yaml (SQLite, make dev's), or "
        "infra/dagster.prod.yaml on a scratch database of this machine's PostgreSQL (production's); "
        "PostgreSQL's own CPU is not counted",
    )
    parser.add_argument(
        "--skip-loop", action="store_true", help="the deployment alone (its runs, lateness and growth; no ratio)"
    )
    parser.add_argument("--keep-home", help="copy the deployment's DAGSTER_HOME here at the end (to look at it)")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="batching-cadence-"))
    moto, endpoint = moto_server.start(("transactions",))
    ddb_local, ddb_endpoint = dynamodb_local.start()
    servers = [moto.pid, ddb_local.pid]
    try:
        wait_for_endpoint(endpoint, timeout_seconds=120)
        aws = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "DAGSTER_DEPLOYMENT": "local",
            "GROUNDSKEEPER_DEMO": "off",
        }
        os.environ.update(aws)
        stack = deploy(boto3.client("cloudformation"))
        wait_for_endpoint(ddb_endpoint, timeout_seconds=180, proc=ddb_local)
        dynamodb_local.copy_tables(boto3.client("dynamodb"), boto3.client("dynamodb", endpoint_url=ddb_endpoint))
        os.environ["AWS_ENDPOINT_URL_DYNAMODB"] = ddb_endpoint
        env = {**os.environ, **stack, "AWS_ENDPOINT_URL_DYNAMODB": ddb_endpoint}
        os.environ.update(stack)
        ddb = boto3.client("dynamodb")
        table = env["RECEIVERS_TABLE"]
        if args.reportstream:
            imported = reportstream_receivers(env, args.reportstream)
            active = [i for i in imported if i.get("customerStatus", "active") != "inactive"]
            for phase in ("loop", "dag"):
                for item in active:
                    make_receivers(
                        ddb, table, [f"{phase}-{item['name']}"], {k: v for k, v in item.items() if k != "name"}
                    )
            names = {p: [f"{p}-{i['name']}" for i in active] for p in ("loop", "dag")}
            print(f"ReportStream settings {args.reportstream}: {len(imported)} imported, {len(active)} not inactive")
        else:
            names = {p: [f"{p}-{i:03d}" for i in range(args.receivers)] for p in ("loop", "dag")}
            for phase_names in names.values():
                make_receivers(ddb, table, phase_names)
        print(
            f"{len(names['loop'])} receivers a phase, {args.rate} records/s, {args.minutes} min + {args.grace:.0f} s "
            f"grace; load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}",
            flush=True,
        )
        results = {}
        if not args.skip_loop:
            loop = loop_phase(env, names["loop"], args, servers)
            print(f"loop done: {loop['written']} records written", flush=True)
            results["loop"] = (loop, outcome(ddb, boto3.client("s3"), env, names["loop"]))
        home = tmp / "home"
        home.mkdir()
        dep = deployment_phase(env, names["dag"], args, servers, home)
        print(f"deployment done: {dep['written']} records written; runs {dep['runs_by_job']}", flush=True)
        results["deployment"] = (dep, outcome(ddb, boto3.client("s3"), env, names["dag"]))
    finally:
        for proc in (moto, ddb_local):
            moto_server.stop(proc)
        if args.keep_home and (tmp / "home").exists():
            shutil.copytree(tmp / "home", args.keep_home, dirs_exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print("| variant | Dagster runs a minute | CPU-s per record delivered | of which servers | p50 lateness s "
          "| p90 lateness s | delivered | still pending | lost | batched twice | instance growth MB/h |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    per_record = {}
    for name, (m, o) in results.items():
        per_record[name] = m["cpu"] / max(1, o["delivered"])
        growth = f"{m['growth_per_hour'] / 1e6:.1f}" if "growth_per_hour" in m else "-"
        print(
            f"| {name} | {m['runs'] / (args.minutes + args.grace / 60):.2f} | {per_record[name]:.3f} | "
            f"{m['cpu_servers'] / max(1, o['delivered']):.3f} | {o['p50']:.0f} | {o['p90']:.0f} | {o['delivered']} | "
            f"{o['pending']} | {o['lost']} | {o['twice']} | {growth} |"
        )
    dep_parts = results["deployment"][0]["growth_parts_per_hour"]
    print()
    print("instance growth by part, MB/h: " + ", ".join(f"{k} {v / 1e6:.2f}" for k, v in dep_parts.items()))
    for key, value in results["deployment"][0]["tables_per_hour"].items():
        print(f"  {key}: {value / 1e6:.2f} M/h" if "rows" not in key else f"  {key}: {value:.0f}/h")
    print(f"(not counted: the daemon's own output, {results['deployment'][0]['daemon_log_per_hour'] / 1e6:.2f} MB/h)")
    print()
    if "loop" in per_record:
        print(f"deployment / loop, CPU per record delivered: {per_record['deployment'] / per_record['loop']:.1f}x")
    bad = sum(o["lost"] + o["twice"] for _, o in results.values())
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
