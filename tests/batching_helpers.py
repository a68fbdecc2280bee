"""Shared helpers for the batching tests: receivers, records and reading the outbox back."""

from __future__ import annotations

import datetime as dt
import json

from pipelines.batching.batcher import BatchSettings, ReceiverBatcher
from pipelines.common import iso, to_item


def receiver(name: str, **overrides) -> dict:
    base = {
        "receiver": name,
        "number_per_day": 24,
        "initial_time": "00:00",
        "time_zone": "UTC",
        "max_batch_size": 10,
        "send_if_empty_batch": False,
        "batching_enabled": True,
    }
    base.update(overrides)
    return base


def put_receiver(aws, name: str, **overrides) -> dict:
    item = receiver(name, **overrides)
    aws.client("dynamodb").put_item(TableName=aws.env["RECEIVERS_TABLE"], Item=to_item(item))
    return item


def set_enabled(aws, name: str, enabled: bool) -> None:
    aws.client("dynamodb").update_item(
        TableName=aws.env["RECEIVERS_TABLE"],
        Key={"receiver": {"S": name}},
        UpdateExpression="SET batching_enabled = :e",
        ExpressionAttributeValues={":e": {"BOOL": enabled}},
    )


def record(name: str, record_id: str, created: dt.datetime, payload=None) -> dict:
    return {
        "record_id": record_id,
        "receiver": name,
        "created_at": iso(created),
        "payload": payload if payload is not None else json.dumps({"id": record_id}),
        "next_action": "BATCH",
        "pending_receiver": name,
    }


def put_items(aws, items: list[dict]) -> None:
    ddb = aws.client("dynamodb")
    table = aws.env["BATCH_RECORDS_TABLE"]
    for start in range(0, len(items), 25):
        request = {table: [{"PutRequest": {"Item": to_item(i)}} for i in items[start : start + 25]]}
        while request:
            request = ddb.batch_write_item(RequestItems=request).get("UnprocessedItems") or None


def put_records(aws, name: str, created: list[dt.datetime], prefix: str | None = None) -> list[str]:
    prefix = prefix or name
    items = [record(name, f"{prefix}-{i:05d}", c) for i, c in enumerate(created)]
    put_items(aws, items)
    return [i["record_id"] for i in items]


def settings(aws, **overrides) -> BatchSettings:
    return BatchSettings(
        receivers_table=aws.env["RECEIVERS_TABLE"],
        records_table=aws.env["BATCH_RECORDS_TABLE"],
        outbox_bucket=aws.env["BATCH_OUTBOX_BUCKET"],
        **overrides,
    )


def batcher(aws, s3=None, dynamodb=None, **overrides) -> ReceiverBatcher:
    return ReceiverBatcher(dynamodb or aws.client("dynamodb"), s3 or aws.client("s3"), settings(aws, **overrides))


def outbox(aws, name: str) -> dict[str, list[dict]]:
    """key -> parsed lines, for every batch file of ``name``."""
    s3 = aws.client("s3")
    bucket = aws.env["BATCH_OUTBOX_BUCKET"]
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"batches/{name}/"):
        for obj in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read().decode()
            out[obj["Key"]] = [json.loads(line) for line in body.splitlines() if line]
    return out


def pending_ids(aws, name: str) -> set[str]:
    ddb = aws.client("dynamodb")
    items = ddb.query(
        TableName=aws.env["BATCH_RECORDS_TABLE"],
        IndexName="pending-index",
        KeyConditionExpression="pending_receiver = :r",
        ExpressionAttributeValues={":r": {"S": name}},
    )["Items"]
    return {i["record_id"]["S"] for i in items}


def get_record(aws, record_id: str) -> dict:
    item = aws.client("dynamodb").get_item(
        TableName=aws.env["BATCH_RECORDS_TABLE"], Key={"record_id": {"S": record_id}}
    )["Item"]
    return {k: next(iter(v.values())) for k, v in item.items()}


def decider_tick(context):
    """One tick of the ``batch_decider`` schedule: its run request, or its skip reason."""
    import dagster as dg

    from pipelines.batching.defs import batch_decider

    data = batch_decider.evaluate_tick(context)
    if data.skip_message is not None:
        return dg.SkipReason(data.skip_message)
    [request] = data.run_requests
    return request
