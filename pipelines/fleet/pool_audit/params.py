"""The pool audit's parameters (``pipelines.common.params``): a housekeeping message's and the two
assets' config. No Dagster imports."""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.common.params import param


@dataclass(frozen=True)
class AuditMessageParams:
    idle_cost_threshold_usd_per_hour: float = param(
        5.0,
        description="The idle_cost_below_threshold check warns when the fleet's idle capacity costs more "
        "than this, in USD per hour.",
        minimum=0,
        maximum=100_000,
    )


@dataclass(frozen=True)
class PoolAuditParams(AuditMessageParams):
    dry_run: bool = param(False, description="Compute and report, but publish no metrics and store no snapshot.")


@dataclass(frozen=True)
class PoolCostReportParams:
    max_gap_minutes: int = param(
        30,
        description="A snapshot stands for the time until the next one, but for at most this many minutes.",
        minimum=1,
        maximum=24 * 60,
    )
