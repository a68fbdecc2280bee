"""Reclaim's demo traffic for the local deployment: agendas that move, and a few that get stuck. No Dagster.

Each step adds WAITING agendas, moves WAITING -> EXECUTING and fresh EXECUTING -> COMPLETE, and
leaves a few agendas stuck in EXECUTING (10 to 180 minutes old) for the reclaim job. The local
deployment's ``demo_traffic`` job (``infra/demo/defs.py``) runs it with the other capabilities' traffic.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from infra.demo.common import demo_uuid, step_count
from pipelines.common import now_ms, to_item
from pipelines.common.aws_batches import error_code


@dataclass(frozen=True)
class AgendaTraffic:
    """How many agendas one step adds (keys of the ``demo_traffic`` job's run config)."""

    new_agendas: int = step_count(10, "New WAITING agendas added to the AgendaProgress table.", maximum=1000)
    stuck_agendas: int = step_count(
        1, "Agendas added stuck in EXECUTING (10 to 180 minutes old), for the reclaim job.", maximum=1000
    )


def agenda_traffic(
    dynamodb, table: str, traffic: AgendaTraffic, rng: random.Random, now: dt.datetime
) -> dict[str, int]:
    """New WAITING agendas; WAITING -> EXECUTING; fresh EXECUTING -> COMPLETE; a few stuck ones."""
    t = now_ms(now)
    counts = {"agendas_added": 0, "agendas_started": 0, "agendas_completed": 0, "agendas_stuck": 0}
    customer = f"cust-{rng.randint(1, 5)}"
    for _ in range(traffic.new_agendas):
        dynamodb.put_item(TableName=table, Item=to_item(_agenda(rng, t, "WAITING", "pending", customer)))
        counts["agendas_added"] += 1
    for _ in range(traffic.stuck_agendas):
        stale = t - rng.randint(10, 180) * 60_000
        dynamodb.put_item(TableName=table, Item=to_item(_agenda(rng, stale, "EXECUTING", None, customer)))
        counts["agendas_stuck"] += 1

    index = "processingState-updatedTime-index"
    # Fresh EXECUTING work completes (stuck items are older than two minutes and stay stuck).
    fresh = dynamodb.query(
        TableName=table,
        IndexName=index,
        Limit=max(1, traffic.new_agendas),  # DynamoDB refuses Limit=0
        KeyConditionExpression="processingState = :s AND updatedTime > :t",
        ExpressionAttributeValues={":s": {"S": "EXECUTING"}, ":t": {"N": str(t - 120_000)}},
    )["Items"]
    for item in fresh:
        if _transition(
            dynamodb,
            table,
            item["id"]["S"],
            "EXECUTING",
            "COMPLETE",
            "succeeded",
            t,
            extra="completedTime = :now, attemptsCompleted = if_not_exists(attemptsCompleted, :zero) + :one",
        ):
            counts["agendas_completed"] += 1
    waiting = dynamodb.query(
        TableName=table,
        IndexName=index,
        Limit=max(1, traffic.new_agendas),  # DynamoDB refuses Limit=0
        KeyConditionExpression="processingState = :s",
        ExpressionAttributeValues={":s": {"S": "WAITING"}},
    )["Items"]
    for item in waiting:
        if _transition(dynamodb, table, item["id"]["S"], "WAITING", "EXECUTING", None, t, extra="startedTime = :now"):
            counts["agendas_started"] += 1
    return counts


def _agenda(rng: random.Random, t: int, state: str, message: str | None, customer: str) -> dict[str, Any]:
    agenda_id = demo_uuid(rng)
    return {
        "id": agenda_id,
        "updatedTime": t,
        "addedTime": t,
        "startedTime": t if state == "EXECUTING" else None,
        "processingState": state,
        "processingStateMessage": message,
        "attemptsCompleted": 0,
        "maximumAttempts": 3,
        "agendaId": f"agenda-{rng.randint(1, 50)}",
        "customerId": customer,
        "cid": customer,
        "linkId": f"link-{rng.randint(1, 1000)}",
        "agendaInsight": json.dumps({"resourcePoolId": "pool-1", "insightId": f"insight-{rng.randint(1, 9)}"}),
        "diagnosticEvents": "[]",
        "params": "{}",
    }


def _transition(dynamodb, table, item_id, from_state, to_state, message, t, extra="") -> bool:
    names = {"#s": "processingState", "#m": "processingStateMessage"}
    values = {":from": {"S": from_state}, ":to": {"S": to_state}, ":now": {"N": str(t)}}
    if "attemptsCompleted" in extra:
        values.update({":zero": {"N": "0"}, ":one": {"N": "1"}})
    sets = ["#s = :to", "updatedTime = :now"] + ([extra] if extra else [])
    if message:
        sets.append("#m = :m")
        values[":m"] = {"S": message}
    update = "SET " + ", ".join(sets) + ("" if message else " REMOVE #m")
    try:
        dynamodb.update_item(
            TableName=table,
            Key={"id": {"S": item_id}},
            UpdateExpression=update,
            ConditionExpression="#s = :from",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )
        return True
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            return False  # someone else moved it already
        raise
