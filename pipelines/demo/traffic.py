"""Demo traffic for the local platform, as plain functions over boto3 clients (no Dagster).

Each ``*_traffic`` function moves one part of the platform one step forward and returns counts:

- agendas move WAITING -> EXECUTING -> COMPLETE, and a few get stuck in EXECUTING (POP's agenda reclaimer);
- pools of tagged fleet instances run jobs; finished jobs send termination messages, a few of
  them malformed, and now and then a housekeeping message arrives (runs-fleet);
- receivers' records accumulate (ReportStream's batching).

Later capabilities extend this module with what they need to show.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from pipelines.common import iso, now_ms, to_item
from pipelines.common.aws_batches import batch_write, chunks, error_code
from pipelines.common.params import param

DEMO_AMI = "ami-12c6146b"  # an image the local moto server knows; demo traffic never runs in prod
MANAGED_TAG = "runs-fleet:managed"
POOL_TAG = "runs-fleet:pool"
JOB_TAG = "groundskeeper-demo:job"

DEMO_POOLS = [
    {"pool_name": "linux-small", "instance_type": "t3.small", "desired_idle": 1, "spot": False},
    {"pool_name": "linux-large", "instance_type": "c5.xlarge", "desired_idle": 0, "spot": True},
    {"pool_name": "gpu", "instance_type": "g4dn.xlarge", "desired_idle": 0, "spot": False, "hourly_price_usd": 0.526},
]

# Pool audit demo: idle runners kept warm (linux-small wants 1 idle and gets 2), a stopped
# runner, a managed instance without a pool tag and one tagged with a pool that no longer exists.
ROLE_TAG = "groundskeeper-demo:role"
DEMO_STANDING = [
    ("idle-small-1", "linux-small", "t3.small"),
    ("idle-small-2", "linux-small", "t3.small"),
    ("idle-large", "linux-large", "c5.xlarge"),
    ("stopped-small", "linux-small", "t3.small"),
    ("untagged", None, "t3.micro"),
    ("retired-pool", "legacy-pool", "t3.micro"),
]

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

# Termination messages that a real agent could send by mistake: the processors must dead-letter them.
MALFORMED_TERMINATION_BODIES = [
    "this is not json",
    json.dumps({"job_id": "missing-the-rest"}),
    json.dumps({"instance_id": "i-0123456789abcdef0", "job_id": "j-x", "status": "exploded"}),
    json.dumps({"instance_id": "i-1234/../../other", "job_id": "j-y", "status": "success"}),
    json.dumps(["a", "list"]),
]


@dataclass(frozen=True)
class DemoConfig:
    """How much traffic one step makes: the ``demo_traffic`` job's run config, declared once. The
    defaults are what the job's schedule makes every 2 minutes under ``make dev``."""

    new_agendas: int = param(
        10, description="New WAITING agendas added to the AgendaProgress table.", minimum=0, maximum=1000
    )
    stuck_agendas: int = param(
        1,
        description="Agendas added stuck in EXECUTING (10 to 180 minutes old), for the reclaim job.",
        minimum=0,
        maximum=1000,
    )
    jobs_started: int = param(
        4,
        description="Fleet jobs started, each on a new managed instance (up to max_instances).",
        minimum=0,
        maximum=100,
    )
    jobs_finished: int = param(
        4,
        description="Running fleet jobs that finish: their instance terminates and a termination message is sent.",
        minimum=0,
        maximum=100,
    )
    malformed_messages: int = param(
        1,
        description="Malformed termination messages sent (the processors must dead-letter them).",
        minimum=0,
        maximum=100,
    )
    housekeeping_messages: int = param(
        1, description="Housekeeping messages sent, each with a random cleanup task.", minimum=0, maximum=100
    )
    records: int = param(40, description="Pending records added for the demo receivers.", minimum=0, maximum=10_000)
    max_instances: int = param(
        24,
        description="The most managed instances running jobs; beyond it, jobs finish before new ones start.",
        minimum=0,
        maximum=500,
    )
    duplicate_messages: int = param(
        1,
        description="Termination messages sent twice, as at-least-once delivery does.",
        minimum=0,
        maximum=100,
    )
    old_jobs: int = param(
        2,
        description="Finished job records completed 8+ days ago, for the old_jobs cleanup task.",
        minimum=0,
        maximum=1000,
    )
    orphan_instances: int = param(
        1,
        description="Managed instances kept running with no job, for the orphaned_instances task.",
        minimum=0,
        maximum=100,
    )
    pool_audit_messages: int = param(
        0, description="Housekeeping messages asking for the pool audit.", minimum=0, maximum=100
    )
    seed: int | None = param(
        None, description="Random seed, for repeatable traffic (tests); empty: different every step."
    )


