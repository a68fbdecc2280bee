"""One settings resource per capability (``dg.EnvVar``: a missing variable fails the run in one line)."""

import os

import dagster as dg

# No public API shows a code location's load error without a stack (LoadSettingError says how this does).
from dagster._core.errors import DagsterUserCodeProcessError
from dagster_shared.error import SerializableErrorInfo
from pydantic import Field

from pipelines.common.env import ALERT_ENV, SettingsError, batch_partitions_env, checked, int_env


class LoadSettingError(DagsterUserCodeProcessError, SettingsError):
    """A setting without which the code location cannot load, shown as its one line: Dagster shows a
    ``DagsterUserCodeProcessError``'s one error info (here with no stack) instead of its own."""

    def __init__(self, line: str) -> None:
        info = SerializableErrorInfo(message=line, stack=[], cls_name=type(self).__name__)
        super().__init__(line, user_code_process_error_infos=[info])


class CheckedSettings(dg.ConfigurableResource):
    """``invalid``: the lines of values checked at load that were not valid; using the resource fails with them."""

    invalid: str = ""

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        if self.invalid:
            raise SettingsError(self.invalid)


class FleetSettings(CheckedSettings):
    """runs-fleet: its queues, tables, archive bucket and metric namespace (`RUNS_FLEET_*`)."""

    jobs_table: str
    pools_table: str
    termination_queue_url: str
    termination_dlq_url: str
    housekeeping_queue_url: str
    housekeeping_dlq_url: str
    archive_bucket: str
    metrics_namespace: str = "RunsFleet"
    # How many drain runs of each queue the queue sensors keep going at once (competing consumers;
    # RUNS_FLEET_TERMINATION_DRAIN_RUNS, RUNS_FLEET_HOUSEKEEPING_DRAIN_RUNS), from 1 to MAX_DRAIN_RUNS.
    termination_drain_runs: int = 1
    housekeeping_drain_runs: int = 1


MAX_DRAIN_RUNS = 8


class AgendaSettings(dg.ConfigurableResource):
    """POP's agenda reclaimer: its tables, the optional AgendaProgress endpoint and its identity login."""

    progress_table: str
    ready_table: str
    progress_url: str | None = None  # AGENDA_PROGRESS_URL: when set, reclaim writes through the endpoint
    progress_allowed_urls: str | None = None  # AGENDA_PROGRESS_ALLOWED_URLS: prefixes a run config may name
    identity_url: str | None = None  # IDENTITY_URL
    idm_user: str | None = None  # IDM_USER
    idm_encrypted_pass: str | None = None  # IDM_ENCRYPTED_PASS: base64 of a KMS ciphertext
    metrics_namespace: str = "RunsFleet"  # RUNS_FLEET_METRICS_NAMESPACE


class BatchingSettings(CheckedSettings):
    """ReportStream batching: the receivers and records tables and the outbox bucket."""

    receivers_table: str = Field(description="The receivers table (RECEIVERS_TABLE): one item per receiver.")
    records_table: str = Field(
        description="The records table (BATCH_RECORDS_TABLE) with its sparse pending-index of records to batch."
    )
    outbox_bucket: str = Field(
        description="The outbox bucket (BATCH_OUTBOX_BUCKET): batch files under batches/, the ledger under ledger/."
    )
    settings_dir: str | None = Field(
        default=None,
        description="The local folder whose ReportStream settings import_receiver_settings may read "
        "(RECEIVER_SETTINGS_DIR; unset: s3:// URLs only).",
    )


