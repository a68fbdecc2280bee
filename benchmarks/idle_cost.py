"""What the deployment costs when no work arrives: CPU-seconds per hour and memory of its processes.

Starts a deployment as its own command does (``--profile local``: ``python -m infra.local``, i.e.
``make dev``; ``--profile cluster``: ``python -m infra.cluster``, i.e. ``make cluster``, with a
RabbitMQ vhost and a PostgreSQL database of its own, removed at the end), on free ports, with every
sensor and schedule as the deployment sets them. The local demo traffic generators
(``demo_traffic_schedule``, ``progressor_demo_traffic_schedule``) are stopped first
(``dagster schedule stop``), so no work arrives, unless ``--keep-demo``; ``GROUNDSKEEPER_DEMO``
is set to ``off`` as well (``make dev``'s switch: the demo traffic stopped, the quiet cadences).

After ``--warmup`` seconds (the first ticks, the startup reclaim of ``make cluster``), it reads
the CPU time of every process of each group for ``--minutes`` minutes, every ``--interval``
seconds: utime + stime of each live process of the group, plus cutime + cstime (the processes it
started and waited for: the run processes, which live a few seconds). The groups:

- ``daemon``: ``dagster-daemon`` and what it starts (its code server under ``cluster``);
- ``code server``: the code location's gRPC server and the run processes it starts (``local``:
  ``dagster dev``'s code server, which the daemon and the webserver share);
- ``webserver``: ``dagster-webserver`` (and its own code server under ``cluster``);
- ``workers``: the Celery workers (``cluster``);
- ``moto``: the local AWS (for information: what the sensors' calls cost the fake AWS).

Memory is the resident set (RSS) of each group, summed over its processes, averaged over the
samples (and its maximum). Runs launched during the window are counted by job, from the instance.

    PYTHONPATH=. .venv/bin/python benchmarks/idle_cost.py --profile local [--minutes 10]
    PYTHONPATH=. .venv/bin/python benchmarks/idle_cost.py --profile cluster [--minutes 10]
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from infra.deploy import free_port  # noqa: E402

DEMO_SCHEDULES = ("demo_traffic_schedule", "progressor_demo_traffic_schedule")
GROUPS = ("daemon", "code server", "webserver", "workers", "moto")


def group_of(cmdline: list[str]) -> str | None:
    """The group a top process (a child of the deployment's command) belongs to, by its command line."""
    line = " ".join(cmdline)
    if "dagster-daemon" in line or "dagster._daemon" in line:
        return "daemon"
    if "dagster-webserver" in line or "dagster_webserver" in line:
        return "webserver"
    if "code-server" in line or "api grpc" in line:
        return "code server"
    if "dagster-celery" in line or "celery" in line:
        return "workers"
    if "moto_server" in line:
        return "moto"
    return None


def roots(top: psutil.Process) -> dict[str, list[psutil.Process]]:
    """The deployment's processes by group: the first process down each branch that names a group."""
    found: dict[str, list[psutil.Process]] = collections.defaultdict(list)

    def walk(proc: psutil.Process) -> None:
        for child in proc.children():
            try:
                group = group_of(child.cmdline())
            except psutil.NoSuchProcess:
                continue
            if group:
                found[group].append(child)
            else:
                walk(child)

    walk(top)
    return found


def tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def is_server(proc: psutil.Process) -> bool:
    """One of the group's own long-lived processes (daemon, webserver, code server, worker), not a run."""
    return group_of(proc.cmdline()) is not None


def sample(groups: dict[str, list[psutil.Process]]) -> dict[str, tuple[float, float, int, int]]:
    """Per group: CPU seconds so far of its servers' own threads; CPU seconds so far of what they
    started (runs, replaced code servers: live ones and those waited for); RSS bytes; live processes."""
    out = {}
    for group, procs in groups.items():
        own, started, rss, count = 0.0, 0.0, 0, 0
        for top in procs:
            for p in tree(top):
                try:
                    t = p.cpu_times()
                    if p.pid == top.pid or is_server(p):
                        own += t.user + t.system
                    else:
                        started += t.user + t.system
                    started += t.children_user + t.children_system
                    rss += p.memory_info().rss
                    count += 1
                except psutil.NoSuchProcess:
                    pass
        out[group] = (own, started, rss, count)
    return out


def wait_for_line(log: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise SystemExit(f"the deployment exited ({proc.returncode}):\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(1)
    raise SystemExit(f"no {text!r} after {timeout:.0f}s:\n{log.read_text(errors='replace')[-3000:]}")


def stop_schedules(env: dict, names: tuple[str, ...], code: Path) -> list[str]:
    stopped = []
    for name in names:
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "dagster"),
                "schedule",
                "stop",
                name,
                "-w",
                str(code / "workspace.yaml"),
            ],
            env=env,
            cwd=env.get("DAGSTER_HOME", ROOT),
            capture_output=True,
            text=True,
        )
        if done.returncode == 0:
            stopped.append(name)
        elif "not found" not in (done.stdout + done.stderr).lower():
            print(f"dagster schedule stop {name}: {(done.stderr or done.stdout).strip()[-500:]}", file=sys.stderr)
    return stopped


