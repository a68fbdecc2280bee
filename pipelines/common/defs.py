"""The Dagster helpers every capability uses in the same way.

- :func:`config_schema` / :func:`flat_config` / :func:`params_from_config`: a parameters
  dataclass (``pipelines.common.params``) becomes the op's config schema with descriptions, a
  flat run config (a ``ConfigMapping``: the top-level keys of the run config are the
  parameters), and a validated instance inside the op, with deprecation warnings for old key
  names in the run log and one-line failures for bad values.
- :func:`aws_errors`: the one AWS failure policy. Around AWS work in an op, asset, asset check
  or sensor: a transient AWS error (throttling, 5xx, connection) is retried by the retry
  library's policy (``dg.RetryRequested`` with the policy's wait, in ops and assets), a
  permanent one fails with the one line of ``resources.errors``. Plain-Python code that works
  through a batch retries single calls with ``pipelines.retry.retry_call`` and the same kind of
  policy, so that one throttled call does not restart a whole op.
- :class:`CommittedChangeMetrics`: the one rule for metrics published after a committed change:
  they go to the deployment's metrics sink (CloudWatch or none), and a failed publish is a warning
  in the run log plus the metadata flag ``metrics_published: false``, never a failed run.
- :func:`metadata_from`: a result dict as UI metadata.
- :func:`active_run` / :func:`exclusive_schedule`: the one "is a run of this job still queued or
  running" check, for sensors and schedules that skip their tick (with a ``SkipReason`` naming the
  run) instead of piling up runs in the queue.
- :func:`metadata_from` / :func:`table_from`: a result dict as UI metadata, rows as a table;
  money (``*_usd``, ``*_usd_per_hour``) rounded to cents and percentages (``*_pct``) to one decimal.
- :func:`run_summary`: how every job ends: one log line and the run's counters as run tags
  (``groundskeeper/count/<name>``), which ``operations_summary`` adds up across runs.
- :func:`fan_out_executor`: the one place that picks the executor of the jobs that fan out
  (reclaim's segments, batching, the termination drain): the Celery workers under the ``cluster``
  deployment, None (the capability's own choice) everywhere else; each capability's job factory
  takes it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import dagster as dg

from pipelines.common import summary
from pipelines.common.aws_batches import CALL_POLICY
from pipelines.common.params import ParamsError, ParamSpec, parse_params, specs
from pipelines.common.summary import COUNT_TAG_PREFIX
from pipelines.retry import retry_call
from pipelines.retry.aws import ErrorKind, classify_aws_error
from pipelines.retry.policy import STOP, RetryPolicy, RetryPolicyError, exponential
from resources.errors import explain_aws_error

T = TypeVar("T")

_DAGSTER_TYPES: dict[type, Any] = {int: dg.Int, float: dg.Float, bool: dg.Bool, str: dg.String, list: dg.Array(dg.Any)}


def _field(spec: ParamSpec, description: str, *, with_default: bool) -> dg.Field:
    kind = dg.Permissive() if spec.kind is dict else _DAGSTER_TYPES[spec.kind]
    if spec.optional:
        kind = dg.Noneable(kind)
    if spec.required and with_default:
        return dg.Field(kind, is_required=True, description=description)
    if with_default and spec.default is not None:
        return dg.Field(kind, is_required=False, default_value=spec.default, description=description)
    return dg.Field(kind, is_required=False, description=description)


def config_schema(cls: type) -> dict[str, dg.Field]:
    """The Dagster config schema of a parameters dataclass: every field with its description,
    default and range; each old name as an optional field that says what replaced it."""
    schema: dict[str, dg.Field] = {}
    for spec in specs(cls):
        schema[spec.name] = _field(spec, spec.describe(), with_default=True)
        for alias in spec.aliases:
            schema[alias] = _field(spec, f"Deprecated: the old name of {spec.name}.", with_default=False)
    return schema


def flat_config(
    op_name: str, cls: type, *, execution: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
) -> dg.ConfigMapping:
    """A flat run config for a job whose parameters go to one op: ``{"max_messages": 10}``
    instead of ``{"ops": {op_name: {"config": {...}}}}``. ``execution`` may pick the executor's
    config from the values (it must not raise: the op validates, with a one-line error)."""

    def mapping(values: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"ops": {op_name: {"config": {k: v for k, v in values.items() if v is not None}}}}
        if execution is not None:
            out["execution"] = {"config": execution(values)}
        return out

    return dg.ConfigMapping(config_fn=mapping, config_schema=config_schema(cls))


def params_from_config(context: Any, cls: type[T], raw: Mapping[str, Any] | None = None) -> T:
    """The op's parameters, validated: old names log a deprecation warning in the run log; a bad
    value fails the op with one line and no retry. ``raw`` defaults to the op's config."""
    try:
        params, warnings = parse_params(cls, context.op_config if raw is None else raw)
    except ParamsError as exc:
        raise dg.Failure(description=f"invalid run config: {exc}", allow_retries=False) from None
    for warning in warnings:
        context.log.warning(f"run config: {warning}")
    return params


