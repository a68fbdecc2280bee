"""Progressor targets: one entry per namespace, the ``collect_zombies`` flat run config plus a ``cron``.

    [{"namespace": "default/default", "cron": "* * * * *", "action": "error"}]

``cron`` is optional (default every minute); every other key is validated like the job's run config.
The file is ``PROGRESSOR_TARGETS_FILE``, or ``pipelines/progressor/targets/<deployment>.json`` if it exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.common.targets import target_cron, target_entries
from pipelines.common.targets import targets_path as common_targets_path
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
    return common_targets_path(TARGETS_ENV, TARGETS_DIR, deployment)


def load_targets(path: Path | None) -> list[Target]:
    """Parse and validate a targets file; a bad entry is one line naming the file and the entry."""
    if path is None:
        return []
    targets: list[Target] = []
    for where, entry in target_entries(path, "progressor targets file"):
        cron = target_cron(entry, where, DEFAULT_CRON)
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
