"""A fresh ``make dev`` left alone: how many runs it starts, what its terminal prints, and whether
every capability still has data at the end. Not part of ``make test`` (it takes ``--minutes``).

It clones this repository's HEAD into a temporary folder (so ``.groundskeeper/`` starts empty, as
on a fresh machine), runs ``make dev``'s command there (``python -m infra.local`` with this
checkout's ``.venv``; ``GROUNDSKEEPER_DEMO`` as in the environment, unset: ``quiet``), leaves it
alone for ``--minutes`` (30) from its start, then reads the instance and the terminal:

- runs started, by job and status (a fresh ``make dev`` must start fewer than ``--max-runs``, 60);
- lines the terminal printed (fewer than ``--max-lines``, 300);
- each capability (``groundskeeper/capability``: reclaim, fleet, batching, progressor) has a
  successful run in the window.

Exit status 0 when all three hold, 1 otherwise; ``make dev`` is stopped with Ctrl-C either way.

    PYTHONPATH=. .venv/bin/python tests/ui/first_half_hour.py [--minutes 30]
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CAPABILITIES = ("reclaim", "fleet", "batching", "progressor")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--max-runs", type=int, default=60)
    parser.add_argument("--max-lines", type=int, default=300)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="first-half-hour-"))
    clone = work / "groundskeeper"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    terminal = work / "terminal.log"
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "PYTHONPATH")}
    env["PYTHONPATH"] = str(clone)
    started = time.monotonic()
    with terminal.open("wb") as out:
        proc = subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "python"), "-m", "infra.local"],
            cwd=clone,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    print(f"make dev's command started in {clone} (terminal: {terminal}); {args.minutes:g} minutes", flush=True)
    try:
        while time.monotonic() - started < args.minutes * 60:
            if proc.poll() is not None:
                print(f"FAILED: make dev exited with {proc.returncode}; its terminal:\n{terminal.read_text()[-3000:]}")
                return 1
            time.sleep(10)
        return report(clone / ".groundskeeper" / "dagster_home", terminal, args)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def report(home: Path, terminal: Path, args) -> int:
    import dagster as dg

    lines = terminal.read_text(errors="replace").splitlines()
    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.get_run_records()
    by_job = collections.Counter((r.dagster_run.job_name, r.dagster_run.status.value) for r in records)
    succeeded = collections.Counter(
        r.dagster_run.tags.get("groundskeeper/capability", "?")
        for r in records
        if r.dagster_run.status == dg.DagsterRunStatus.SUCCESS
    )
    print(f"runs started: {len(records)} (at most {args.max_runs - 1} wanted)")
    for (job, status), n in sorted(by_job.items()):
        print(f"  {n:3d} {job} {status}")
    print(f"terminal lines: {len(lines)} (at most {args.max_lines - 1} wanted)")
    print("successful runs by capability: " + ", ".join(f"{c} {succeeded.get(c, 0)}" for c in CAPABILITIES))
    missing = [c for c in CAPABILITIES if not succeeded.get(c)]
    ok = len(records) < args.max_runs and len(lines) < args.max_lines and not missing
    if missing:
        print(f"no successful run for: {', '.join(missing)}")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
