"""What several benchmarks share: a real ``dagster-daemon`` over one code location, and DynamoDB's
pages read to the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def start_daemon(home: Path, defs_file: Path, location: str, *, cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """``dagster-daemon run`` over ``defs_file`` (code location ``location``, loaded in ``cwd``), in a
    session of its own, logging to ``home/daemon.log``; ``env`` names its ``DAGSTER_HOME``. The
    instance's storages are created first, here: several processes creating them at once (the daemon,
    its code server, the benchmark) can leave two alembic heads ("more than one head present") and a
    code location that never loads."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(home))
    instance.get_runs(limit=1)
    instance.all_instigator_state()
    instance.dispose()
    workspace = home / "workspace.yaml"
    workspace.write_text(
        "load_from:\n  - python_file:\n"
        f"      relative_path: {defs_file}\n"
        f"      working_directory: {cwd}\n      location_name: {location}\n"
    )
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", str(workspace)],
        cwd=cwd,
        env=env,
        stdout=open(home / "daemon.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_daemon(daemon: subprocess.Popen) -> None:
    """SIGTERM to the daemon's whole session (its code server, its runs), SIGKILL after 60 s."""
    os.killpg(daemon.pid, signal.SIGTERM)
    try:
        daemon.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()


def all_pages(call: Callable[..., dict[str, Any]], **kwargs: Any) -> Iterator[dict[str, Any]]:
    """Every page of a DynamoDB ``query`` or ``scan`` (``call``), following ``LastEvaluatedKey``."""
    while True:
        page = call(**kwargs)
        yield page
        if "LastEvaluatedKey" not in page:
            return
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
