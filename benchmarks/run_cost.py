"""A run's fixed cost: CPU-seconds and processes of ``dagster job execute`` for each job of the code location.

Each job runs once with a small valid config against a moto server (``benchmarks/moto_server.py``)
with the template deployed, beside a baseline in the same run: a trivial one-op job (in-process
executor) in a throwaway module. A run's cost is what its process tree used: user + sys CPU of the
CLI and every process under it (``RUSAGE_CHILDREN`` of a runner that reaps them all), its wall-clock
seconds (start of the CLI to the exit of its last process), and the number of processes it spawned.
To count processes, the runner starts the CLI in a new PID
namespace (``unshare -fp``, needs root) and reads ``ns_last_pid`` at the end; without it the count
is left out. Each run gets a fresh ``DAGSTER_HOME`` (SQLite storage, telemetry off).

    .venv/bin/python benchmarks/run_cost.py [--code-root DIR] [--before DIR] [--jobs a,b] [--repeat 1]

``--code-root`` measures another checkout (e.g. ``git archive <commit> | tar -x -C /tmp/before``):
the CLI runs there with ``PYTHONPATH`` pointing at it. ``--before DIR`` measures DIR beside it in the
same run: each job runs ``--repeat`` times on both, in an order that rotates each round
(``benchmarks/trials.py``), so that load hits both alike; a run must exit 0.
Goal: at most 2 CPU-seconds for the small jobs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import moto_server  # noqa: E402
import trials  # noqa: E402

from infra.deploy import deploy, wait_for_endpoint  # noqa: E402
from infra.local import local_aws_env  # noqa: E402
from pipelines.common import to_item  # noqa: E402

TODAY = dt.datetime.now(dt.UTC).date().isoformat()
RECEIVER = "bench-receiver"

# A small valid config per job: the least work the job can do (empty queues and tables, dry runs).
JOBS: dict[str, dict] = {
    "process_termination_queue": {"maxMessages": 1, "maxSeconds": 5},
    "process_housekeeping_queue": {"waitSeconds": 0},  # the old name: both commits take it
    "housekeeping": {"task_type": "old_jobs", "params": {"dryRun": True}},
    "redrive_dead_letters": {},
    "fleet_dead_letter_checks": {},
    "pool_audit_job": {"ops": {"pool_audit": {"config": {"dry_run": True}}}},
    "pool_cost_report_job": {},
    "batching_checks_job": {},
    "receiver_batches_job": {"ops": {"receiver_batches": {"config": {"dry_run": True}}}},
    "reclaim_agendas": {
        "tableName": "POP-ProgressAgenda-dev",
        "idFieldName": "id",
        "timeFieldName": "updatedTime",
        "logReclaimOnly": True,
    },
    "retry_demo": {"ops": {"throttled_until_attempt": {"config": {"succeed_on_attempt": 1}}}},
    "demo_traffic": {},
}
PARTITION_TAGS = {  # receiver_batches_job is partitioned by (receiver, day), the cost report by day
    "pool_cost_report_job": {"dagster/partition": TODAY},
    "receiver_batches_job": {
        "dagster/partition": f"{TODAY}|{RECEIVER}",
        "dagster/partition/day": TODAY,
        "dagster/partition/receiver": RECEIVER,
    },
}

TRIVIAL = """
import dagster as dg

@dg.op
def noop():
    return 1

@dg.job(executor_def=dg.in_process_executor)
def trivial():
    noop()

defs = dg.Definitions(jobs=[trivial])
"""

# Runs as PID 1 of a new PID namespace (or as a plain parent without one): starts the command, reaps
# every process under it (orphans come to PID 1), and prints CPU-seconds and the process count.
RUNNER = """
import json, os, resource, subprocess, sys
cmd = json.loads(sys.argv[1])
proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(sys.argv[2], "wb"))
rc = proc.wait()
while True:
    try:
        if os.waitpid(-1, 0)[0] == 0:
            break
    except ChildProcessError:
        break
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
processes = None
if os.getpid() == 1:
    processes = int(open("/proc/sys/kernel/ns_last_pid").read()) - 1  # every PID after the runner's
