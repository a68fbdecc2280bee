"""What the jobs did, added up across runs: the plain logic of the ``operations_summary`` asset.

Every job ends with :func:`pipelines.common.defs.summary.run_summary`, which tags its run with its
counters (``groundskeeper/count/<counter>``). :func:`add_up` sums those tags per capability over
the last 24 hours and 7 days.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

COUNT_TAG_PREFIX = "groundskeeper/count/"
CAPABILITY_TAG = "groundskeeper/capability"
COUNTERS = ("reclaimed", "retried", "dead_lettered", "redriven", "batches_sent", "zombies_collected")
"""The counters the summary shows, in this order; a run's other counters stay on the run."""
WINDOWS = {"last_24h": dt.timedelta(hours=24), "last_7d": dt.timedelta(days=7)}


@dataclass(frozen=True)
class RunCounts:
    """One run's counters: its capability (or job name), when it was created, its count tags."""

    capability: str
    created: dt.datetime
    tags: Mapping[str, str]

    def counts(self) -> dict[str, int]:
        out = {}
        for key, value in self.tags.items():
            if key.startswith(COUNT_TAG_PREFIX) and key[len(COUNT_TAG_PREFIX) :] in COUNTERS:
                try:
                    out[key[len(COUNT_TAG_PREFIX) :]] = int(value)
                except ValueError:
                    continue
        return out


def run_counts(job_name: str, created: dt.datetime, tags: Mapping[str, str]) -> RunCounts:
    if created.tzinfo is None:
        created = created.replace(tzinfo=dt.UTC)
    return RunCounts(tags.get(CAPABILITY_TAG) or job_name, created, tags)


def add_up(runs: Iterable[RunCounts], now: dt.datetime) -> list[dict]:
    """Rows ``{capability, counter, last_24h, last_7d, runs_7d}``, by capability then in
    :data:`COUNTERS` order, for every counter some run of the last 7 days reported (also 0)."""
    sums: dict[tuple[str, str], dict[str, int]] = {}
    for run in runs:
        age = now - run.created
        if age > WINDOWS["last_7d"] or age < dt.timedelta(0):
            continue
        for counter, value in run.counts().items():
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
    """Each counter over every capability in the last 24 hours (key figures for the Plots tab)."""
    out = dict.fromkeys(COUNTERS, 0)
    for row in rows:
        out[row["counter"]] += row["last_24h"]
    return out