# ------------------------------------------------------------------------- AWS failures

DEFAULT_OP_POLICY = exponential(initial=2, coefficient=2, max_delay=60, max_attempts=3, jitter="full")
"""Ops that name no policy: 3 attempts, waits up to 2 s then 4 s (full jitter). botocore already
retries each call a few times; this is the second layer, for outages longer than a call."""

UNLIMITED_RETRIES = 10_000
"""``max_retries`` given to Dagster for a policy without ``max_attempts`` (Dagster needs a number)."""


def retry_requested(
    policy: RetryPolicy, error: BaseException, retry_number: int, rng: random.Random | None = None
) -> dg.RetryRequested | None:
    """The ``dg.RetryRequested`` for ``error`` after ``retry_number + 1`` attempts, or None when
    the error is not a transient AWS error, is non-retryable for the policy, or the policy says
    STOP. Raises ``RetryPolicyError`` if the policy itself fails (a user delay function)."""
    if not classify_aws_error(error).transient or not policy.is_retryable(error):
        return None
    wait = policy.delay(retry_number + 1, rng)
    if wait is STOP:
        return None
    max_retries = policy.max_attempts - 1 if policy.max_attempts is not None else UNLIMITED_RETRIES
    return dg.RetryRequested(max_retries=max_retries, seconds_to_wait=wait)


@contextlib.contextmanager
def aws_errors(context: Any, policy: RetryPolicy | None = None) -> Iterator[None]:
    """Around AWS work: retry transient AWS errors by ``policy`` (ops and assets; a sensor or an
    asset check cannot be retried, so there the error fails the tick or check), fail clearly
    otherwise. Errors that are not AWS errors pass through unchanged."""
    policy = policy or DEFAULT_OP_POLICY
    try:
        yield
    except Exception as exc:
        classified = classify_aws_error(exc)
        if classified.kind is ErrorKind.NOT_AWS:
            raise
        retry_number = getattr(context, "retry_number", None)
        attempts = (retry_number or 0) + 1
        if isinstance(retry_number, int):
            try:
                request = retry_requested(policy, exc, retry_number)
            except RetryPolicyError as policy_error:
                raise dg.Failure(description=f"retry policy error: {policy_error}", allow_retries=False) from exc
            if request is not None:
                context.log.warning(
                    f"attempt {attempts} failed with a transient AWS error ({classified.reason}); "
                    f"retrying in {request.seconds_to_wait:.1f}s ({policy.describe()})"
                )
                raise request from exc
        explained = explain_aws_error(exc)
        message = explained or classified.reason
        if classified.transient and not policy.is_retryable(exc):
            message = f"{message} (non-retryable for the policy {policy.describe()})"
        elif classified.transient and isinstance(retry_number, int):
            message = f"gave up after {attempts} attempt(s) ({policy.describe()}): {message}"
        # an explained error needs no botocore stack trace under it
        raise dg.Failure(description=message, allow_retries=False) from (None if explained else exc)


# ------------------------------------------------------------------- metrics after a change


