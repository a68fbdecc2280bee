"""The pool audit's parameters, declared once (``pipelines.common.params``). No Dagster imports.

- :class:`AuditMessageParams`: the audit's own parameter, in a housekeeping ``pool_audit`` message
  (besides runs-fleet's common ``now`` and ``dryRun``) and in the ``pool_audit`` asset's config;
- :class:`PoolAuditParams`: the ``pool_audit`` asset's config (that parameter and ``dry_run``);
- :class:`PoolCostReportParams`: the ``pool_cost_report`` asset's config.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.common.params import param

DEFAULT_IDLE_COST_THRESHOLD = 5.0  # USD per hour of idle capacity across the fleet before the check warns


@dataclass(frozen=True)
class AuditMessageParams:
    idle_cost_threshold_usd_per_hour: float = param(
        DEFAULT_IDLE_COST_THRESHOLD,
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