def agenda_traffic(dynamodb, table: str, cfg: DemoConfig, rng: random.Random, now: dt.datetime) -> dict[str, int]:
    """New WAITING agendas; WAITING -> EXECUTING; fresh EXECUTING -> COMPLETE; a few stuck ones."""
    t = now_ms(now)
    counts = {"agendas_added": 0, "agendas_started": 0, "agendas_completed": 0, "agendas_stuck": 0}
    customer = f"cust-{rng.randint(1, 5)}"
    for _ in range(cfg.new_agendas):
        dynamodb.put_item(TableName=table, Item=to_item(_agenda(rng, t, "WAITING", "pending", customer)))
        counts["agendas_added"] += 1
    for _ in range(cfg.stuck_agendas):
        stale = t - rng.randint(10, 180) * 60_000
        dynamodb.put_item(TableName=table, Item=to_item(_agenda(rng, stale, "EXECUTING", None, customer)))
        counts["agendas_stuck"] += 1

    index = "processingState-updatedTime-index"
    # Fresh EXECUTING work completes (stuck items are older than two minutes and stay stuck).
    fresh = dynamodb.query(
        TableName=table,
        IndexName=index,
        Limit=max(1, cfg.new_agendas),  # DynamoDB refuses Limit=0
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
        Limit=max(1, cfg.new_agendas),  # DynamoDB refuses Limit=0
        KeyConditionExpression="processingState = :s",
        ExpressionAttributeValues={":s": {"S": "WAITING"}},
    )["Items"]
    for item in waiting:
        if _transition(dynamodb, table, item["id"]["S"], "WAITING", "EXECUTING", None, t, extra="startedTime = :now"):
            counts["agendas_started"] += 1
    return counts


def _agenda(rng: random.Random, t: int, state: str, message: str | None, customer: str) -> dict[str, Any]:
    agenda_id = str(uuid.UUID(int=rng.getrandbits(128)))
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


