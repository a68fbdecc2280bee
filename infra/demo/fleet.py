"""The fleet's demo traffic for the local deployment: pools, instances running jobs, queue messages. No Dagster.

Each step creates the demo pools (once), finishes some running jobs (their instance terminates and
a termination message is sent, a few of them malformed or sent twice), starts new jobs on new
managed instances, and sends housekeeping messages; it leaves long-finished job records and a
managed instance with no job for the cleanup tasks. :func:`standing_instances_traffic` keeps the
pool audit's demo capacity in place. The local deployment's ``demo_traffic`` job (``infra/demo/defs.py``)
runs them with the other capabilities' traffic.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from dataclasses import dataclass
from typing import Any

from infra.demo.common import put_once, step_count
from pipelines.common import iso, to_item
from pipelines.common.aws_batches import chunks
from pipelines.fleet.messages import runner_parameter
from pipelines.fleet.tasks.orphaned_instances import MANAGED_TAG, described_instances, instance_tags, managed_instances

DEMO_AMI = "ami-12c6146b"  # an image the local moto server knows; demo traffic never runs in prod
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

# Termination messages that a real agent could send by mistake: the processors must dead-letter them.
MALFORMED_TERMINATION_BODIES = [
    "this is not json",
    json.dumps({"job_id": "missing-the-rest"}),
    json.dumps({"instance_id": "i-0123456789abcdef0", "job_id": "j-x", "status": "exploded"}),
    json.dumps({"instance_id": "i-1234/../../other", "job_id": "j-y", "status": "success"}),
    json.dumps(["a", "list"]),
]


@dataclass(frozen=True)
class FleetTraffic:
    """How much fleet traffic one step makes (keys of the ``demo_traffic`` job's run config)."""

    jobs_started: int = step_count(4, "Fleet jobs started, each on a new managed instance (up to max_instances).")
    jobs_finished: int = step_count(
        4, "Running fleet jobs that finish: their instance terminates and a termination message is sent."
    )
    malformed_messages: int = step_count(
        1, "Malformed termination messages sent (the processors must dead-letter them)."
    )
    housekeeping_messages: int = step_count(1, "Housekeeping messages sent, each with a random cleanup task.")
    max_instances: int = step_count(
        24, "The most managed instances running jobs; beyond it, jobs finish before new ones start.", maximum=500
    )
    duplicate_messages: int = step_count(1, "Termination messages sent twice, as at-least-once delivery does.")
    old_jobs: int = step_count(
        2, "Finished job records completed 8+ days ago, for the old_jobs cleanup task.", maximum=1000
    )
    orphan_instances: int = step_count(
        1, "Managed instances kept running with no job, for the orphaned_instances task."
    )
    pool_audit_messages: int = step_count(0, "Housekeeping messages asking for the pool audit.")


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
    traffic: FleetTraffic,
    rng: random.Random,
    now: dt.datetime,
) -> dict[str, int]:
    """Pools, instances running jobs, termination messages (some malformed) and housekeeping messages."""
    counts = {
        "pools_created": sum(put_once(dynamodb, pools_table, pool, "pool_name") for pool in DEMO_POOLS),
        "jobs_started": 0,
        "jobs_finished": 0,
        "termination_messages": 0,
        "malformed_messages": 0,
        "housekeeping_messages": 0,
    }

    running = _demo_instances(ec2)
    busy = [i for i in running if JOB_TAG in i["tags"]]
    to_finish = rng.sample(busy, k=min(len(busy), traffic.jobs_finished + max(0, len(running) - traffic.max_instances)))
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
    duplicates = (
        rng.sample(messages, k=min(len(messages), traffic.duplicate_messages)) if traffic.duplicate_messages else []
    )
    for _ in range(traffic.malformed_messages):
        messages.append(rng.choice(MALFORMED_TERMINATION_BODIES))
        counts["malformed_messages"] += 1
    messages += duplicates
    if traffic.duplicate_messages:
        counts["duplicate_messages"] = len(duplicates)
    for part in chunks(messages, 10):
        sqs.send_message_batch(
            QueueUrl=termination_queue_url, Entries=[{"Id": str(n), "MessageBody": body} for n, body in enumerate(part)]
        )
    counts["termination_messages"] = len(messages) - counts["malformed_messages"] - len(duplicates)

    capacity = max(0, traffic.max_instances - (len(running) - len(to_finish)))
    for _ in range(min(traffic.jobs_started, capacity)):
        pool = rng.choice(DEMO_POOLS)
        job_id = f"job-{rng.getrandbits(40):010x}"
        instance_id = _launch(ec2, pool["instance_type"], {POOL_TAG: pool["pool_name"], JOB_TAG: job_id})[0]
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
            Name=runner_parameter(instance_id),
            Type="String",
            Overwrite=True,
            Value=json.dumps({"job_id": job_id, "pool": pool["pool_name"]}),
        )
        counts["jobs_started"] += 1

    for _ in range(traffic.housekeeping_messages):
        task = rng.choice(["orphaned_instances", "stale_ssm", "old_jobs"])
        # Demo orphans are minutes old, not hours: a short max_runtime lets the two phases show.
        params = {"max_runtime": 5} if task == "orphaned_instances" else {}
        sqs.send_message(
            QueueUrl=housekeeping_queue_url,
            MessageBody=json.dumps({"task_type": task, "timestamp": iso(now), "params": params}),
        )
        counts["housekeeping_messages"] += 1
    for _ in range(traffic.pool_audit_messages):
        sqs.send_message(
            QueueUrl=housekeeping_queue_url,
            MessageBody=json.dumps({"task_type": "pool_audit", "timestamp": iso(now), "params": {}}),
        )
        counts["housekeeping_messages"] += 1
    if traffic.old_jobs or traffic.orphan_instances:
        counts.update(_fleet_leftovers(ec2, dynamodb, jobs_table, running, traffic, rng, now))
    return counts


