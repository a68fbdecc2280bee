"""What each source observed (runs, checks, ticks, queues), as :class:`Signal` s: plain values in, signals
out, so that each kind of alert is decided in one place. No Dagster."""

import contextlib
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from pipelines.alerts.incidents import SUMMARY_CHARS, Signal
from pipelines.common import first_line
from pipelines.common.summary import CAPABILITY_TAG, run_counters
from pipelines.retry.runs import RETRY_MARGIN_SECONDS, run_retry
from pipelines.retry.simulate import human
from pipelines.retry.tags import ATTEMPT_TAG, DAGSTER_PARENT_TAG, PARTITION_TAG, POLICY_TAG, RETRY_OF_TAG, ROOT_TAG

DAGSTER_RETRY_NUMBER_TAG = "dagster/retry_number"  # Dagster's own run retries (run_retries in dagster.yaml)
DEMO_MARK = "[demo] "
PROGRESSOR_TIMERS_CHECK = "timers_on_time"  # progressor's check: its failure is progressor_overdue
# a lineage that delayed_run_retries still retries this long after its first run failed alerts all the same
STILL_FAILING_SECONDS = 3600.0
# checks that measure what another source alerts on (one source per signal): never a check_failure
CHECKS_WITH_THEIR_OWN_SOURCE = {"dead_letter_depth": "dead_letters"}


def as_demo(signal: Signal) -> Signal:
    """The local demo's doing (a check it fails on purpose, a run of its own jobs): marked in its title,
    which every surface shows, and never critical."""
    title = signal.title if signal.title.startswith(DEMO_MARK) else DEMO_MARK + (signal.title or signal.alert_key)
    severity = "warning" if signal.severity == "critical" else signal.severity
    return dataclasses.replace(signal, title=title, severity=severity)


def _ui(ui_url: str | None, path: str) -> str | None:
    return f"{ui_url}{path}" if ui_url else None


def attempt_of(tags: Mapping[str, str]) -> int:
    """The attempt number of a run in its lineage (1 for the original run)."""
    for tag, offset in ((ATTEMPT_TAG, 0), (DAGSTER_RETRY_NUMBER_TAG, 1)):
        with contextlib.suppress(KeyError, ValueError):  # absent, or not a number: the next one
            return max(1, int(tags[tag]) + offset)
    return 1


def lineage_root(run_id: str, tags: Mapping[str, str]) -> str:
    """The original run of a run's retries (ours or Dagster's)."""
    return tags.get(ROOT_TAG) or tags.get("dagster/root_run_id") or run_id


def automatic_retry(
    tags: Mapping[str, str], run_id: str, instance: Any, skipped: str | None = None
) -> tuple[str, float, tuple[str, ...]] | None:
    """Whether a failed run will be retried automatically, so that it does not alert yet (docs/alerts.md,
    ``run_failure``): (why, the seconds within which a run carrying one of the tags with its id must exist,
    those tags), else None. ``instance``: read for its ``run_retries_*`` settings and the lineage's runs;
    ``skipped``: why ``delayed_run_retries`` passes it over whatever its policy says (``not_retried``)."""
    if POLICY_TAG in tags and not skipped:
        decided = run_retry(tags, run_id)
        if decided.wait is not None:
            if still_failing(run_id, tags, instance):
                return None  # its alert says that its retries go on (run_failed)
            why = f"delayed_run_retries retries it ({decided.why})"
            return why, decided.wait + RETRY_MARGIN_SECONDS, (RETRY_OF_TAG, DAGSTER_PARENT_TAG)
    if not instance.run_retries_enabled:
        return None
    dagster = (DAGSTER_PARENT_TAG,)
    if will_retry := tags.get("dagster/will_retry", "").strip().lower():  # Dagster's decision, on a failed run
        why = "Dagster's run retries retry it (dagster/will_retry)"
        return (why, RETRY_MARGIN_SECONDS, dagster) if will_retry == "true" else None
    instance_default = str(instance.run_retries_retry_on_asset_or_op_failure)
    on_step_failure = tags.get("dagster/retry_on_asset_or_op_failure", instance_default).strip().lower()
    if tags.get("dagster/failure_reason") == "STEP_FAILURE" and on_step_failure != "true":
        return None
    try:
        budget = int(tags.get("dagster/max_retries", instance.run_retries_max_retries))
        done = int(tags.get(DAGSTER_RETRY_NUMBER_TAG, "0"))
    except ValueError:
        return None
    if done >= budget:
        return None
    return f"Dagster's run retries retry it ({done} of {budget} used)", RETRY_MARGIN_SECONDS, dagster


