"""Reclaim targets (``RECLAIM_TARGETS_FILE``): one entry per table, POP's JSON plus a ``cron`` and an
optional ``name`` (default from the table name) for its schedule ``reclaim_<name>``."""

import re
from pathlib import Path
from typing import Any

from pipelines.common.targets import Target, read_targets
from pipelines.reclaim.params import ParamsError, ReclaimParams, parse_params

TARGETS_ENV = "RECLAIM_TARGETS_FILE"
NAME_RE = re.compile(r"[A-Za-z0-9_]{1,60}")


def _name(entry: dict[str, Any], params: ReclaimParams) -> str:
    name = entry.get("name") or re.sub(r"[^A-Za-z0-9_]", "_", params.tableName)
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ParamsError(f"name must be 1-60 of A-Z a-z 0-9 _, got {name!r}")
    return name


def load_targets(path: Path | None) -> list[Target[ReclaimParams]]:
    """Parse and validate a targets file; any bad entry is an error naming the file and the entry."""
    return read_targets(path, "reclaim targets file", parse_params, _name, not_config=("name", "cron"))
