"""The run config of ``receiver_batches``, declared once (no Dagster): the Dagster schema, the
Launchpad's descriptions and the README table all come from :class:`ReceiverBatchesParams`."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pipelines.batching.batcher import BatchSettings
from pipelines.common.params import param

MAX_LOOKBACK_DAYS = 366  # the day partitions span about a year (see BATCH_PARTITIONS_START_DATE)
MAX_LEASE_WAIT_SECONDS = 3600


@dataclass(frozen=True)
class ReceiverBatchesParams:
    """How one (receiver, day) run behaves. Every key is optional."""

    dry_run: bool = param(False, description="Report what would be written; take no lease, lock and write nothing.")
    lookback_days: int = param(
        7,
        description=(
            "How many days back a batch time with no ledger entry still counts as missed, so that later "
            "batches leave its records for a backfill (0: nothing counts as missed)."
        ),
        minimum=0,
        maximum=MAX_LOOKBACK_DAYS,
    )
    lease_wait_seconds: int = param(
        120,
        description="How long a run waits for another run of the same receiver to finish before it fails.",
        minimum=0,
        maximum=MAX_LEASE_WAIT_SECONDS,
    )

    def settings(self, *, receivers_table: str, records_table: str, outbox_bucket: str) -> BatchSettings:
        """The batcher's settings for these parameters and the deployed names."""
        return BatchSettings(
            receivers_table=receivers_table,
            records_table=records_table,
            outbox_bucket=outbox_bucket,
            lookback=dt.timedelta(days=self.lookback_days),
            lease_wait_seconds=self.lease_wait_seconds,
        )
