"""``delayed_run_retries`` (docs/retry.md, "Run retries"): a plain ``dg.sensor``, not a run-failure sensor,
so that the retries waiting for their delay are kept in its own cursor."""

import contextlib
import json
import math
import time
from collections.abc import Sequence

import dagster as dg

from pipelines.common.defs.active_runs import (
    child_run,
    first_position,
    not_retried,
    other_location,
    run_assets,
    status_changes,
)
from pipelines.common.summary import COUNT_TAG_PREFIX, COUNTS_TAG, DRY_RUN_TAG
from pipelines.retry.runs import RETRY_SENSOR, run_retry
from pipelines.retry.simulate import human
from pipelines.retry.tags import ATTEMPT_TAG, DAGSTER_PARENT_TAG, PARTITION_TAG, POLICY_TAG, RETRY_OF_TAG, ROOT_TAG

__all__ = ["SENSOR_NAME", "build_delayed_run_retries"]

SENSOR_NAME = RETRY_SENSOR
FAILURES_PER_TICK = 100  # run-failure events read per tick (the rest are read next tick)
RETRIES_PER_TICK = 50  # due retries handled per tick, the oldest due first (the rest are handled next tick)
# Dagster's own tags describe where the failed run came from (its sensor, run key...) and are
# dropped, except these settings, which the re-launch keeps (the backfill, while it goes on, as Dagster's
# own re-execution does: its run-queue limit holds its retries too, and cancelling it ends them). The
# partition goes through RunRequest.partition_key.
_KEPT_SYSTEM_TAGS = frozenset(
    f"dagster/{name}"
    for name in (
        "backfill",
        "priority",
        "max_runtime",
        "isolation",
        "concurrency_key",
        "max_retries",
        "retry_strategy",
        "retry_on_asset_or_op_failure",
        "asset_partition_range_start",
        "asset_partition_range_end",
    )
)
BACKFILL_TAG = "dagster/backfill"
_SYSTEM_TAG_PREFIXES = ("dagster/", ".dagster/", COUNTS_TAG, COUNT_TAG_PREFIX, DRY_RUN_TAG)  # the failed run's outcome


def now() -> float:
    return time.time()


def _cursor_state(context: dg.SensorEvaluationContext) -> tuple[int | None, dict[str, dict]]:
    """(last run-failure event storage id read, retries waiting) from the cursor; a cursor that an
    operator set to something else starts over (the last hour's failures; run keys still hold)."""
    if not context.cursor:
        return None, {}
    with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError, OverflowError):
        state = json.loads(context.cursor)
        after, pending = state.get("after"), state.get("pending", {})
        if (after is None or isinstance(after, int)) and isinstance(pending, dict):
            for item in pending.values():
                due, _, _ = item["due"], int(item["attempt"]), str(item["job"])  # an item not a dict raises
                if isinstance(due, bool) or not math.isfinite(due):  # so does a string: due is epoch seconds
                    raise ValueError(due)
            return after, pending
    context.log.warning(f"ignoring an unreadable cursor {context.cursor[:200]!r}: starting over")
    return None, {}


def _gone_partition(context: dg.SensorEvaluationContext, run: dg.DagsterRun) -> str | None:
    """The failed run's partition if its job no longer has it, or is no longer partitioned (a run request for it
    would fail the whole tick)."""
    partition = run.tags.get(PARTITION_TAG)
    if not partition:
        return None
    partitions_def = context.repository_def.get_job(run.job_name).partitions_def
    with dg.partition_loading_context(dynamic_partitions_store=context.instance):
        return partition if partitions_def is None or not partitions_def.has_partition_key(partition) else None


def _materialized_since(instance: dg.DagsterInstance, failed: dg.RunRecord) -> bool:
    """Whether every asset the failed run was to materialize has a materialization of its partition since it
    failed: completion cancels a scheduled attempt (the retry RFC)."""
    run, partition = failed.dagster_run, failed.dagster_run.tags.get(PARTITION_TAG)
    if not partition:
        return False
    keys = run_assets(instance, run)
    wanted = [dg.AssetRecordsFilter(key, [partition], after_timestamp=failed.end_time) for key in keys]
    return bool(wanted) and all(instance.fetch_materializations(w, limit=1).records for w in wanted)