def fleet_traffic(
    ec2,
    ssm,
    dynamodb,
    sqs,
    *,
    jobs_table: str,
    pools_table: str,
    termination_queue_url: str,
    housekeeping_queue_url: str,
    cfg: DemoConfig,
    rng: random.Random,
    now: dt.datetime,
) -> dict[str, int]:
    """Pools, instances running jobs, termination messages (some malformed) and housekeeping messages."""
    counts = {
        "pools_created": 0,
        "jobs_started": 0,
        "jobs_finished": 0,
        "termination_messages": 0,
        "malformed_messages": 0,
        "housekeeping_messages": 0,
    }
    for pool in DEMO_POOLS:
        try:
            dynamodb.put_item(
                TableName=pools_table, Item=to_item(pool), ConditionExpression="attribute_not_exists(pool_name)"
            )
            counts["pools_created"] += 1
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise

    running = _demo_instances(ec2)
    busy = [i for i in running if JOB_TAG in i["tags"]]
    to_finish = rng.sample(busy, k=min(len(busy), cfg.jobs_finished + max(0, len(running) - cfg.max_instances)))
    messages = []
    for inst in to_finish:
        job_id = inst["tags"][JOB_TAG]
        status = rng.choices(["success", "failure", "timeout", "interrupted"], weights=[80, 12, 5, 3])[0]
        started = inst["launch_time"]
        messages.append(
            json.dumps(
                {
                    "instance_id": inst["id"],
                    "job_id": job_id,
                    "status": status,
                    "exit_code": 0 if status == "success" else rng.choice([1, 2, 137]),
                    "duration_seconds": max(1, int((now - started).total_seconds())),
                    "started_at": iso(started),
                    "completed_at": iso(now),
                    "error": "" if status == "success" else rng.choice(["OOMKilled", "exit code 1", "step timed out"]),
                }
            )
        )
    if to_finish:  # ephemeral runners go away when their job ends; their SSM parameter stays behind
        ec2.terminate_instances(InstanceIds=[i["id"] for i in to_finish])
    counts["jobs_finished"] = len(to_finish)
    duplicates = rng.sample(messages, k=min(len(messages), cfg.duplicate_messages)) if cfg.duplicate_messages else []
    for _ in range(cfg.malformed_messages):
        messages.append(rng.choice(MALFORMED_TERMINATION_BODIES))
        counts["malformed_messages"] += 1
    messages += duplicates
    if cfg.duplicate_messages:
        counts["duplicate_messages"] = len(duplicates)
    for part in chunks(messages, 10):
        sqs.send_message_batch(
            QueueUrl=termination_queue_url, Entries=[{"Id": str(n), "MessageBody": body} for n, body in enumerate(part)]
        )
    counts["termination_messages"] = len(messages) - counts["malformed_messages"] - len(duplicates)

    capacity = max(0, cfg.max_instances - (len(running) - len(to_finish)))
    for _ in range(min(cfg.jobs_started, capacity)):
        pool = rng.choice(DEMO_POOLS)
        job_id = f"job-{rng.getrandbits(40):010x}"
        tags = [
            {"Key": MANAGED_TAG, "Value": "true"},
            {"Key": POOL_TAG, "Value": pool["pool_name"]},
            {"Key": JOB_TAG, "Value": job_id},
        ]
        instance = ec2.run_instances(
            ImageId=DEMO_AMI,
            MinCount=1,
            MaxCount=1,
            InstanceType=pool["instance_type"],
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )["Instances"][0]
        instance_id = instance["InstanceId"]
        dynamodb.put_item(
            TableName=jobs_table,
            Item=to_item(
                {
                    "job_id": job_id,
                    "instance_id": instance_id,
                    "pool": pool["pool_name"],
                    "status": "running",
                    "started_at": iso(now),
                }
            ),
        )
        ssm.put_parameter(
            Name=f"/runs-fleet/runners/{instance_id}/config",
            Type="String",
            Overwrite=True,
            Value=json.dumps({"job_id": job_id, "pool": pool["pool_name"]}),
        )
        counts["jobs_started"] += 1

    for _ in range(cfg.housekeeping_messages):
        task = rng.choice(["orphaned_instances", "stale_ssm", "old_jobs"])
        # Demo orphans are minutes old, not hours: a short max_runtime lets the two phases show.
        params = {"max_runtime": 5} if task == "orphaned_instances" else {}
        sqs.send_message(
            QueueUrl=housekeeping_queue_url,
            MessageBody=json.dumps({"task_type": task, "timestamp": iso(now), "params": params}),
        )
        counts["housekeeping_messages"] += 1
    for _ in range(cfg.pool_audit_messages):
        sqs.send_message(
            QueueUrl=housekeeping_queue_url,
            MessageBody=json.dumps({"task_type": "pool_audit", "timestamp": iso(now), "params": {}}),
        )
        counts["housekeeping_messages"] += 1
    if cfg.old_jobs or cfg.orphan_instances:
        counts.update(_fleet_leftovers(ec2, dynamodb, jobs_table, running, cfg, rng, now))
    return counts


def standing_instances_traffic(ec2) -> dict[str, int]:
    """Keep the pool audit's demo capacity (``DEMO_STANDING``) in place; creates only what is missing."""
    present = set()
    for page in ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:{ROLE_TAG}", "Values": [role for role, _, _ in DEMO_STANDING]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
        ]
    ):
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                present.update(t["Value"] for t in inst.get("Tags", []) if t["Key"] == ROLE_TAG)
    started = 0
    for role, pool, instance_type in DEMO_STANDING:
        if role in present:
            continue
        tags = [{"Key": MANAGED_TAG, "Value": "true"}, {"Key": ROLE_TAG, "Value": role}]
        tags += [{"Key": POOL_TAG, "Value": pool}] if pool else []
        instance_id = ec2.run_instances(
            ImageId=DEMO_AMI,
            MinCount=1,
            MaxCount=1,
            InstanceType=instance_type,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        )["Instances"][0]["InstanceId"]
        if role.startswith("stopped"):
            ec2.stop_instances(InstanceIds=[instance_id])
        started += 1
    return {"standing_instances_started": started}


