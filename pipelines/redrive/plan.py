"""Which partitions a redrive launches, and its per-partition report (no Dagster)."""

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from pipelines.redrive.params import RedriveParams

FAILED, MISSING, IN_PROGRESS, GONE = "failed", "missing", "in_progress", "gone"
IN_BACKFILL = "in_backfill"  # a backfill that has not finished yet (e.g. an earlier redrive) targets it
LAUNCHED, WOULD_LAUNCH, SKIPPED = "launched", "would_launch", "skipped"


@dataclass(frozen=True)
class Outcome:
    partition: str
    state: str  # failed | missing | in_progress | in_backfill | gone (no longer a partition, e.g. a deleted receiver)
    outcome: str  # launched | would_launch | skipped
    detail: str = ""


def plan(
    states: Mapping[str, str],
    params: RedriveParams,
    backfills: Mapping[str, str] | None = None,
    retries: Mapping[str, str] | None = None,
) -> list[Outcome]:
    """Failed partitions first, then (if asked) missing ones, each in key order; at most
    ``max_runs`` are launched, a partition with a run in progress, an unfinished backfill
    (``backfills``: partition -> backfill id) or an automatic retry due (``retries``: partition -> when) never is."""
    order = {FAILED: 0, MISSING: 1, IN_PROGRESS: 2, IN_BACKFILL: 3, GONE: 4}
    backfills, retries = backfills or {}, retries or {}
    wanted = [(k, s) for k, s in states.items() if s != MISSING or params.include_missing]
    out: list[Outcome] = []
    launched = 0
    for key, state in sorted(wanted, key=lambda ks: (order[ks[1]], ks[0])):
        if state == IN_PROGRESS:
            out.append(Outcome(key, state, SKIPPED, "a run of this partition is in progress"))
        elif state == IN_BACKFILL:
            out.append(Outcome(key, state, SKIPPED, f"backfill {backfills.get(key, '?')} has not finished it yet"))
        elif state == GONE:
            out.append(Outcome(key, state, SKIPPED, "no longer a partition of the asset"))
        elif key in retries:
            out.append(Outcome(key, state, SKIPPED, f"a retry is due at {retries[key]}"))
        elif launched >= params.max_runs:
            out.append(Outcome(key, state, SKIPPED, f"over max_runs ({params.max_runs})"))
        else:
            launched += 1
            out.append(Outcome(key, state, WOULD_LAUNCH if params.dry_run else LAUNCHED))
    return out


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    return {outcome: sum(o.outcome == outcome for o in outcomes) for outcome in (LAUNCHED, WOULD_LAUNCH, SKIPPED)}


def report(params: RedriveParams, run_id: str, backfill_id: str | None, outcomes: list[Outcome]) -> tuple[str, bytes]:
    """The per-partition report: its key in the archive bucket, and its body."""
    body = {
        "asset": params.asset,
        "run_id": run_id,
        "backfill_id": backfill_id,
        "params": asdict(params),
        "counts": counts(outcomes),
        "partitions": [asdict(o) for o in outcomes],
    }
    return f"redrives/{params.asset.strip('/')}/{run_id}.json", json.dumps(body, indent=1, sort_keys=True).encode()