class CommittedChangeMetrics:
    """The metrics client a capability's plain-Python code gets instead of the CloudWatch client.

    Metrics come after the change they count has committed (a collection, a reclaim, terminated
    instances), so a metrics failure must not fail the run: a retried op would redo that work, and a
    deployment without AWS would never succeed. ``put_metric_data`` goes to the deployment's metrics
    sink (the ``cloudwatch`` resource's ``metrics_sink``, ``METRICS_SINK``): CloudWatch, or none (no
    call at all). A failed call is one warning in the run log (the first; later ones are counted)
    and the run goes on; :attr:`published` is the ``metrics_published`` metadata flag."""

    def __init__(self, context: Any, cloudwatch: Any, what: str) -> None:
        self._log = context.log
        self._what = what
        self.sink = cloudwatch.metrics_sink
        self._client = cloudwatch.get_client() if self.sink == "cloudwatch" else None
        self.calls = 0
        self.failures = 0

    def put_metric_data(self, **request: Any) -> dict[str, Any]:
        if self._client is None:
            return {}
        try:  # a transient error is tried again first (the toolkit's policy for one call)
            response = retry_call(lambda: self._client.put_metric_data(**request), CALL_POLICY)
        except Exception as exc:  # any failure: the change is committed, the metrics are not worth a failed run
            self.failures += 1
            if self.failures == 1:
                reason = explain_aws_error(exc) or classify_aws_error(exc).reason
                self._log.warning(
                    f"{self._what}: metrics not published to CloudWatch ({reason}); what the run changed is "
                    "committed, the run goes on (metadata metrics_published: false)"
                )
            return {}
        self.calls += 1
        return response

    @property
    def published(self) -> bool:
        """Every call went through (False when the sink is none or a call failed)."""
        return self._client is not None and self.failures == 0


# ------------------------------------------------------------------------------ metadata


def rounded(key: str, value: Any) -> Any:
    """Money to cents, percentages to one decimal, by the key's suffix; NaN as None."""
    if isinstance(value, bool) or not isinstance(value, float):
        return value
    if math.isnan(value):
        return None
    if key.endswith(("_usd", "_usd_per_hour")):
        return round(value, 2)
    if key.endswith("_pct"):
        return round(value, 1)
    return value


