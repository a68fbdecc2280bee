"""How every job ends, and the ``operations_summary`` asset (its arithmetic: ``pipelines.common.summary``)."""

import datetime as dt
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import dagster as dg

from pipelines.common import summary
from pipelines.common.defs.metadata import metadata_from, table_from


def run_summary(
    context: Any, what: str, counters: Mapping[str, int], detail: str = "", *, dry_run: bool = False
) -> None:
    """How a job ends: a ``summary:`` line and the counters, zeros too, as one run tag (a short runs
    list); called again in the same run, the counts add up (a job's first step calls :func:`own_outcome`). A dry
    run says so in its line and is tagged ``groundskeeper/dry_run=true``: its counters are never added up and its
    success resolves no incident."""
    counts = {name: int(value) for name, value in counters.items()}
    text = ", ".join(f"{name}={value}" for name, value in counts.items())
    detail = ", ".join(filter(None, ("dry run" if dry_run else "", detail)))
    context.log.info(f"summary: {what}: {text}" + (f" ({detail})" if detail else ""))
    run = context.instance.get_run_by_id(context.run_id)
    before = summary.run_counters(run.tags if run is not None else {})
    if before and run.parent_run_id:  # a re-execution of its last steps only (no first step to reset them)
        parent = context.instance.get_run_by_id(run.parent_run_id)
        before = {} if parent is not None and summary.run_counters(parent.tags) == before else before
    context.instance.add_run_tags(
        context.run_id, summary.counts_tag({**before, **{n: v + before.get(n, 0) for n, v in counts.items()}})
    )
    if dry_run:
        mark_dry_run(context)


def own_outcome(context: Any, also: Mapping[str, str] | None = None) -> None:
    """Called as a run's first step starts: a re-execution (the UI's, Dagster's run retries) starts with its
    parent's tags, whose outcome is the parent's. Those it inherited are reset: ``groundskeeper/counts`` to
    ``{}``, ``groundskeeper/dry_run`` to ``false``, the older per-counter tags to ``0`` and ``also``'s to their
    values, so that they tell this run's work only, even if it fails first (a re-execution of the last steps
    only: :func:`run_summary` leaves out counts equal to the parent's)."""
    if context.run.parent_run_id is None or context.retry_number:  # a step's retry: its run's outcome so far
        return
    tags = context.run.tags  # as launched: the parent's
    counters = {key: "0" for key in tags if key.startswith(summary.COUNT_TAG_PREFIX)}
    none_yet = {**summary.counts_tag({}), summary.DRY_RUN_TAG: "false", **counters, **(also or {})}
    if reset := {key: value for key, value in none_yet.items() if key in tags and tags[key] != value}:
        context.instance.add_run_tags(context.run_id, reset)


def mark_dry_run(context: Any) -> None:
    """Tags the run ``groundskeeper/dry_run=true``: its counters are never added up and its success resolves
    no incident (:func:`run_summary` does it for a dry run; a job without a summary calls it itself)."""
    context.instance.add_run_tags(context.run_id, {summary.DRY_RUN_TAG: "true"})


def operations_summary_asset(asset_graph: Callable[[], Any] | None = None) -> dg.AssetsDefinition:
    """Per capability, the counters of every run of the last 24 hours and 7 days; an ``__ASSET_JOB``
    run counts under its assets' capability, told by ``asset_graph()`` (default: the run's)."""

    @dg.asset(
        name="operations_summary",
        group_name="operations",
        description=(
            "What the jobs did, per capability, over the last 24 hours and 7 days: reclaimed, retried "
            "(reclaim's agendas and progressor's timers apart), dead-lettered, redriven, batches sent, zombies "
            "collected. Added up from the runs' `groundskeeper/counts` tag, which every job sets as it ends, of "
            "every run of the 7 days whatever their number (`runs_read`; `window_complete`) but dry runs' "
            "(`groundskeeper/dry_run`); a run launched from an asset page or a backfill counts under its assets' "
            "capability."
        ),
        tags={"groundskeeper/capability": "operations"},
    )
    def operations_summary(context) -> dg.MaterializeResult:  # no annotation: this module has lazy annotations
        now = dt.datetime.now(dt.UTC)
        try:
            graph = asset_graph() if asset_graph else context.repository_def.asset_graph
            nodes = {key: graph.get(key) for key in graph.get_all_asset_keys()}
            of_asset = {key: node.tags.get(summary.CAPABILITY_TAG) or node.group_name for key, node in nodes.items()}
        except Exception:  # materialized alone (dg.materialize): no code location to tell the assets by
            of_asset = {}
        read = 0

        def runs() -> Iterator[summary.RunCounts]:  # every run of the 7 days, a page at a time
            nonlocal read
            for run in window_runs(context.instance, now - summary.WINDOWS["last_7d"], of_asset=of_asset):
                read += 1
                yield run

        rows = summary.add_up(runs(), now)
        figures = summary.totals(rows)
        context.log.info(
            f"summary: operations over all {read} runs of the last 7 days; last 24 h: "
            + ", ".join(f"{k}={v}" for k, v in figures.items())
        )
        metadata = metadata_from({f"{k}_24h": v for k, v in figures.items()})
        metadata["per_capability"] = table_from(
            rows, {"capability": "capability", "counter": "counter", "last_24h": "24 h", "last_7d": "7 days"}
        )
        metadata |= metadata_from({"runs_read": read, "window_complete": True})
        return dg.MaterializeResult(metadata=metadata)

    return operations_summary


PAGE_RUNS = 5_000
"""Runs read from the run storage at a time: what ``operations_summary`` holds in memory at most."""


def window_runs(
    instance: Any, since: dt.datetime, page: int = PAGE_RUNS, of_asset: Mapping[Any, str | None] | None = None
) -> Iterator[summary.RunCounts]:
    """Every run created after ``since``, oldest first, ``page`` runs at a time (bounded memory); a run
    without a capability tag counts under its assets' (``of_asset``: asset key -> capability)."""
    cursor = None
    while True:
        records = instance.get_run_records(
            filters=dg.RunsFilter(created_after=since), limit=page, cursor=cursor, ascending=True
        )
        for record in records:
            run = record.dagster_run
            selected: tuple[Any, ...] = ()
            if not run.tags.get(summary.CAPABILITY_TAG) and summary.run_counters(run.tags):  # counts under its assets
                selected = (*(run.asset_selection or ()), *(k.asset_key for k in run.asset_check_selection or ()))
            capabilities = ((of_asset or {}).get(key) for key in selected)
            yield summary.run_counts(run.job_name, record.create_timestamp, run.tags, capabilities)
        if len(records) < page:
            return
        cursor = records[-1].dagster_run.run_id
