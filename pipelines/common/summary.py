"""What the jobs did, added up across runs: the plain logic of the ``operations_summary`` asset."""

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

COUNTS_TAG = "groundskeeper/counts"
COUNT_TAG_PREFIX = "groundskeeper/count/"
"""One tag per counter: how runs were tagged before :data:`COUNTS_TAG` (still read)."""
CAPABILITY_TAG = "groundskeeper/capability"
DRY_RUN_TAG = "groundskeeper/dry_run"
"""``true`` on a dry run (it changed nothing): its counters stay on the run, never added up, and its success
resolves no incident."""
COUNTERS = ("reclaimed", "retried", "dead_lettered", "redriven", "batches_sent", "zombies_collected")
"""The counters the summary shows, in this order; a run's other counters stay on the run."""
FIGURES = {
    "reclaimed": ("reclaimed", None),
    "agendas_retried": ("retried", "reclaim"),
    "timers_retried": ("retried", "progressor"),
    "dead_lettered": ("dead_lettered", None),
    "redriven": ("redriven", None),
    "batches_sent": ("batches_sent", None),
    "zombies_collected": ("zombies_collected", None),
}
"""The key figures (last 24 hours): figure -> (counter, capability or None for all). Reclaim's and
progressor's retries are different things, so they are two figures."""
WINDOWS = {"last_24h": dt.timedelta(hours=24), "last_7d": dt.timedelta(days=7)}


def counts_tag(counters: Mapping[str, int]) -> dict[str, str]:
    """The run tag that carries ``counters``: ``{"groundskeeper/counts": '{"reclaimed":3}'}``."""
    return {COUNTS_TAG: json.dumps({name: int(value) for name, value in counters.items()}, separators=(",", ":"))}


def is_dry_run(tags: Mapping[str, str]) -> bool:
    """Whether a run is tagged a dry run (:data:`DRY_RUN_TAG`)."""
    return tags.get(DRY_RUN_TAG) == "true"


def counters_of(result: Mapping[str, Any]) -> dict[str, int]:
    """A result's counters: its whole numbers (flags, figures and text left out)."""
    return {name: value for name, value in result.items() if isinstance(value, int) and not isinstance(value, bool)}


def run_counters(tags: Mapping[str, str]) -> dict[str, int]:
    """Every whole-number counter a run is tagged with (also in the older one tag per counter)."""
    out = {key.removeprefix(COUNT_TAG_PREFIX): value for key, value in tags.items() if key.startswith(COUNT_TAG_PREFIX)}
    try:
        packed = json.loads(tags.get(COUNTS_TAG) or "{}")
    except ValueError:
        packed = {}
    if isinstance(packed, dict):
        out.update(packed)
    counters = {}
    for name, value in out.items():
        try:
            count = int(value)
        except (TypeError, ValueError, OverflowError):  # JSON's 1e400 is an infinity
            continue
        if count >= 0:  # a tag set at launch may say anything: no count is below zero
            counters[str(name)] = count
    return counters


@dataclass(frozen=True)
class RunCounts:
    """One run's counters of :data:`COUNTERS`: its capability, when it was created, its job."""

    capability: str
    created: dt.datetime
    counts: Mapping[str, int]
    job_name: str


def run_counts(
    job_name: str, created: dt.datetime, tags: Mapping[str, str], asset_capabilities: Iterable[str] = ()
) -> RunCounts:
    """A run's counts under its capability: its tag, else its assets' (joined with ``+``), else its job's name;
    a dry run's none (it did nothing)."""
    from_assets = "+".join(sorted(set(filter(None, asset_capabilities))))
    capability = tags.get(CAPABILITY_TAG) or from_assets or job_name
    counted = {} if is_dry_run(tags) else run_counters(tags)
    counts = {name: value for name, value in counted.items() if name in COUNTERS}
    return RunCounts(capability, created if created.tzinfo else created.replace(tzinfo=dt.UTC), counts, job_name)


def add_up(runs: Iterable[RunCounts], now: dt.datetime) -> list[dict]:
    """Rows ``{capability, counter, last_24h, last_7d, runs_7d}`` of every counter reported in 7 days."""
    sums: dict[tuple[str, str], dict[str, int]] = {}
    for run in runs:
        age = now - run.created
        if age > WINDOWS["last_7d"] or age < dt.timedelta(0):
            continue
        for counter, value in run.counts.items():
            row = sums.setdefault((run.capability, counter), {"last_24h": 0, "last_7d": 0, "runs_7d": 0})
            row["last_7d"] += value
            row["runs_7d"] += 1
            if age <= WINDOWS["last_24h"]:
                row["last_24h"] += value
    order = {name: n for n, name in enumerate(COUNTERS)}
    return [
        {"capability": capability, "counter": counter, **values}
        for (capability, counter), values in sorted(sums.items(), key=lambda kv: (kv[0][0], order[kv[0][1]]))
    ]


def totals(rows: Iterable[Mapping]) -> dict[str, int]:
    """The key figures (:data:`FIGURES`) over the last 24 hours, for the Plots tab."""
    out = dict.fromkeys(FIGURES, 0)
    for row in rows:
        for figure, (counter, capability) in FIGURES.items():
            if row["counter"] == counter and capability in (None, row["capability"]):
                out[figure] += row["last_24h"]
    return out
