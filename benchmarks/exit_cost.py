"""What a process pays after its last statement: the interpreter's finalization, by what it imported.

Each case runs in a fresh interpreter, five times, interleaved, once ending normally and once with
``os._exit(0)`` (no finalization). "After the last statement" is the wall time minus the time the
process measured up to its last statement: interpreter start-up plus, for a normal exit,
finalization. ``import dagster`` is the baseline of the same run.

    .venv/bin/python benchmarks/exit_cost.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import trials  # noqa: E402

CASES = {
    "import dagster": "import dagster",
    "import pipelines.definitions": "import pipelines.definitions as d; d.defs.resolve_job_def('reclaim_agendas')",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(trials.machine_line("exit_cost.py"), flush=True)
    cases = {(name, how): code for name, code in CASES.items() for how in ("normal exit", "os._exit")}

    def once(case: tuple[str, str], _round: int) -> trials.Run:
        tail = "; import os; os._exit(0)" if case[1] == "os._exit" else ""
        src = (f"import time, sys; t = time.perf_counter(); {cases[case]}; "
               f"sys.stderr.write(repr(time.perf_counter() - t)); sys.stderr.flush(){tail}")  # fmt: skip
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", src], cwd=ROOT, capture_output=True, text=True, check=True)
        wall = time.perf_counter() - start  # the process exited 0: it did its work
        return trials.Run(wall, 1, extra={"inside": float(out.stderr.strip().splitlines()[-1])})

    results = trials.interleaved(list(cases), args.repeat, once)
    rows = {case: [(r.seconds, r.extra["inside"]) for r in runs] for case, runs in results.items()}
    print("| what | exit | median wall s | median in-process s | after the last statement s |")
    print("|---|---|---:|---:|---:|")
    for (name, how), values in rows.items():
        wall = statistics.median(w for w, _ in values)
        inside = statistics.median(i for _, i in values)
        after = statistics.median(w - i for w, i in values)
        print(f"| `{name}` | {how} | {wall:.2f} | {inside:.2f} | {after:.2f} |")
    print(trials.after_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
