"""What the fleet processors and housekeeping tasks work with."""

from dataclasses import dataclass
from typing import Any


@dataclass
class FleetContext:
    """A client the caller does not need is None (a schedule's look builds only those it reads with)."""

    jobs_table: str
    archive_bucket: str
    namespace: str
    log: Any
    ssm: Any = None
    dynamodb: Any = None
    cloudwatch: Any = None
    s3: Any = None
    ec2: Any = None  # only the housekeeping tasks need EC2
    pools_table: str = ""  # only the pool_audit task reads the pools table


def fleet_context(fleet: Any, *, log: Any, **clients: Any) -> FleetContext:
    """The one way to build a :class:`FleetContext`: the names from ``FleetSettings``, the caller's clients."""
    return FleetContext(
        jobs_table=fleet.jobs_table,
        archive_bucket=fleet.archive_bucket,
        namespace=fleet.metrics_namespace,
        log=log,
        pools_table=fleet.pools_table,
        **clients,
    )
