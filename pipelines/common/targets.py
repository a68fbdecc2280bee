"""Targets files: a JSON list of entries, each a job's flat run config plus a ``cron``, one schedule
per entry (reclaim tables, progressor namespaces). No Dagster imports.

The file is named by an environment variable (:func:`targets_path`; ``pipelines/definitions.py``
reads it, or is given another file). A bad file or entry is one ``ParamsError`` line naming the file and the entry.
:func:`read_targets` reads and validates a whole file into :class:`Target` entries.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from pipelines.common.params import ParamsError


def targets_path(env_var: str) -> Path | None:
    """``$env_var`` when set, else None (no targets)."""
    explicit = os.environ.get(env_var)
    return Path(explicit) if explicit else None


def target_entries(path: Path, what: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, entry)`` for each entry of the file; ``where`` names the file and the entry for
    error messages. ``what`` names the file's kind (``reclaim targets file``)."""
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ParamsError(f"{what} {path}: {exc}") from None
    if not isinstance(entries, list):
        raise ParamsError(f"{what} {path}: expected a JSON list of targets")
    for n, entry in enumerate(entries):
        where = f"{what} {path}, entry {n}"
        if not isinstance(entry, dict):
            raise ParamsError(f"{where}: expected a JSON object")
        yield where, entry


def target_cron(entry: dict[str, Any], where: str, default: str | None = None) -> str:
    """The entry's ``cron``: a 5-field cron string (``default`` when the entry has none)."""
    cron = entry.get("cron", default)
    if not isinstance(cron, str) or len(cron.split()) != 5:
        raise ParamsError(f"{where}: cron must be a 5-field cron string, got {cron!r}")
    return cron


P = TypeVar("P")


@dataclass(frozen=True)
class Target(Generic[P]):
    """One entry of a targets file: its schedule's name and cron, the job's flat run config and
    that config parsed."""

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
    """Parse and validate a targets file (none when ``path`` is None). Each entry's keys but
    ``not_config`` are the run config, checked by ``parse``; ``name_of(entry, params)`` names the
    target (a ``ParamsError`` there is the entry's error). Two targets of one name are an error.
    Any bad entry is one ``ParamsError`` naming the file and the entry."""
    if path is None:
        return []
    targets: list[Target[P]] = []
    names: set[str] = set()
    for where, entry in target_entries(path, what):
        cron = target_cron(entry, where, default_cron)
        config = {k: v for k, v in entry.items() if k not in not_config}
        try:
            params = parse(config)
            name = name_of(entry, params)
        except ParamsError as exc:
            raise ParamsError(f"{where}: {exc}") from None
        if name in names:
            raise ParamsError(f"{where}: duplicate target name {name!r}")
        names.add(name)
        targets.append(Target(name=name, cron=cron, config=config, params=params))
    return targets


__all__ = ["Target", "read_targets", "target_cron", "target_entries", "targets_path"]