def build_delayed_run_retries(jobs: Sequence) -> dg.SensorDefinition:
    """``jobs``: every job of the code location."""
    job_names = {job.name for job in jobs}

    @dg.sensor(
        name=SENSOR_NAME,
        jobs=list(jobs),
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Re-launches a failed run of a job tagged {POLICY_TAG}=<preset | JSON policy> after the "
            f"policy's delay, tagged {ATTEMPT_TAG} and {RETRY_OF_TAG}. Skips terminated runs, runs of part of "
            "their job, of a backfill cancelled, of a partition gone or materialized since (docs/retry.md)."
        ),
    )
    def delayed_run_retries(context: dg.SensorEvaluationContext):
        instance = context.instance
        after, pending = _cursor_state(context)
        clock = now()
        if after is None:  # never read: a position, so that a sensor stopped for hours misses no failure
            after = first_position(instance, dg.DagsterEventType.RUN_FAILURE, clock)
        failures = status_changes(instance, dg.DagsterEventType.RUN_FAILURE, after, FAILURES_PER_TICK)
        ids = [r.run_id for r in failures]
        runs = {run.run_id: run for run in instance.get_runs(dg.RunsFilter(run_ids=ids))} if ids else {}
        after = failures[-1].storage_id if ids else after
        here = context.code_location_origin.location_name if context.code_location_origin else None
        for record in failures:
            run = runs.get(record.run_id)
            if run is None or run.run_id in pending or POLICY_TAG not in run.tags:
                continue
            if other_location(run, here):
                continue  # another code location's run (as dg.run_failure_sensor, which also skips them)
            decided = run_retry(run.tags, run.run_id)  # the decision alerting reads too
            prefix = f"run {run.run_id} of {run.job_name}"
            if decided.wait is None:
                (context.log.error if decided.bad_tags else context.log.info)(f"{prefix}: {decided.why}")
                continue
            context.log.info(f"{prefix} failed (attempt {decided.attempt}); {decided.why}")
            if reason := not_retried(instance, run, job_names, here):
                context.log.warning(f"run {run.run_id}: not retried, {reason}")
                continue
            due = record.timestamp + decided.wait  # epoch seconds; the attempt is that of the run to launch
            pending[run.run_id] = {"job": run.job_name, "due": due, "attempt": decided.attempt + 1}

        requests = []
        ready = sorted((kv for kv in pending.items() if kv[1]["due"] <= clock), key=lambda kv: kv[1]["due"])
        for run_id, item in ready[:RETRIES_PER_TICK]:
            del pending[run_id]
            found = instance.get_run_record_by_id(run_id)
            run = found.dagster_run if found else None
            if run is None:
                reason = "it was deleted"
            elif not (reason := not_retried(instance, run, job_names, here)):
                how = {DAGSTER_PARENT_TAG: "re-executed", RETRY_OF_TAG: "retried"}
                child = child_run(instance, run_id, how)
                reason = f"it was already {how[child[0]]} as run {child[1]}" if child else None
            if not reason and (gone := _gone_partition(context, run)):
                reason = f"its partition {gone} is gone"  # a dynamic partition deleted, a window that moved on
            if not reason and _materialized_since(instance, found):
                reason = f"partition {run.tags[PARTITION_TAG]} of its assets was materialized since it failed"
            backfill = instance.get_backfill(run.tags[BACKFILL_TAG]) if run and BACKFILL_TAG in run.tags else None
            going = getattr(getattr(backfill, "status", None), "value", None)  # a backfill's retry: while it goes on
            if not reason and going in ("CANCELING", "CANCELED", "FAILING", "FAILED"):
                reason = f"its backfill {run.tags[BACKFILL_TAG]} is {going.lower()}"
            if reason:
                context.log.info(f"run {run_id}: not retried, {reason}")
                continue
            context.log.info(f"re-launching run {run_id} of {run.job_name} as attempt {item['attempt']}")
            kept = {
                k: v
                for k, v in run.tags.items()
                if (k in _KEPT_SYSTEM_TAGS and (k != BACKFILL_TAG or going == "REQUESTED"))
                or not k.startswith(_SYSTEM_TAG_PREFIXES)
            }
            retry = {ATTEMPT_TAG: str(item["attempt"]), RETRY_OF_TAG: run_id, ROOT_TAG: run.tags.get(ROOT_TAG, run_id)}
            requests.append(
                dg.RunRequest(
                    run_key=run_id,  # one failed run is never re-launched twice
                    job_name=run.job_name,
                    run_config=run.run_config,
                    tags={**kept, **retry},
                    asset_selection=list(run.asset_selection) if run.asset_selection else None,
                    partition_key=run.tags.get(PARTITION_TAG),
                )
            )

        cursor = json.dumps({"after": after, "pending": pending}, sort_keys=True)
        if requests:
            return dg.SensorResult(run_requests=requests, cursor=cursor)
        waiting = ", ".join(f"{rid} in {human(max(0.0, i['due'] - clock))}" for rid, i in list(pending.items())[:5])
        return dg.SensorResult(
            skip_reason=f"waiting: {waiting}" if pending else "no failed run to retry", cursor=cursor
        )

    return delayed_run_retries
