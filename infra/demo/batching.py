"""Batching's demo traffic for the local deployment: demo receivers and their pending records. No Dagster.

Each step creates the demo receivers (once) and adds pending records for them, now and then one
whose payload is not JSON. The local deployment's ``demo_traffic`` job (``infra/demo/defs.py``) runs
it with the other capabilities' traffic.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from dataclasses import dataclass

from infra.demo.common import demo_uuid, put_once, step_count
from infra.seed import batch_write
from pipelines.common import iso, to_item

DEMO_RECEIVERS = [
    {
        "receiver": "acme-hourly",
        "number_per_day": 24,
        "initial_time": "00:00",
        "time_zone": "UTC",
        "max_batch_size": 50,
        "send_if_empty_batch": False,
        "batching_enabled": True,
    },
    {
        "receiver": "globex-15min",
        "number_per_day": 96,
        "initial_time": "00:05",
        "time_zone": "America/New_York",
        "max_batch_size": 20,
        "send_if_empty_batch": True,
        "batching_enabled": True,
    },
    {
        "receiver": "initech-daily",
        "number_per_day": 1,
        "initial_time": "06:00",
        "time_zone": "Europe/Berlin",
        "max_batch_size": 500,
        "send_if_empty_batch": False,
        "batching_enabled": True,
    },
]


@dataclass(frozen=True)
class RecordTraffic:
    """How many records one step adds (a key of the ``demo_traffic`` job's run config)."""

    records: int = step_count(40, "Pending records added for the demo receivers.", maximum=10_000)


def receiver_traffic(
    dynamodb, *, receivers_table: str, records_table: str, traffic: RecordTraffic, rng: random.Random, now: dt.datetime
) -> dict[str, int]:
    """Demo receivers (created once) and new pending records for them."""
    receivers = sum(put_once(dynamodb, receivers_table, receiver, "receiver") for receiver in DEMO_RECEIVERS)
    items = []
    for n in range(traffic.records):
        receiver = rng.choice(DEMO_RECEIVERS)["receiver"]
        created = now - dt.timedelta(milliseconds=rng.randint(0, 60_000))
        items.append(
            {
                "record_id": demo_uuid(rng),
                "receiver": receiver,
                "created_at": iso(created),
                # Now and then a producer sends a payload that is not JSON: batching keeps it, flagged.
                "payload": json.dumps({"seq": n, "value": rng.randint(0, 10_000)}) if n % 25 else f"seq={n};raw",
                "next_action": "BATCH",
                "pending_receiver": receiver,
            }
        )
    batch_write(dynamodb, records_table, [{"PutRequest": {"Item": to_item(i)}} for i in items])
    return {"receivers_created": receivers, "records_added": len(items)}