class AlertSettings(dg.ConfigurableResource):
    """Alerting's sinks and limits, checked at each tick of the alert sensor (unset: the default)."""

    sns_topic_arn: str | None = None  # ALERTS_SNS_TOPIC_ARN: the template's AlertsTopicArn
    webhook_url: str | None = None  # ALERTS_WEBHOOK_URL: a secret (the UI shows its name only)
    remind_hours: str | None = None  # ALERTS_REMIND_HOURS: remind of an open incident this often
    max_per_tick: str | None = None  # ALERTS_MAX_PER_TICK: messages per sink and tick (default 20)
    tick_failures: str | None = None  # ALERTS_TICK_FAILURES: failed ticks in a row that page (default 3)
    retry_policy: str | None = None  # ALERTS_RETRY_POLICY: how a sink that is down is tried again
    muted_warn_checks: str | None = None  # ALERTS_MUTED_WARN_CHECKS: "asset/key:check" WARN checks that never page
    ui_url: str | None = None  # DAGSTER_UI_URL: links to run and asset pages
    runbook_base_url: str | None = None  # ALERTS_RUNBOOK_BASE_URL: where docs/runbooks is served
    heartbeat_env: str | None = None  # ALERTS_HEARTBEAT_ENV: the template's Env, the heartbeat's dimension


def alert_settings_from_env() -> AlertSettings:
    return AlertSettings(**{name: _optional_env(env) for name, env in ALERT_ENV.items()})


def fleet_settings_from_env() -> FleetSettings:
    problems: list[str] = []
    drain_runs = {
        name: checked(problems, int_env, f"RUNS_FLEET_{name.upper()}", 1, minimum=1, maximum=MAX_DRAIN_RUNS)
        for name in ("termination_drain_runs", "housekeeping_drain_runs")
    }
    return FleetSettings(
        jobs_table=dg.EnvVar("RUNS_FLEET_JOBS_TABLE"),
        pools_table=dg.EnvVar("RUNS_FLEET_POOLS_TABLE"),
        termination_queue_url=dg.EnvVar("RUNS_FLEET_TERMINATION_QUEUE_URL"),
        termination_dlq_url=dg.EnvVar("RUNS_FLEET_TERMINATION_DLQ_URL"),
        housekeeping_queue_url=dg.EnvVar("RUNS_FLEET_HOUSEKEEPING_QUEUE_URL"),
        housekeeping_dlq_url=dg.EnvVar("RUNS_FLEET_HOUSEKEEPING_DLQ_URL"),
        archive_bucket=dg.EnvVar("RUNS_FLEET_ARCHIVE_BUCKET"),
        metrics_namespace=os.environ.get("RUNS_FLEET_METRICS_NAMESPACE") or "RunsFleet",
        invalid="; ".join(problems),
        **drain_runs,
    )


def _optional_env(name: str) -> dg.EnvVar | None:
    """An optional variable: read at run time when it is set (the UI shows its name, not its value)."""
    return dg.EnvVar(name) if os.environ.get(name) else None


def agenda_settings_from_env() -> AgendaSettings:
    return AgendaSettings(
        progress_table=dg.EnvVar("AGENDA_PROGRESS_TABLE"),
        ready_table=dg.EnvVar("AGENDA_READY_TABLE"),
        progress_url=_optional_env("AGENDA_PROGRESS_URL"),
        progress_allowed_urls=_optional_env("AGENDA_PROGRESS_ALLOWED_URLS"),
        identity_url=_optional_env("IDENTITY_URL"),
        idm_user=_optional_env("IDM_USER"),
        idm_encrypted_pass=_optional_env("IDM_ENCRYPTED_PASS"),
        metrics_namespace=os.environ.get("RUNS_FLEET_METRICS_NAMESPACE") or "RunsFleet",
    )


def batching_settings_from_env() -> BatchingSettings:
    problems: list[str] = []
    batch_partitions_env(problems)
    return BatchingSettings(
        receivers_table=dg.EnvVar("RECEIVERS_TABLE"),
        records_table=dg.EnvVar("BATCH_RECORDS_TABLE"),
        outbox_bucket=dg.EnvVar("BATCH_OUTBOX_BUCKET"),
        settings_dir=_optional_env("RECEIVER_SETTINGS_DIR"),
        invalid="; ".join(problems),
    )
