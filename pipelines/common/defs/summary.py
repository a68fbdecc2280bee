"""How every job ends, and what the jobs did.

- :func:`run_summary`: one log line and the run's counters as one compact JSON run tag
  (``groundskeeper/counts``);
- :func:`operations_summary_asset`: the ``operations_summary`` asset, which adds those counters
  up across runs (the arithmetic is the plain ``pipelines.common.summary``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

import dagster as dg

from pipelines.common import summary
from pipelines.common.defs.metadata import metadata_from, table_from


def run_summary(context: Any, what: str, counters: Mapping[str, int], detail: str = "") -> None:
    """How a job ends: one ``summary:`` log line and the counters as one compact JSON run tag,
    ``groundskeeper/counts`` (run-level metadata: on the run's page, added up by
    ``operations_summary``; one tag, so that the runs list stays short). Zero counters are tagged
    too, so a run that found nothing says so. Called again in the same run (several partitions in
    one run), the counts add up."""
    counts = {name: int(value) for name, value in counters.items()}
    text = ", ".join(f"{name}={value}" for name, value in counts.items())
    context.log.info(f"summary: {what}: {text}" + (f" ({detail})" if detail else ""))
    run = context.instance.get_run_by_id(context.run_id)
    before = summary.run_counters(run.tags if run is not None else {})
    context.instance.add_run_tags(
        context.run_id, summary.counts_tag({**before, **{n: v + before.get(n, 0) for n, v in counts.items()}})
    )


def asset_capabilities(asset_graph: Any) -> dict[Any, str]:
    """Each asset's capability: its ``groundskeeper/capability`` tag, else its group's name."""
    out = {}
    for key in asset_graph.get_all_asset_keys():
        node = asset_graph.get(key)
        out[key] = node.tags.get(summary.CAPABILITY_TAG) or node.group_name
    return out


def operations_summary_asset(asset_graph: Callable[[], Any] | None = None) -> dg.AssetsDefinition:
    """The ``operations_summary`` asset: per capability, the counters of the runs of the last 24
    hours and 7 days (their ``groundskeeper/counts`` tag, see :func:`run_summary`). A run launched
    from an asset page or a backfill (Dagster's ``__ASSET_JOB``) counts under its assets' capability,
    told by the code location's assets (``asset_graph()``, default: the run's repository)."""

    @dg.asset(
        name="operations_summary",
        group_name="operations",
        description=(
            "What the jobs did, per capability, over the last 24 hours and 7 days: reclaimed, retried "
            "(reclaim's agendas and progressor's timers apart), dead-lettered, redriven, batches sent, zombies "
            "collected. Added up from the runs' `groundskeeper/counts` tag, which every job sets as it ends; "
            "a run launched from an asset page or a backfill counts under its assets' capability."
        ),
        tags={"groundskeeper/capability": "operations"},
    )
    def operations_summary(context) -> dg.MaterializeResult:  # no annotation: this module has lazy annotations
        now = dt.datetime.now(dt.UTC)
        records = context.instance.get_run_records(
            filters=dg.RunsFilter(created_after=now - summary.WINDOWS["last_7d"]), limit=SUMMARY_RUN_LIMIT
        )
        try:
            of_asset = asset_capabilities(asset_graph() if asset_graph else context.repository_def.asset_graph)
        except Exception:  # materialized alone (dg.materialize): no code location to tell the assets by
            of_asset = {}
        runs = []
        for record in records:
            run = record.dagster_run
            selected = [*(run.asset_selection or ()), *(k.asset_key for k in run.asset_check_selection or ())]
            assets = (of_asset.get(key) for key in selected)
            runs.append(summary.run_counts(run.job_name, record.create_timestamp, run.tags, assets))
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