def runs_between(home: Path, start: dt.datetime, end: dt.datetime) -> collections.Counter:
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.get_run_records(dg.RunsFilter(created_after=start, created_before=end))
        return collections.Counter(f"{r.dagster_run.job_name} ({r.dagster_run.status.value.lower()})" for r in records)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", choices=("local", "cluster"), default="local")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--warmup", type=float, default=120, help="seconds between ready and the measurement")
    parser.add_argument("--interval", type=float, default=10, help="seconds between two samples")
    parser.add_argument("--keep-demo", action="store_true", help="leave the local demo traffic on")
    parser.add_argument(
        "--code", type=Path, default=ROOT, help="the checkout whose deployment is measured (e.g. a git archive of main)"
    )
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="idle-cost-"))
    log = tmp / "deployment.log"
    ports = {
        k: str(free_port())
        for k in ("MOTO_PORT", "DAGSTER_PORT", "AGENDA_ENDPOINT_PORT", "ALERTS_RECEIVER_PORT", "DYNAMODB_LOCAL_PORT")
    }
    code = args.code.resolve()
    if args.profile == "cluster":  # make cluster's code server; dg dev's code server would take it too and fail
        ports["DAGSTER_CODE_SERVER_PORT"] = str(free_port())
    env = {**os.environ, **ports, "PYTHONPATH": str(code)}
    if not args.keep_demo:
        env["GROUNDSKEEPER_DEMO"] = "off"
    cleanup = []
    if args.profile == "cluster":
        import psycopg2

        tag = uuid.uuid4().hex[:8]
        vhost, db = f"groundskeeper-idle-{tag}", f"groundskeeper_idle_{tag}"
        rabbit = ["rabbitmqctl"]
        subprocess.run([*rabbit, "add_vhost", vhost], check=True, capture_output=True)
        subprocess.run(
            [*rabbit, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"], check=True, capture_output=True
        )
        cleanup.append(lambda: subprocess.run([*rabbit, "delete_vhost", vhost], capture_output=True))
        admin = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres")
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{db}"')

        def drop() -> None:
            with admin.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            admin.close()

        cleanup.append(drop)
        env["CELERY_BROKER_URL"] = f"pyamqp://guest:guest@127.0.0.1:5672/{vhost}"
        env["DAGSTER_PG_URL"] = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{db}"
        command, ready = [sys.executable, "-m", "infra.cluster"], "Dagster UI on"
        home = code / ".groundskeeper" / "cluster_home"
        env_file = code / ".groundskeeper" / "cluster.env"
    else:
        command, ready = [sys.executable, "-m", "infra.local"], "Dagster UI on"
        home = code / ".groundskeeper" / "dagster_home"
        env_file = code / ".groundskeeper" / "local.env"
    deployment = subprocess.Popen(
        command, cwd=code, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_for_line(log, ready, deployment, timeout=900)
        run_env = {**env, **dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)}
        run_env["DAGSTER_HOME"] = str(home)
        stopped = [] if args.keep_demo or args.profile != "local" else stop_schedules(run_env, DEMO_SCHEDULES, code)
        print(f"{args.profile}: ready; demo schedules stopped: {', '.join(stopped) or 'none'}", flush=True)
        time.sleep(args.warmup)
        top = psutil.Process(deployment.pid)
        groups = roots(top)
        print("processes: " + "; ".join(f"{g} {[p.pid for p in ps]}" for g, ps in groups.items()), flush=True)
        load_before = Path("/proc/loadavg").read_text().split()[:3]
        start_wall, start = dt.datetime.now(dt.UTC), time.monotonic()
        first = sample(groups)
        rss: dict[str, list[int]] = collections.defaultdict(list)
        procs: dict[str, list[int]] = collections.defaultdict(list)
        machine_cpu = psutil.cpu_times()
        while time.monotonic() - start < args.minutes * 60:
            time.sleep(min(args.interval, max(0.0, args.minutes * 60 - (time.monotonic() - start))))
            for group, (_, _, r, n) in sample(groups).items():
                rss[group].append(r)
                procs[group].append(n)
        last = sample(groups)
        seconds = time.monotonic() - start
        end_wall = dt.datetime.now(dt.UTC)
        machine = psutil.cpu_times()
        busy = sum(getattr(machine, f) - getattr(machine_cpu, f) for f in ("user", "system", "nice", "irq", "softirq"))
        load_after = Path("/proc/loadavg").read_text().split()[:3]
        os.environ.update({k: v for k, v in run_env.items() if k.startswith(("DAGSTER_", "AWS_"))})
        try:
            runs = runs_between(home, start_wall, end_wall)
        except Exception as exc:  # the figures above do not depend on it
            runs = collections.Counter({f"(could not read the runs: {exc})": 1})
    finally:
        try:
            os.killpg(deployment.pid, signal.SIGINT)
            deployment.wait(timeout=120)
        except ProcessLookupError:  # it exited by itself (a failed start)
            pass
        except subprocess.TimeoutExpired:
            os.killpg(deployment.pid, signal.SIGKILL)
        for step in reversed(cleanup):
            step()
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print(
        f"profile {args.profile} ({code}), {seconds / 60:.1f} min from {start_wall:%Y-%m-%d %H:%M} UTC, "
        f"load average before {' '.join(load_before)}, after {' '.join(load_after)}, "
        f"the machine's busy CPU {busy / seconds:.2f} of {psutil.cpu_count()} cores"
    )
    print()
    print(
        "| processes | CPU-s in window | CPU-s per hour | % of one core | own CPU-s per hour "
        "| runs' CPU-s per hour | RSS MiB (mean) | RSS MiB (max) | processes |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    total = own_total = 0.0
    for group in GROUPS:
        if group not in first:
            continue
        own = last[group][0] - first[group][0]
        runs_cpu = last[group][1] - first[group][1]
        used = own + runs_cpu
        if group in ("daemon", "code server"):
            total += used
            own_total += own
        print(
            f"| {group} | {used:.1f} | {used / seconds * 3600:.0f} | {used / seconds * 100:.1f}% | "
            f"{own / seconds * 3600:.0f} | {runs_cpu / seconds * 3600:.0f} | "
            f"{statistics.mean(rss[group]) / 2**20:.0f} | {max(rss[group]) / 2**20:.0f} | "
            f"{min(procs[group])}-{max(procs[group])} |"
        )
    print(
        f"| daemon + code server | {total:.1f} | {total / seconds * 3600:.0f} | {total / seconds * 100:.1f}% | "
        f"{own_total / seconds * 3600:.0f} | {(total - own_total) / seconds * 3600:.0f} | | | |"
    )
    print()
    print("runs launched in the window: " + (", ".join(f"{k} x{v}" for k, v in sorted(runs.items())) or "none"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
