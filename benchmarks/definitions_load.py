"""Loading the code location: ``import pipelines.definitions`` against ``import dagster``, fresh interpreters.

Each figure is the median of fresh subprocesses, measured beside its baseline (``import dagster``
alone) in the same run, the commands interleaved round-robin so that load on the shared machine
hits every row alike. Goal: ``import pipelines.definitions`` at most 1.5x ``import dagster``.

    .venv/bin/python benchmarks/definitions_load.py [--repeat 7] [--before DIR]

``--before DIR`` adds the same rows for another checkout (``git archive <commit> | tar -x -C DIR``),
so that before and after are measured in one run.

Bytecode: site-packages ship compiled ``.pyc`` files, the project's own modules are compiled at
their first import. Each row runs with ``PYTHONPYCACHEPREFIX`` set to a temporary directory after
one warm-up import (the deployed case: an image or a ``pip install`` has the bytecode), and, as a
second row, with ``PYTHONDONTWRITEBYTECODE=1`` and no cache (every import compiles the project's
sources, as on a machine that sets that variable).

It also prints which heavy libraries the load imports, per deployment: pandas and dagster-celery
must not be among them (they are imported where used; ``tests/test_import_cost.py`` checks it);
dagster-aws is, with boto3 and SQLAlchemy, because the resources build on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import trials  # noqa: E402

HEAVY = ("dagster_aws", "pandas", "boto3", "s3transfer", "urllib3", "dagster_celery", "celery", "sqlalchemy")
GOAL_RATIO = 1.5


def env_for(code_root: Path, cache: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env["PYTHONPATH"] = str(code_root)
    if cache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env["PYTHONPYCACHEPREFIX"] = cache
    env.update(extra)
    return env


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def heavy_imports(code_root: Path, deployment: str, cache: str) -> list[str]:
    code = (
        "import sys, pipelines.definitions; "
        f"print(__import__('json').dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    env = env_for(code_root, cache, DAGSTER_DEPLOYMENT=deployment)
    out = subprocess.run([sys.executable, "-c", code], cwd=code_root, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        return [f"(load failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode})"]
    return json.loads(out.stdout.strip().splitlines()[-1])


def deployments(code_root: Path, cache: str) -> list[str]:
    code = "import resources; print(','.join(resources.DEPLOYMENTS))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=code_root, env=env_for(code_root, cache), capture_output=True, text=True
    )
    return out.stdout.strip().split(",") if out.returncode == 0 else ["local"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--before", type=Path, help="another checkout, measured in the same run")
    parser.add_argument("--no-validate", action="store_true", help="leave out `dagster definitions validate`")
    args = parser.parse_args()
    py = sys.executable
    cache = tempfile.mkdtemp(prefix="defs-load-pyc-")
    roots = [("", ROOT)] + ([("before: ", args.before.resolve())] if args.before else [])
    rows: list[tuple[str, list[str], dict[str, str], Path]] = [
        ("baseline: import dagster", [py, "-c", "import dagster"], env_for(ROOT, cache), ROOT)
    ]
    for prefix, root in roots:
        rows.append((f"{prefix}import pipelines.definitions", [py, "-c", "import pipelines.definitions"],
                     env_for(root, cache), root))  # fmt: skip
        rows.append((f"{prefix}import pipelines.definitions, no bytecode", [py, "-c", "import pipelines.definitions"],
                     env_for(root, None), root))  # fmt: skip
        if not args.no_validate:
            validate = [py, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"]
            rows.append((f"{prefix}dagster definitions validate", validate, env_for(root, cache), root))
    for _, cmd, env, cwd in rows:  # warm-up: writes the bytecode cache, fills the OS page cache
        run(cmd, env, cwd)
    print(trials.machine_line("definitions_load.py"), flush=True)
    specs = {label: (cmd, env, cwd) for label, cmd, env, cwd in rows}
    # Each run must exit 0 (``run`` checks it): the import or validation did its work.
    results = trials.interleaved(list(specs), args.repeat, lambda label, _r: trials.Run(run(*specs[label]), 1))
    times = {label: [r.seconds for r in runs] for label, runs in results.items()}
    base = statistics.median(times["baseline: import dagster"])
    print(f"n={args.repeat}, order rotating each round (benchmarks/trials.py)")
    print("| what | median s | min s | max s | vs import dagster |\n|---|---:|---:|---:|---:|")
    for label, t in times.items():
        med = statistics.median(t)
        print(f"| {label} | {med:.2f} | {min(t):.2f} | {max(t):.2f} | {med / base:.2f}x |")
    verdicts = []
    for prefix, _ in roots:
        ratio = statistics.median(times[f"{prefix}import pipelines.definitions"]) / base
        verdicts.append(ratio)
        print(
            f"{prefix or 'this checkout: '}import ratio {ratio:.2f}x "
            f"(goal <= {GOAL_RATIO}x: {'met' if ratio <= GOAL_RATIO else 'NOT met'})"
        )
    print("\nHeavy libraries imported by `import pipelines.definitions`, per DAGSTER_DEPLOYMENT:")
    for prefix, root in roots:
        for deployment in deployments(root, cache):
            found = heavy_imports(root, deployment, cache)
            print(f"  {prefix or 'this checkout: '}{deployment}: {', '.join(found) or 'none'}")
    print(trials.after_line())
    return 0 if trials.all_ok(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