def still_failing(run_id: str, tags: Mapping[str, str], instance: Any) -> bool:
    """Whether ``run_id`` failed ``STILL_FAILING_SECONDS`` or more after the first run of its lineage did (a
    first run that is gone: its age is unknown, so yes; one that did not fail, a re-execution's: no)."""
    root = lineage_root(run_id, tags)
    if root == run_id:
        return False
    first, this = instance.get_run_record_by_id(root), instance.get_run_record_by_id(run_id)
    if first is None:
        return True
    if first.dagster_run.status.value != "FAILURE" or first.end_time is None or this is None:
        return False
    return (this.end_time or first.end_time) - first.end_time >= STILL_FAILING_SECONDS


# run config keys that name what a run works on (reclaim's table, a metrics namespace, a queue, the housekeeping
# task, the dead-letter queue redrive_dead_letters redrives, the asset redrive_failed_partitions relaunches...)
TARGET_KEYS = frozenset(
    {"tableName", "table", "namespace", "queueUrl", "queue_url", "bucket", "receiver", "task_type", "queue", "asset"}
)
TARGET_CHARS = 80
_AWS_CODE = re.compile(r"An error occurred \(([A-Za-z0-9_.]+)\)|\(([A-Z][A-Za-z0-9]*(?:Exception|Error|Fault))\)")
_LEADING_CLASS = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception|Failure|Timeout))\b")


def config_targets(run_config: Any) -> list[str]:
    """The values of ``TARGET_KEYS`` anywhere in a run's config (ops', resources'), sorted."""
    found: set[str] = set()
    stack = [run_config]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            for key, value in node.items():
                if key in TARGET_KEYS and isinstance(value, str | int) and str(value).strip():
                    found.add(str(value).strip())
                else:
                    stack.append(value)
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return sorted(found)


def work_unit(what: str, tags: Mapping[str, str], run_config: Any = None) -> str:
    """The unit of work a run did: ``what`` (its job, or the assets it materializes), its partition
    and its target (read from its config). A failure and the success that resolves it share it."""
    partition = tags.get(PARTITION_TAG)
    targets = ",".join(config_targets(run_config))
    unit = what + (f":{partition}" if partition else "")
    return unit + (f"@{first_line(targets, TARGET_CHARS)}" if targets else "")


def cause_of(error_classes: list[str], messages: list[str]) -> str:
    """The class of a failure's cause, from its error chain (outermost first): the AWS error code
    one of its messages names, else the first class under Dagster's and ``Failure``'s wrapping,
    else the class its first message starts with, else ``failure``."""
    for message in messages:
        if code := _AWS_CODE.search(message or ""):
            return code.group(1) or code.group(2)
    for name in error_classes:
        if not name.startswith("Dagster") and name not in ("Failure", "ClientError"):
            return name
    leading = _LEADING_CLASS.match((messages[0] if messages else "").strip())
    return leading.group(1) if leading else "failure"


@dataclass(frozen=True)
class RunEnd:
    """A finished run, as its alerts name it: ``job`` (its job, or the assets it materializes), its unit
    of work (:func:`work_unit`) and ``at``, when it ended (a failure's: the incident's first_seen); a successful
    re-execution's ``completes``: the id of each failed run whose undone work it did -> that run's unit of work."""

    job: str
    run_id: str
    tags: Mapping[str, str]
    unit: str
    ui_url: str | None = None
    at: float | None = None
    completes: Mapping[str, str] = dataclasses.field(default_factory=dict)


