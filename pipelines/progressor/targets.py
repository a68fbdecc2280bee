"""Progressor targets: one entry per namespace, the ``collect_zombies`` flat run config plus an optional
``cron`` (docs/progressor.md, "Schedules"), named after the namespace (``default/default`` -> ``default_default``)."""

import re
from pathlib import Path
from typing import Any

from pipelines.common.targets import Target, read_targets
from pipelines.progressor.params import CollectParams, collect_params

TARGETS_ENV = "PROGRESSOR_TARGETS_FILE"


def dagster_name(namespace: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", namespace)


def _name(entry: dict[str, Any], params: CollectParams) -> str:
    return dagster_name(params.namespace)


def load_targets(path: Path | None) -> list[Target[CollectParams]]:
    """Parse and validate a targets file; a bad entry is one line naming the file and the entry."""
    return read_targets(path, "progressor targets file", collect_params, _name, default_cron="* * * * *")
