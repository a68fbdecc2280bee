"""Progressor targets: one entry per namespace, the ``collect_zombies`` flat run config plus a ``cron``.

    [{"namespace": "default/default", "cron": "* * * * *", "action": "error"}]

``cron`` is optional (default every minute); every other key is validated like the job's run config.
The file is ``PROGRESSOR_TARGETS_FILE``, or ``pipelines/progressor/targets/<deployment>.json`` if it exists.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.progressor.params import CollectParams, ParamsError, collect_params

TARGETS_DIR = Path(__file__).with_name("targets")
TARGETS_ENV = "PROGRESSOR_TARGETS_FILE"
DEFAULT_CRON = "* * * * *"


@dataclass(frozen=True)
class Target:
    name: str  # the namespace as a Dagster name: default/default -> default_default
    cron: str
    config: dict[str, Any]  # the flat run config of collect_zombies
    params: CollectParams


def dagster_name(namespace: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", namespace)


def targets_path(deployment: str) -> Path | None:
    explicit = os.environ.get(TARGETS_ENV)
    if explicit:
        return Path(explicit)
    default = TARGETS_DIR / f"{deployment}.json"
    return default if default.exists() else None


def load_targets(path: Path | None) -> list[Target]:
    """Parse and validate a targets file; a bad entry is one line naming the file and the entry."""
    if path is None:
        return []
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ParamsError(f"progressor targets file {path}: {exc}") from None
    if not isinstance(entries, list):
        raise ParamsError(f"progressor targets file {path}: expected a JSON list of targets")
    targets: list[Target] = []
    for n, entry in enumerate(entries):
        where = f"progressor targets file {path}, entry {n}"
        if not isinstance(entry, dict):
            raise ParamsError(f"{where}: expected a JSON object")
        cron = entry.get("cron", DEFAULT_CRON)
        if not isinstance(cron, str) or len(cron.split()) != 5:
            raise ParamsError(f"{where}: cron must be a 5-field cron string, got {cron!r}")
        config = {k: v for k, v in entry.items() if k != "cron"}
        try:
            params = collect_params(config)
        except ParamsError as exc:
            raise ParamsError(f"{where}: {exc}") from None
        name = dagster_name(params.namespace)
        if any(t.name == name for t in targets):
            raise ParamsError(f"{where}: namespace {params.namespace!r} is listed twice (or clashes as {name!r})")
        targets.append(Target(name=name, cron=cron, config=config, params=params))
    return targets