def metadata_from(values: Mapping[str, Any]) -> dict[str, Any]:
    """A result as UI metadata: numbers and flags as such (money and percentages rounded, see
    :func:`rounded`), text as text, the rest as JSON. Empty values are left out."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, bool):
            out[key] = dg.MetadataValue.bool(value)
        elif isinstance(value, int):
            out[key] = dg.MetadataValue.int(value)
        elif isinstance(value, float):
            out[key] = dg.MetadataValue.float(rounded(key, value))
        elif isinstance(value, str):
            out[key] = dg.MetadataValue.text(value)
        elif value:
            out[key] = dg.MetadataValue.json(value)
    return out


# ------------------------------------------------------------------------ queue hygiene

ACTIVE_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]
"""A run in one of these is still queued or running (it has not finished, failed or been canceled)."""


def active_run(instance: dg.DagsterInstance, job_name: str, tags: Mapping[str, str] | None = None) -> Any:
    """The newest run of ``job_name`` (with all of ``tags``) that is still queued or running, or None."""
    runs = instance.get_runs(
        filters=dg.RunsFilter(job_name=job_name, statuses=ACTIVE_STATUSES, tags=dict(tags or {})), limit=1
    )
    return runs[0] if runs else None


def still_going(run: Any) -> str:
    """How a skip reason names the run that is still going: ``<run id> is still queued``."""
    state = "queued" if run.status in (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED) else "running"
    return f"{run.run_id} is still {state}"


def exclusive_schedule(
    *,
    name: str,
    job: Any,
    cron_schedule: str,
    description: str,
    run_config: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    same_run_tags: Mapping[str, str] | None = None,
) -> dg.ScheduleDefinition:
    """A schedule that launches ``job`` (with ``run_config`` and ``tags``) unless a run of the same
    job (with ``same_run_tags``, e.g. the same namespace) is still queued or running: then the tick
    skips and says which run."""
    job_name = job.name

    def evaluate(context: dg.ScheduleEvaluationContext):
        try:
            instance = context.instance
        except dg.DagsterInvariantViolationError:  # a bare build_schedule_context() in a test: no runs
            instance = None
        previous = active_run(instance, job_name, same_run_tags) if instance is not None else None
        if previous is not None:
            return dg.SkipReason(f"the previous {job_name} run {still_going(previous)}: not queueing another")
        return dg.RunRequest(run_config=dict(run_config or {}), tags=dict(tags or {}))

    return dg.ScheduleDefinition(
        name=name,
        job=job,
        cron_schedule=cron_schedule,
        execution_fn=evaluate,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"{description} Skips a tick while the previous run is still queued or running.",
    )


_COLUMN_TYPES = {bool: "bool", int: "int", float: "float"}


def table_from(rows: Iterable[Mapping[str, Any]], columns: Mapping[str, str]) -> dg.TableMetadataValue:
    """Rows as a ``dg.TableMetadataValue``. ``columns`` maps a row key to its header, in order;
    values are rounded by the key (:func:`rounded`). The asset page shows a table of at most 4
    columns inline, a wider one behind a link: keep the inline ones narrow."""
    records, kinds = [], dict.fromkeys(columns, "string")
    for row in rows:
        data = {}
        for key, header in columns.items():
            value = row.get(key)
            if hasattr(value, "item"):  # numpy scalars from pandas rows
                value = value.item()
            value = rounded(key, value)
            if value is not None and not isinstance(value, (bool, int, float, str)):
                value = str(value)
            kinds[key] = _COLUMN_TYPES.get(type(value), "string") if value is not None else kinds[key]
            data[header] = value
        records.append(dg.TableRecord(data=data))
    schema = dg.TableSchema(columns=[dg.TableColumn(header, kinds[key]) for key, header in columns.items()])
    return dg.TableMetadataValue(records=records, schema=schema)


# --------------------------------------------------------------------------- run summaries


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


# --------------------------------------------------------------------- cluster executor

CELERY_BROKER_ENV = "CELERY_BROKER_URL"
"""The broker of the ``cluster`` deployment (RabbitMQ: ``pyamqp://user:pass@host:5672/vhost``)."""

CELERY_BACKEND = "rpc://"
"""Results come back over the broker itself: no second service to run."""

CELERY_SETTINGS: dict[str, Any] = {
    # A step's task is acknowledged when it ends, not when a worker takes it: a worker killed
    # mid-step leaves it unacknowledged, and the broker hands it to another worker (the step
    # runs again there; every write is conditional, so what the dead worker did is not redone).
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    # One task at a time per worker process: a long segment never holds a second one hostage.
    "worker_prefetch_multiplier": 1,
    # Broker unreachable: give up after a few quick retries instead of hanging the run.
    "broker_connection_timeout": 10,
    "broker_transport_options": {"max_retries": 3, "interval_start": 0, "interval_step": 0.5, "interval_max": 2},
}
"""Celery settings shared by the executor (run side) and the workers (``infra/cluster.py`` writes
them into the workers' config file), so both sides agree."""

FAN_OUT_DEPLOYMENTS = ("cluster",)


def celery_executor_config(broker: Any = None) -> dict[str, Any]:
    """The celery executor's config: the broker (default: the ``CELERY_BROKER_URL`` variable), the
    rpc result backend and :data:`CELERY_SETTINGS`. Also what the workers' config file holds."""
    return {
        "broker": broker if broker is not None else {"env": CELERY_BROKER_ENV},
        "backend": CELERY_BACKEND,
        "config_source": CELERY_SETTINGS,
    }


def fan_out_executor(deployment: str) -> dg.ExecutorDefinition | None:
    """The executor of the jobs that fan out, or None where each keeps its own choice.

    Under ``cluster``: dagster-celery's executor (imported only then), on the broker named by
    ``CELERY_BROKER_URL``; every step is a Celery task that any worker of the cluster may take. A
    broker or instance database lost while a run is going fails it with one line
    (``resources.cluster``)."""
    if deployment not in FAN_OUT_DEPLOYMENTS:
        return None
    from resources.cluster import celery_executor

    return celery_executor().configured(celery_executor_config(), name="celery")


__all__ = [
    "CELERY_BROKER_ENV",
    "CELERY_SETTINGS",
    "COUNT_TAG_PREFIX",
    "ACTIVE_STATUSES",
    "DEFAULT_OP_POLICY",
    "active_run",
    "exclusive_schedule",
    "fan_out_executor",
    "still_going",
    "aws_errors",
    "config_schema",
    "flat_config",
    "metadata_from",
    "operations_summary_asset",
    "params_from_config",
    "retry_requested",
    "rounded",
    "run_summary",
    "table_from",
]