print(json.dumps({"rc": rc, "cpu": usage.ru_utime + usage.ru_stime, "processes": processes}))
"""


def can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-fp", "--mount-proc", "true"], capture_output=True)
    return probe.returncode == 0


def measure(cmd: list[str], env: dict[str, str], cwd: Path, log: Path, namespace: bool) -> dict:
    runner = [sys.executable, "-c", RUNNER, json.dumps(cmd), str(log)]
    if namespace:
        runner = ["unshare", "-fp", "--mount-proc", *runner]
    start = time.perf_counter()
    out = subprocess.run(runner, env=env, cwd=cwd, capture_output=True, text=True, check=True)
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "wall": time.perf_counter() - start}


def fresh_home(base: Path, code_root: Path, job: str) -> Path:
    home = Path(tempfile.mkdtemp(prefix=f"home-{job}-", dir=base))
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    if job == "receiver_batches_job":  # the dynamic partition must exist before the run
        code = (
            "import dagster as dg; inst = dg.DagsterInstance.get(); "
            f"inst.add_dynamic_partitions('receivers', [{RECEIVER!r}])"
        )
        env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(code_root)}
        subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    return home


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--code-root", type=Path, default=ROOT, help="the checkout whose code location runs")
    parser.add_argument("--jobs", default=",".join(JOBS), help="comma-separated job names")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another checkout, measured beside it in the same run")
    args = parser.parse_args()
    code_root = args.code_root.resolve()
    namespace = can_unshare()
    work = Path(tempfile.mkdtemp(prefix="run-cost-"))
    (work / "bench_trivial.py").write_text(TRIVIAL)
    server, endpoint = moto_server.start()
    print(trials.machine_line("run_cost.py"), flush=True)
    try:
        wait_for_endpoint(endpoint, timeout_seconds=300)
        os.environ.update(local_aws_env(endpoint))
        import boto3

        stack = deploy(boto3.client("cloudformation"))
        receiver = {"receiver": RECEIVER, "number_per_day": 24, "initial_time": "00:00", "time_zone": "UTC",
                    "max_batch_size": 10, "send_if_empty_batch": False, "batching_enabled": True}  # fmt: skip
        boto3.client("dynamodb").put_item(TableName=stack["RECEIVERS_TABLE"], Item=to_item(receiver))
        base_env = {**os.environ, **local_aws_env(endpoint), **stack, "PYTHONPATH": str(code_root)}
        dagster = [sys.executable, "-m", "dagster", "job", "execute"]
        rows = [("baseline: trivial one-op job", [*dagster, "-f", str(work / "bench_trivial.py"), "-j", "trivial"])]
        for job in args.jobs.split(","):
            cmd = [*dagster, "-m", "pipelines.definitions", "-j", job]
            config = work / f"{job}.json"
            config.write_text(json.dumps(JOBS[job]))
            cmd += ["-c", str(config)]
            if job in PARTITION_TAGS:
                cmd += ["--tags", json.dumps(PARTITION_TAGS[job])]
            rows.append((job, cmd))
        roots = [("", code_root)] + ([("before", args.before.resolve())] if args.before else [])
        print(f"code: {code_root} (commit {git_head(code_root)}); processes counted: {namespace}")
        if args.before:
            print(f"before: {args.before} (commit {git_head(args.before)}); each job runs on both "
                  f"{args.repeat} time(s), the order rotating each round")  # fmt: skip
        header = "| job | " + " | ".join(
            f"{name or 'after'} CPU-s | {name or 'after'} wall s | {name or 'after'} processes" for name, _ in roots
        )
        print(header + " | ok |\n|---|" + "---:|---:|---:|" * len(roots) + "---|")
        for label, cmd in rows:
            job = label.split(":")[0].replace(" ", "-")
            where = dict(roots)

            def once(name: str, _round: int, cmd=cmd, job=job, where=where) -> trials.Run:
                root = where[name]
                env = {**base_env, "PYTHONPATH": str(root), "DAGSTER_HOME": str(fresh_home(work, root, job))}
                r = measure(cmd, env, root, work / f"{job}.log", namespace)
                problems = [] if r["rc"] == 0 else [f"exit status {r['rc']}"]
                return trials.Run(r["wall"], 1 if not problems else 0, problems, extra=r)

            results = trials.interleaved([name for name, _ in roots], args.repeat, once, label=f"{job} / ")
            cells, ok = [], "yes"
            for name, _ in roots:
                cpu = statistics.median(r.extra["cpu"] for r in results[name])
                wall = statistics.median(r.extra["wall"] for r in results[name])
                procs = results[name][0].extra["processes"]
                cells.append(f"{cpu:.1f} | {wall:.1f} | {procs if procs is not None else 'n/a'}")
                if not trials.ok(results[name]):
                    ok = f"no (see {work}/{job}.log)"
            print(f"| {label} | " + " | ".join(cells) + f" | {ok} |", flush=True)
    finally:
        moto_server.stop(server)
    print(trials.after_line())
    return 0


def git_head(path: Path) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path, capture_output=True, text=True)
    return out.stdout.strip() or "?"


if __name__ == "__main__":
    raise SystemExit(main())
