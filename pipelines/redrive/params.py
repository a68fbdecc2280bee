"""The run config of ``redrive_failed_partitions``, declared once (no Dagster)."""

from dataclasses import dataclass

from pipelines.common.params import ParamsError, param


@dataclass(frozen=True)
class RedriveParams:
    """Which partitions of which asset to relaunch. Every key is optional."""

    asset: str = param(
        "receiver_batches",
        description="The partitioned asset whose partitions to relaunch, as its key path joined by '/'.",
    )
    since_hours: int = param(
        24,
        description=(
            "The window: a partition counts as failed if its latest run failed within this many hours; "
            "a missing time partition counts if its time window overlaps them."
        ),
        minimum=1,
        maximum=24 * 31,
    )
    include_missing: bool = param(
        False, description="Also launch partitions in the window that were never materialized (after the failed ones)."
    )
    max_runs: int = param(
        20,
        description="The most partitions to launch (one run each); the rest are reported as skipped.",
        minimum=1,
        maximum=500,
    )
    dry_run: bool = param(False, description="Report what would be launched; launch nothing.")

    def __post_init__(self) -> None:
        if not self.asset.strip("/"):
            raise ParamsError("asset must name an asset key, e.g. receiver_batches")
