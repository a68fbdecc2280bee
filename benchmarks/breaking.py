"""``--break`` for the benchmarks: deliberately lose writes, so that a benchmark's own checks must fail.

``install(operations)`` makes every boto3 client created afterwards in this process answer the 2nd,
22nd, 42nd... call of the named operations (counted together) with an empty success, without
sending it: the code under test believes the write happened. A broken ``BatchExecuteStatement``
answers success for each of its statements, none of them applied. ``site_dir(base, operations)`` writes
a ``sitecustomize.py`` that does the same in any Python process started with that directory first
on ``PYTHONPATH`` and ``BENCH_BREAK`` in its environment (a ``dagster job execute`` run, a daemon's
run worker).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path

EVERY = 20
FIRST = 2
ENV = "BENCH_BREAK"


class _Ok:
    status_code = 200
    headers: dict = {}
    content = b""


def install(operations: str | set[str]) -> Callable[[], None]:
    """Break the named operations for the clients made from now on; returns the undo."""
    import botocore.client

    names = set(operations.split(",")) if isinstance(operations, str) else set(operations)
    names.discard("")
    counter = itertools.count(1)
    original = botocore.client.BaseClient.__init__

    def skip(model, params=None, **_):
        if model.name in names and next(counter) % EVERY == FIRST:
            parsed: dict = {"ResponseMetadata": {"HTTPStatusCode": 200}}
            if model.name == "BatchExecuteStatement":
                parsed["Responses"] = [{} for _ in json.loads(params["body"])["Statements"]]
            return _Ok(), parsed
        return None

    def init(client, *args, **kwargs):
        original(client, *args, **kwargs)
        client.meta.events.register("before-call.*.*", skip)

    botocore.client.BaseClient.__init__ = init

    def undo() -> None:
        botocore.client.BaseClient.__init__ = original

    return undo


def site_dir(base: Path) -> Path:
    """A directory holding a ``sitecustomize.py`` that calls :func:`install` with ``$BENCH_BREAK``."""
    folder = base / "break"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import importlib.util, os\n"
        f"if os.environ.get({ENV!r}):\n"
        f"    spec = importlib.util.spec_from_file_location('bench_breaking', {str(Path(__file__).resolve())!r})\n"
        "    module = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(module)\n"
        f"    module.install(os.environ[{ENV!r}])\n"
    )
    return folder


def env_for(operations: str, base: Path, pythonpath: str) -> dict[str, str]:
    """Environment additions for a subprocess whose clients must be broken."""
    return {ENV: operations, "PYTHONPATH": f"{site_dir(base)}{os.pathsep}{pythonpath}"}
