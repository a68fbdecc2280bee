"""Targets files (reclaim tables, progressor namespaces): a JSON list of entries, each a job's flat run
config plus a ``cron``, one schedule per entry; a bad one is one ``ParamsError`` line naming it."""

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pipelines.common.params import ParamsError


def targets_path(env_var: str) -> Path | None:
    explicit = os.environ.get(env_var)
    return Path(explicit) if explicit else None


P = TypeVar("P")


@dataclass(frozen=True)
class Target(Generic[P]):
    """One entry of a targets file: its schedule's name and cron, its run config, and that parsed."""

    name: str
    cron: str
    config: dict[str, Any]
    params: P


def read_targets(
    path: Path | None,
    what: str,
    parse: Callable[[dict[str, Any]], P],
    name_of: Callable[[dict[str, Any], P], str],
    *,
    default_cron: str | None = None,
    not_config: tuple[str, ...] = ("cron",),
) -> list[Target[P]]:
    """The targets of the file ``path``: each entry's keys but ``not_config`` are its run config, checked
    by ``parse``; ``name_of(entry, params)`` names it, uniquely."""
    if path is None:
        return []
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ParamsError(f"{what} {path}: {exc}") from None
    if not isinstance(entries, list):
        raise ParamsError(f"{what} {path}: expected a JSON list of targets")
    targets: list[Target[P]] = []
    for n, entry in enumerate(entries):
        where = f"{what} {path}, entry {n}"
        if not isinstance(entry, dict):
            raise ParamsError(f"{where}: expected a JSON object")
        cron = entry.get("cron", default_cron)
        if not isinstance(cron, str) or len(cron.split()) != 5:
            raise ParamsError(f"{where}: cron must be a 5-field cron string, got {cron!r}")
        config = {k: v for k, v in entry.items() if k not in not_config}
        try:
            params = parse(config)
            name = name_of(entry, params)
        except ParamsError as exc:
            raise ParamsError(f"{where}: {exc}") from None
        if any(target.name == name for target in targets):
            raise ParamsError(f"{where}: duplicate target name {name!r}")
        targets.append(Target(name=name, cron=cron, config=config, params=params))
    return targets