def run_failed(run: RunEnd, first_error: str, cause: str = "failure", note: str = "") -> Signal:
    attempts = attempt_of(run.tags)
    partition = run.tags.get(PARTITION_TAG)
    target = f" partition {partition}" if partition else ""
    if not note and POLICY_TAG in run.tags and (wait := run_retry(run.tags, run.run_id).wait) is not None:
        note = f"retries go on (the next in {human(wait)})"  # a lineage still failing (still_failing)
    retries = f" after {attempts} attempts" if attempts > 1 else ""
    return Signal(
        alert_key=f"run_failure:{run.unit}:{cause}",  # a new cause is a new incident
        kind="run_failure",
        firing=True,
        title=f"{run.job}{target} failed{retries}" + (f", {note}" if note else ""),
        summary=first_line(first_error, SUMMARY_CHARS) or "the run failed",
        capability=run.tags.get(CAPABILITY_TAG, ""),
        job=run.job,
        run_id=run.run_id,
        url=_ui(run.ui_url, f"/runs/{run.run_id}"),
        attempts=attempts,
        unit=run.unit,
        at=run.at,
    )


def run_succeeded(
    run: RunEnd, open_units: Mapping[str, str], open_runs: Mapping[str, str] | None = None
) -> list[Signal]:
    """A success resolves the open run failures of its unit of work, whatever their cause, and a re-execution those
    that a run it completes failed last (``open_units``: alert_key -> unit; ``open_runs``: alert_key -> the run
    that failed last): a later run's failure still stands; a reclaim run also says whether its table had item errors."""
    ran = {"job": run.job, "run_id": run.run_id, "url": _ui(run.ui_url, f"/runs/{run.run_id}")}
    attempts = attempt_of(run.tags)
    succeeded = f"run {run.run_id} succeeded" + (f" on attempt {attempts}" if attempts > 1 else "")
    resolves = {
        unit: f"{succeeded}, re-executing what run {failed} left undone" for failed, unit in run.completes.items()
    }
    resolves[run.unit] = succeeded
    out = [
        Signal(
            alert_key=key,
            kind="run_failure",
            firing=False,
            summary=resolves[their],
            unit=run.unit,
            **ran,
        )
        for key, their in sorted(open_units.items())
        if their in resolves and (their == run.unit or (open_runs or {}).get(key) in run.completes)
    ]
    counters = run_counters(run.tags)
    if run.tags.get(CAPABILITY_TAG) == "reclaim" and "errors" in counters:
        errors = counters["errors"]
        if run.unit != run.job:  # an incident of the whole job, from before they were per table: closed
            now = f"now one per table, reclaim_errors:{run.job}@<table>: a table still failing opens it at its next run"
            out.append(Signal(f"reclaim_errors:{run.job}", "reclaim_errors", False, summary=now, action="close"))
        out.append(
            Signal(
                alert_key=f"reclaim_errors:{run.unit}",  # per table: each has its own schedule
                kind="reclaim_errors",
                firing=errors > 0,
                severity="warning",
                title=f"{run.unit}: items could not be written",
                summary=f"{errors} item error(s) in run {run.run_id}: see its log"
                if errors
                else f"run {run.run_id}: no errors",
                capability="reclaim",
                **ran,
                at=run.at,
            )
        )
    return out


def partition_materialized(key: str, unit: str, run_id: str, job: str, ui_url: str | None) -> Signal:
    """The open run failure ``key`` of the asset partition ``unit``, resolved by ``run_id`` that materialized it
    since it failed."""
    summary = f"run {run_id} materialized {unit} since it failed"
    url = _ui(ui_url, f"/runs/{run_id}")
    return Signal(key, "run_failure", False, summary=summary, job=job, run_id=run_id, url=url)


