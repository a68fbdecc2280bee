"""What the fleet processors and housekeeping tasks work with: :class:`FleetContext`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class FleetContext:
    """The clients and names the fleet processors and tasks work with, and where they log."""

    ssm: Any
    dynamodb: Any
    cloudwatch: Any
    s3: Any
    jobs_table: str
    archive_bucket: str
    namespace: str
    log: Any
    ec2: Any = None  # only the housekeeping tasks need EC2
    pools_table: str = ""  # only the pool_audit task reads the pools table


def fleet_context(
    fleet: Any,
    *,
    log: Any,
    ec2: Any = None,
    ssm: Any = None,
    dynamodb: Any = None,
    cloudwatch: Any = None,
    s3: Any = None,
) -> FleetContext:
    """The one way to build a :class:`FleetContext`: the names from the fleet settings (``fleet``:
    ``FleetSettings``, or anything with its ``jobs_table``, ``archive_bucket``, ``metrics_namespace``
    and ``pools_table``), and the clients the caller has (a schedule's look builds only those it reads;
    a run gives metrics after a commit as its ``cloudwatch``)."""
    return FleetContext(
        ec2=ec2,
        ssm=ssm,
        dynamodb=dynamodb,
        cloudwatch=cloudwatch,
        s3=s3,
        jobs_table=fleet.jobs_table,
        archive_bucket=fleet.archive_bucket,
        namespace=fleet.metrics_namespace,
        log=log,
        pools_table=fleet.pools_table,
    )
