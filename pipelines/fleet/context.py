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