def _fleet_leftovers(ec2, dynamodb, jobs_table, running, cfg: DemoConfig, rng: random.Random, now) -> dict[str, int]:
    """Work for the cleanup tasks: long-finished job records, and managed instances with no job."""
    statuses = ["completed", "failed", "timeout", "interrupted"]
    for _ in range(cfg.old_jobs):
        completed = now - dt.timedelta(days=8, minutes=rng.randint(0, 600))
        dynamodb.put_item(
            TableName=jobs_table,
            Item=to_item(
                {
                    "job_id": f"job-{rng.getrandbits(40):010x}",
                    "instance_id": f"i-{rng.getrandbits(68):017x}",
                    "pool": rng.choice(DEMO_POOLS)["pool_name"],
                    "status": rng.choice(statuses),
                    "started_at": iso(completed - dt.timedelta(minutes=rng.randint(1, 60))),
                    "completed_at": iso(completed),
                }
            ),
        )
    idle = [i for i in running if JOB_TAG not in i["tags"] and ROLE_TAG not in i["tags"]]  # not the audit demo's
    orphans = max(0, cfg.orphan_instances - len(idle))
    if orphans:
        pool = rng.choice(DEMO_POOLS)
        ec2.run_instances(
            ImageId=DEMO_AMI,
            MinCount=orphans,
            MaxCount=orphans,
            InstanceType=pool["instance_type"],
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": MANAGED_TAG, "Value": "true"}, {"Key": POOL_TAG, "Value": pool["pool_name"]}],
                }
            ],
        )
    return {"old_jobs_added": cfg.old_jobs, "orphans_launched": orphans}


def _demo_instances(ec2) -> list[dict[str, Any]]:
    out = []
    paginator = ec2.get_paginator("describe_instances")
    for page in paginator.paginate(
        Filters=[
            {"Name": f"tag:{MANAGED_TAG}", "Values": ["true"]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    ):
        for reservation in page["Reservations"]:
            for inst in reservation["Instances"]:
                out.append(
                    {
                        "id": inst["InstanceId"],
                        "launch_time": inst["LaunchTime"],
                        "tags": {t["Key"]: t["Value"] for t in inst.get("Tags", [])},
                    }
                )
    return out


def receiver_traffic(
    dynamodb, *, receivers_table: str, records_table: str, cfg: DemoConfig, rng: random.Random, now: dt.datetime
) -> dict[str, int]:
    """Demo receivers (created once) and new pending records for them."""
    counts = {"receivers_created": 0, "records_added": 0}
    for receiver in DEMO_RECEIVERS:
        try:
            dynamodb.put_item(
                TableName=receivers_table, Item=to_item(receiver), ConditionExpression="attribute_not_exists(receiver)"
            )
            counts["receivers_created"] += 1
        except ClientError as exc:
            if error_code(exc) != "ConditionalCheckFailedException":
                raise
    items = []
    for n in range(cfg.records):
        receiver = rng.choice(DEMO_RECEIVERS)["receiver"]
        created = now - dt.timedelta(milliseconds=rng.randint(0, 60_000))
        items.append(
            {
                "record_id": str(uuid.UUID(int=rng.getrandbits(128))),
                "receiver": receiver,
                "created_at": iso(created),
                # Now and then a producer sends a payload that is not JSON: batching keeps it, flagged.
                "payload": json.dumps({"seq": n, "value": rng.randint(0, 10_000)}) if n % 25 else f"seq={n};raw",
                "next_action": "BATCH",
                "pending_receiver": receiver,
            }
        )
    batch_write(dynamodb, records_table, [{"PutRequest": {"Item": to_item(i)}} for i in items])
    counts["records_added"] = len(items)
    return counts


def run_demo_traffic(
    *, dynamodb, ec2, ssm, sqs, env: dict[str, str], cfg: DemoConfig, now: dt.datetime | None = None
) -> dict[str, int]:
    """One step of all demo traffic. ``env`` maps the contract's variable names to deployed names."""
    rng = random.Random(cfg.seed)
    now = now or dt.datetime.now(dt.UTC)
    counts: dict[str, int] = {}
    counts.update(agenda_traffic(dynamodb, env["AGENDA_PROGRESS_TABLE"], cfg, rng, now))
    counts.update(
        fleet_traffic(
            ec2,
            ssm,
            dynamodb,
            sqs,
            jobs_table=env["RUNS_FLEET_JOBS_TABLE"],
            pools_table=env["RUNS_FLEET_POOLS_TABLE"],
            termination_queue_url=env["RUNS_FLEET_TERMINATION_QUEUE_URL"],
            housekeeping_queue_url=env["RUNS_FLEET_HOUSEKEEPING_QUEUE_URL"],
            cfg=cfg,
            rng=rng,
            now=now,
        )
    )
    counts.update(standing_instances_traffic(ec2))
    counts.update(
        receiver_traffic(
            dynamodb,
            receivers_table=env["RECEIVERS_TABLE"],
            records_table=env["BATCH_RECORDS_TABLE"],
            cfg=cfg,
            rng=rng,
            now=now,
        )
    )
    return counts
