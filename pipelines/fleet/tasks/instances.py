"""The EC2 instances the clean-up tasks read: ``DescribeInstances``, every page. No Dagster."""

from __future__ import annotations

from typing import Any


def described_instances(ec2, *filters: dict[str, Any]) -> list[dict[str, Any]]:
    """Every instance ``DescribeInstances`` finds with ``filters``, over all its pages."""
    pages = ec2.get_paginator("describe_instances").paginate(Filters=list(filters))
    return [inst for page in pages for reservation in page["Reservations"] for inst in reservation["Instances"]]


def instance_tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