def standing_instances_traffic(ec2) -> dict[str, int]:
    """Keep the pool audit's demo capacity (``DEMO_STANDING``) in place; creates only what is missing."""
    standing = described_instances(
        ec2,
        {"Name": f"tag:{ROLE_TAG}", "Values": [role for role, _, _ in DEMO_STANDING]},
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
    )
    present = {instance_tags(inst).get(ROLE_TAG) for inst in standing}
    started = 0
    for role, pool, instance_type in DEMO_STANDING:
        if role in present:
            continue
        tags = {ROLE_TAG: role, POOL_TAG: pool} if pool else {ROLE_TAG: role}
        instance_id = _launch(ec2, instance_type, tags)[0]
        if role.startswith("stopped"):
            ec2.stop_instances(InstanceIds=[instance_id])
        started += 1
    return {"standing_instances_started": started}


def _fleet_leftovers(
    ec2, dynamodb, jobs_table, running, traffic: FleetTraffic, rng: random.Random, now
) -> dict[str, int]:
    """Work for the cleanup tasks: long-finished job records, and managed instances with no job."""
    statuses = ["completed", "failed", "timeout", "interrupted"]
    for _ in range(traffic.old_jobs):
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
    orphans = max(0, traffic.orphan_instances - len(idle))
    if orphans:
        pool = rng.choice(DEMO_POOLS)
        _launch(ec2, pool["instance_type"], {POOL_TAG: pool["pool_name"]}, count=orphans)
    return {"old_jobs_added": traffic.old_jobs, "orphans_launched": orphans}


def _demo_instances(ec2) -> list[dict[str, Any]]:
    return [
        {"id": i["InstanceId"], "launch_time": i["LaunchTime"], "tags": instance_tags(i)}
        for i in managed_instances(ec2)
    ]


def _launch(ec2, instance_type: str, tags: dict[str, str], count: int = 1) -> list[str]:
    """Launch ``count`` managed demo instances of ``instance_type``, also tagged with ``tags``: their ids."""
    tag_list = [{"Key": key, "Value": value} for key, value in {MANAGED_TAG: "true", **tags}.items()]
    launched = ec2.run_instances(
        ImageId=DEMO_AMI,
        MinCount=count,
        MaxCount=count,
        InstanceType=instance_type,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tag_list}],
    )
    return [instance["InstanceId"] for instance in launched["Instances"]]
