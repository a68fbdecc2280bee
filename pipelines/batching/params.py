"""Batching's run configs, declared once (no Dagster)."""

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from pipelines.batching.batcher import BatchSettings
from pipelines.common.env import MAX_LOOKBACK_DAYS, batch_partitions_env
from pipelines.common.params import ParamsError, param

BATCH_DRY_RUN = (
    "Report what would be written, as an observation of each partition (its status stays as it was); "
    "take no lease, lock and write nothing."
)


def batch_start_date(env: Mapping[str, str], today: dt.date) -> str:
    """The first day of the ``day`` partitions, ``YYYY-MM-DD`` (docs/batching.md#partitions). An invalid
    variable counts as unset here, so that the code location loads; the ``batching`` resource fails its
    runs and sensors with its line (``resources.settings``)."""
    fixed, lookback_days = batch_partitions_env([], env)
    if fixed is not None:
        return fixed.isoformat()
    return (today - dt.timedelta(days=lookback_days)).replace(day=1).isoformat()


@dataclass(frozen=True)
class ReceiverBatchesParams:
    dry_run: bool = param(False, description=BATCH_DRY_RUN)
    lookback_days: int = param(
        7,
        description=(
            "How many days back a batch time with no ledger entry still counts as missed: the receiver's next "
            "run writes it first, with the records created before it (0: nothing counts as missed)."
        ),
        minimum=0,
        maximum=MAX_LOOKBACK_DAYS,
    )
    lease_wait_seconds: int = param(
        120,
        description="How long a run waits for another run of the same receiver to finish before it fails.",
        minimum=0,
        maximum=3600,
    )

    def settings(self, deployed) -> BatchSettings:
        """The batcher's settings: these parameters on the ``deployed`` (``batching`` resource) tables."""
        return BatchSettings(
            receivers_table=deployed.receivers_table,
            records_table=deployed.records_table,
            outbox_bucket=deployed.outbox_bucket,
            lookback=dt.timedelta(days=self.lookback_days),
            lease_wait_seconds=self.lease_wait_seconds,
        )


@dataclass(frozen=True)
class ImportReceiverSettingsParams:
    path: str = param(
        description=(
            "ReportStream's settings: organizations.yml, or a folder of per-organization files "
            "(settings/STLTs), as an s3:// URL (a key, or a prefix ending in /) or a local path under "
            "RECEIVER_SETTINGS_DIR."
        )
    )
    dry_run: bool = param(False, description="Report what the import would add, change and disable; write nothing.")


@dataclass(frozen=True)
class BatchMinuteParams:
    """Written by ``batch_decider``; an entry that is not a partition key is one line and skipped."""

    batch_time: str = param(description="The decider minute (UTC, ISO 8601) whose due receivers this run batches.")
    partitions: list = param(
        description="The (receiver, day) partitions of receiver_batches to batch, as their partition keys "
        "(the day YYYY-MM-DD, a vertical bar, the receiver)."
    )
    dry_run: bool = param(False, description=BATCH_DRY_RUN)

    def __post_init__(self):
        try:
            dt.datetime.fromisoformat(self.batch_time)
        except ValueError:
            raise ParamsError(f"batch_time {self.batch_time!r} is not an ISO 8601 time") from None
