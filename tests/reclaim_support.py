"""Shared helpers of the reclaim tests: seeded AgendaProgress tables, a KMS-encrypted password."""

from __future__ import annotations

import time
from typing import Any

import boto3

from infra.agenda_endpoint import encrypt_password
from pipelines.common import from_item, to_item

DAY_MS = 86_400_000
PROGRESS_TABLE = "POP-ProgressAgenda-dev"  # the deployed table (Env=dev), named by POP's sample


def agenda(item_id: str, state: str, age_ms: int, *, now: int, message: str | None = None, **extra) -> dict:
    return {
        "id": item_id,
        "updatedTime": now - age_ms,
        "addedTime": now - age_ms - 1000,
        "processingState": state,
        "processingStateMessage": message,
        "attemptsCompleted": 0,
        "agendaId": f"agenda-{item_id}",
        "customerId": "cust-1",
        "agendaInsight": '{"resourcePoolId": "pool-1", "insightId": "insight-7"}',
        "diagnosticEvents": "[]",
        **extra,
    }


def seed_mixed(ddb, table: str = PROGRESS_TABLE, age_ms: int = 4 * DAY_MS) -> dict[str, list[str]]:
    """Stale EXECUTING items plus fresh EXECUTING, stale WAITING and stale COMPLETE ones."""
    now = int(time.time() * 1000)
    groups = {
        "stale": [agenda(f"stale-{n}", "EXECUTING", age_ms + n * 1000, now=now) for n in range(7)],
        "fresh": [agenda(f"fresh-{n}", "EXECUTING", 60_000, now=now) for n in range(3)],
        "waiting": [agenda(f"waiting-{n}", "WAITING", age_ms * 2, now=now, message="pending") for n in range(3)],
        "complete": [agenda(f"done-{n}", "COMPLETE", age_ms * 2, now=now, message="succeeded") for n in range(3)],
    }
    for items in groups.values():
        for item in items:
            ddb.put_item(TableName=table, Item=to_item(item))
    return {name: [i["id"] for i in items] for name, items in groups.items()}


def items_by_id(ddb, table: str = PROGRESS_TABLE) -> dict[str, dict]:
    out, kwargs = {}, {"TableName": table, "ConsistentRead": True}
    while True:
        page = ddb.scan(**kwargs)
        out.update({i["id"]["S"]: from_item(i) for i in page["Items"]})
        if "LastEvaluatedKey" not in page:
            return out
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def create_plain_table(ddb, name: str) -> None:
    """An AgendaProgress table without the GSI (the scan path), as a user's own table may be."""
    ddb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


def plain_table_with_stale(ddb, name: str, count: int, prefix: str, age_ms: int = DAY_MS) -> list[str]:
    """A table without the GSI holding ``count`` EXECUTING items of age ``age_ms``; their ids."""
    create_plain_table(ddb, name)
    now = int(time.time() * 1000)
    ids = [f"{prefix}{n:03d}" for n in range(count)]
    for item_id in ids:
        ddb.put_item(TableName=name, Item=to_item(agenda(item_id, "EXECUTING", age_ms, now=now)))
    return ids


def heartbeat(ddb, item_id: str, table: str = PROGRESS_TABLE) -> bool:
    """What a live executor does: touch its progress, only while it is still EXECUTING."""
    try:
        ddb.update_item(
            TableName=table,
            Key={"id": {"S": item_id}},
            UpdateExpression="SET updatedTime = :now, heartbeat = :yes",
            ConditionExpression="processingState = :executing",
            ExpressionAttributeValues={
                ":now": {"N": str(int(time.time() * 1000))},
                ":yes": {"BOOL": True},
                ":executing": {"S": "EXECUTING"},
            },
        )
        return True
    except ddb.exceptions.ConditionalCheckFailedException:
        return False  # the reclaim failed it first: the executor sees the timeout and stops


def race_reclaims_and_an_executor(client_for, table: str, stale: list[str], run) -> None:
    """Two reclaims (``run(client)`` returns its Counts) and an executor heartbeating every third
    stale item, on threads at once; then every item was failed exactly once or kept by the executor."""
    import json
    import threading

    results, beats = [], []

    def reclaim():
        results.append(run(client_for()))

    def executor():
        own = client_for()
        for item_id in stale[::3]:
            if heartbeat(own, item_id, table):
                beats.append(item_id)

    threads = [threading.Thread(target=f) for f in (reclaim, reclaim, executor)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    items = items_by_id(client_for(), table)
    failed = {k for k, v in items.items() if v["processingState"] == "COMPLETE"}
    # every failure was counted exactly once across both runs; every other match lost a race
    assert sum(r.reclaimed for r in results) == len(failed)
    assert [r.reclaimed + r.raced for r in results] == [r.matched for r in results]
    assert [r.errors for r in results] == [0, 0]
    assert len(failed) + len(beats) == len(stale)
    for item_id, item in items.items():
        if item_id in failed:
            assert len(json.loads(item["diagnosticEvents"])) == 1
            assert item["attemptsCompleted"] == 1
            assert item_id not in beats  # never failed after a heartbeat won
        else:
            assert item_id in beats
            assert item["heartbeat"] is True  # only a live executor keeps it


def encrypted_password(kms, password: str) -> str:
    """IDM_ENCRYPTED_PASS: base64 of the KMS ciphertext of ``password``."""
    return encrypt_password(kms, password)


def client(endpoint: str, service: str):
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1")


class MemoryCursor:
    """A reclaim scan cursor kept in memory; the Dagster layer keeps it in the instance."""

    def __init__(self, key: dict[str, Any] | None = None) -> None:
        self.key = key

    def load(self) -> dict[str, Any] | None:
        return self.key

    def save(self, key: dict[str, Any] | None) -> None:
        self.key = key


def reexecute_reclaim(instance, parent_run_id: str):
    """All the steps of a ``reclaim_agendas`` run again, as the UI's re-execution: with its parent's run config
    and tags (Dagster's run retries copy them too)."""
    import dagster as dg

    parent = instance.get_run_by_id(parent_run_id)
    tags = {key: value for key, value in parent.tags.items() if not key.startswith("dagster/")}
    return dg.execute_job(
        dg.build_reconstructable_job("tests.test_reclaim", "_job"),
        instance,
        run_config=parent.run_config,
        tags=tags,
        reexecution_options=dg.ReexecutionOptions(parent_run_id=parent_run_id),
    )
