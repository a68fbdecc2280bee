"""Reclaim targets: one entry per table, in POP's JSON shape plus a ``cron``, one schedule each.

    [{"name": "demo_agendas", "cron": "*/5 * * * *", "tableName": "...", "idFieldName": "id",
      "timeFieldName": "updatedTime", "reclaimAgeMinutes": 5, ...}]

``name`` (optional, default from the table name) names the schedule ``reclaim_<name>``;
``cron`` is required; every other key is a run parameter, validated like the job's run config.
The file is ``RECLAIM_TARGETS_FILE``, or ``pipelines/reclaim/targets/<deployment>.json`` if it exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.common.targets import target_cron, target_entries
from pipelines.common.targets import targets_path as common_targets_path
from pipelines.reclaim.params import ParamsError, parse_params

TARGETS_DIR = Path(__file__).with_name("targets")
TARGETS_ENV = "RECLAIM_TARGETS_FILE"
NAME_RE = re.compile(r"[A-Za-z0-9_]{1,60}")


@dataclass(frozen=True)
class Target:
    name: str
    cron: str
    config: dict[str, Any]  # the flat run config of the reclaim job


def targets_path(deployment: str) -> Path | None:
    return common_targets_path(TARGETS_ENV, TARGETS_DIR, deployment)


def load_targets(path: Path | None) -> list[Target]:
    """Parse and validate a targets file; any bad entry is an error naming the file and the entry."""
    if path is None:
        return []
    targets, names = [], set()
    for where, entry in target_entries(path, "reclaim targets file"):
        config = {k: v for k, v in entry.items() if k not in ("name", "cron")}
        cron = target_cron(entry, where)
        try:
            params = parse_params(config)
        except ParamsError as exc:
            raise ParamsError(f"{where}: {exc}") from None
        name = entry.get("name") or re.sub(r"[^A-Za-z0-9_]", "_", params.tableName)
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ParamsError(f"{where}: name must be 1-60 of A-Z a-z 0-9 _, got {name!r}")
        if name in names:
            raise ParamsError(f"{where}: duplicate target name {name!r}")
        names.add(name)
        targets.append(Target(name=name, cron=cron, config=config))
    return targets