def check_evaluated(
    asset: str,
    check: str,
    passed: bool,
    severity: str,
    description: str | None,
    *,
    run_id: str | None,
    ui_url: str | None,
    muted: frozenset[str] = frozenset(),
    at: float | None = None,
) -> Signal | None:
    """``severity``: Dagster's ``ERROR`` (critical) or ``WARN`` (warning; its failures muted per check, while a
    pass still resolves); ``at``: when it was evaluated. None when a muted check fails, or when another source
    alerts on what it measures (``CHECKS_WITH_THEIR_OWN_SOURCE``)."""
    warn = severity.upper().startswith("WARN")
    if (warn and not passed and f"{asset}:{check}" in muted) or check in CHECKS_WITH_THEIR_OWN_SOURCE:
        return None
    overdue = check == PROGRESSOR_TIMERS_CHECK
    return Signal(
        alert_key=f"check_failure:{asset}:{check}",
        kind="progressor_overdue" if overdue else "check_failure",
        firing=not passed,
        severity="warning" if warn else "critical",
        title=f"check {check} of {asset} " + ("passes" if passed else "fails"),
        summary=first_line(description, SUMMARY_CHARS) or ("passed" if passed else "failed"),
        capability="progressor" if overdue else "",
        run_id=run_id,
        asset=asset,
        check=check,
        url=_ui(ui_url, f"/assets/{quote(asset)}?view=checks"),
        at=at,
    )


def ticks_seen(
    name: str,
    kind: str,
    statuses: list[str],
    last_error: str | None,
    *,
    threshold: int,
    ui_url: str | None,
    repository: str,
) -> Signal | None:
    """``statuses``: the latest ticks' statuses, newest first (``FAILURE``, ``SUCCESS``, ``SKIPPED``...).
    Firing at ``threshold`` failures in a row; resolved by the next tick that did not fail. ``repository``:
    ``<repository>@<code location>``, where the UI has its page."""
    done = [s for s in statuses if s in ("FAILURE", "SUCCESS", "SKIPPED")]
    if not done:
        return None
    failures = next((i for i, s in enumerate(done) if s != "FAILURE"), len(done))
    if 0 < failures < threshold:
        return None  # failing, not yet often enough; no change either way
    return Signal(
        alert_key=f"tick_failure:{name}",
        kind="tick_failure",
        firing=failures >= threshold,
        title=f"{kind} {name}: {failures} failed ticks in a row" if failures else f"{kind} {name} ticks again",
        summary=first_line(last_error, SUMMARY_CHARS) if failures else "its last tick did not fail",
        url=_ui(ui_url, f"/locations/{quote(repository, safe='@')}/{kind}s/{quote(name)}"),
    )


def dead_letters(queue: str, depth: int) -> Signal:
    """A dead-letter queue's depth (one that cannot be read: :func:`depth_unread`)."""
    held = f"{depth} message(s) the processors could not handle: inspect, then redrive or drop them"
    return Signal(
        alert_key=f"dead_letters:{queue}",
        kind="dead_letters",
        firing=depth > 0,
        severity="warning",
        title=f"{queue} holds {depth} dead letter(s)" if depth else f"{queue} is empty",
        summary=held if depth else "no dead letters left",
        capability="fleet",
    )


UNREAD_ALERT_SECONDS = 300  # a dead-letter depth unread this long alerts: one throttled call does not


def depth_unread(queue: str, seconds: float | None, error: str = "") -> Signal | None:
    """A dead-letter queue whose depth has not been read for ``seconds`` (None: read again): firing from
    ``UNREAD_ALERT_SECONDS`` on (its dead letters would not alert), resolved once read; before, no change."""
    if seconds is not None and seconds < UNREAD_ALERT_SECONDS:
        return None
    return Signal(
        alert_key=f"dead_letters:{queue}:unread",
        kind="dead_letters",
        firing=seconds is not None,
        severity="warning",
        title=f"the depth of {queue} cannot be read" if seconds is not None else f"the depth of {queue} is read again",
        summary=(
            f"not read for {seconds / 60:.0f} min, its dead letters cannot alert: {first_line(error, 200)}"
            if seconds is not None
            else "its depth is read again"
        ),
        capability="fleet",
    )
