"""How every job ends, and what the jobs did.

- :func:`run_summary`: one log line and the run's counters as run tags
  (``groundskeeper/count/<name>``);
- :func:`operations_summary_asset`: the ``operations_summary`` asset, which adds those counters
  up across runs (the arithmetic is the plain ``pipelines.common.summary``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import dagster as dg

from pipelines.common import summary
from pipelines.common.defs.metadata import metadata_from, table_from
from pipelines.common.summary import COUNT_TAG_PREFIX


def run_summary(context: Any, what: str, counters: Mapping[str, int], detail: str = "") -> None:
    """How a job ends: one ``summary:`` log line and the counters as run tags
    ``groundskeeper/count/<counter>`` (run-level metadata: on the run's page, filterable in the
    runs list, added up by ``operations_summary``). Zero counters are tagged too, so a run that
    found nothing says so. Called again in the same run (several partitions in one run), the
    counts add up."""
    counts = {name: int(value) for name, value in counters.items()}
    text = ", ".join(f"{name}={value}" for name, value in counts.items())
    context.log.info(f"summary: {what}: {text}" + (f" ({detail})" if detail else ""))
    run = context.instance.get_run_by_id(context.run_id)
    tags = run.tags if run is not None else {}
    context.instance.add_run_tags(
        context.run_id,
        {
            f"{COUNT_TAG_PREFIX}{name}": str(value + int(tags.get(f"{COUNT_TAG_PREFIX}{name}", "0") or 0))
            for name, value in counts.items()
        },
    )


def operations_summary_asset() -> dg.AssetsDefinition:
    """The ``operations_summary`` asset: per capability, the counters of the runs of the last 24
    hours and 7 days (their ``groundskeeper/count/...`` tags, see :func:`run_summary`)."""

    @dg.asset(
        name="operations_summary",
        group_name="operations",
        description=(
            "What the jobs did, per capability, over the last 24 hours and 7 days: reclaimed, retried, "
            "dead-lettered, redriven, batches sent, zombies collected. Added up from the runs' "
            "`groundskeeper/count/<counter>` tags, which every job sets as it ends."
        ),
        tags={"groundskeeper/capability": "operations"},
    )
    def operations_summary(context) -> dg.MaterializeResult:  # no annotation: this module has lazy annotations
        now = dt.datetime.now(dt.UTC)
        records = context.instance.get_run_records(
            filters=dg.RunsFilter(created_after=now - summary.WINDOWS["last_7d"]), limit=SUMMARY_RUN_LIMIT
        )
        runs = [summary.run_counts(r.dagster_run.job_name, r.create_timestamp, r.dagster_run.tags) for r in records]
        rows = summary.add_up(runs, now)
        figures = summary.totals(rows)
        context.log.info(
            f"summary: operations over {len(runs)} runs of the last 7 days; last 24 h: "
            + ", ".join(f"{k}={v}" for k, v in figures.items())
        )
        metadata = metadata_from({f"{k}_24h": v for k, v in figures.items()})
        metadata["per_capability"] = table_from(
            rows, {"capability": "capability", "counter": "counter", "last_24h": "24 h", "last_7d": "7 days"}
        )
        metadata["runs_read"] = dg.MetadataValue.int(len(runs))
        return dg.MaterializeResult(metadata=metadata)

    return operations_summary


SUMMARY_RUN_LIMIT = 20_000
"""Runs ``operations_summary`` reads at most (the newest of the last 7 days)."""
