"""Foundation benchmark: time to import ``pipelines.definitions`` and to run ``dagster definitions validate``.

Each figure is the median of fresh subprocesses, measured beside a baseline in the same run
(``import dagster`` alone), since absolute times vary between machines. Goal: import under 3 s.

    .venv/bin/python benchmarks/definitions_load.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    py = sys.executable
    rows = [
        ("baseline: python -c 'import dagster'", [py, "-c", "import dagster"]),
        ("import pipelines.definitions", [py, "-c", "import pipelines.definitions"]),
        (
            "dagster definitions validate -w workspace.yaml",
            [py, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        ),
    ]
    print(f"{'what':50s} {'median s':>9s} {'min s':>7s} {'max s':>7s}  (n={args.repeat})")
    results = {}
    for label, cmd in rows:
        t = timed(cmd, args.repeat)
        results[label] = statistics.median(t)
        print(f"{label:50s} {statistics.median(t):9.2f} {min(t):7.2f} {max(t):7.2f}")
    own = results["import pipelines.definitions"] - results["baseline: python -c 'import dagster'"]
    print(f"Groundskeeper's own share of the import: {own:.2f} s")
    goal = results["import pipelines.definitions"] < 3.0
    print(f"goal import < 3 s: {'met' if goal else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
