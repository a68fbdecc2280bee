"""What the demo shares across capabilities. No Dagster.

Each capability's demo traffic is a module of this package (``infra/demo/<capability>.py``); the
``demo_traffic`` job (``infra/demo/defs.py``) runs them in turn with one step's random
generator and moment (:func:`demo_step`): one generator for all, so the same seed makes the same
traffic. They draw ids from it (:func:`demo_uuid`), write their fixed demo items once
(:func:`put_once`) and declare how much a step makes with :func:`step_count`.

The demo makes some checks fail on purpose, so that each capability has something to show: an
instance tagged with a pool that no longer exists, idle runners kept warm, malformed termination
messages (dead-lettered), progressor workers that crash (zombies, overdue timers, errored
processes). A check that fails that way says so (``infra/demo/definitions.py`` passes the notes to
the product's definitions): its description ends with :data:`SEEDED` and what the demo did, and
its metadata has a ``demo`` entry with the same words (the alerts it opens carry the description).
"""

from __future__ import annotations

import datetime as dt
import random
import uuid
from typing import Any

from botocore.exceptions import ClientError

from pipelines.common import to_item
from pipelines.common.aws_batches import error_code
from pipelines.common.params import param

SEEDED = "the demo seeds this on purpose"


def demo_step(seed: int | None, now: dt.datetime | None = None) -> tuple[random.Random, dt.datetime]:
    """One step's random generator (repeatable with ``seed``; None: different every step) and its
    moment (``now``, or the current time in UTC)."""
    return random.Random(seed), now or dt.datetime.now(dt.UTC)


def demo_uuid(rng: random.Random) -> str:
    """A UUID drawn from ``rng`` (the same seed, the same ids)."""
    return str(uuid.UUID(int=rng.getrandbits(128)))


def step_count(default: int, description: str, maximum: int = 100) -> Any:
    """A run config parameter counting what one step makes: ``default``, from 0 to ``maximum``."""
    return param(default, description=description, minimum=0, maximum=maximum)


def put_once(dynamodb, table: str, item: dict[str, Any], key: str) -> bool:
    """Write ``item`` unless an item with its ``key`` exists (the demo's pools, receivers): True
    when written, False when it was there already."""
    try:
        dynamodb.put_item(TableName=table, Item=to_item(item), ConditionExpression=f"attribute_not_exists({key})")
        return True
    except ClientError as exc:
        if error_code(exc) != "ConditionalCheckFailedException":
            raise
        return False
