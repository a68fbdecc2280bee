"""infra/template.yaml: it lints, and deploying it into moto creates every contract resource."""

import json
import re
from pathlib import Path

import pytest

from infra.deploy import OUTPUT_ENV, TEMPLATE_PATH, DeployError, deploy

CONTRACTS = Path(__file__).resolve().parents[1] / "docs" / "contracts.md"

# What docs/contracts.md fixes: table -> (hash key, {GSI name: (hash, range or None)}).
TABLES = {
    "AGENDA_PROGRESS_TABLE": ("id", {"processingState-updatedTime-index": ("processingState", "updatedTime")}),
    "AGENDA_READY_TABLE": ("id", {}),
    "RUNS_FLEET_JOBS_TABLE": (
        "job_id",
        {
            "completed_at-index": ("status", "completed_at"),
            "instance_id-index": ("instance_id", None),
            "status-instance_id-index": ("status", "instance_id"),  # contract extension (pool audit)
        },
    ),
    "RUNS_FLEET_POOLS_TABLE": ("pool_name", {}),
    "RECEIVERS_TABLE": ("receiver", {}),
    "BATCH_RECORDS_TABLE": ("record_id", {"pending-index": ("pending_receiver", "created_at")}),
}
QUEUES = {
    "RUNS_FLEET_TERMINATION_QUEUE_URL": "RUNS_FLEET_TERMINATION_DLQ_URL",
    "RUNS_FLEET_HOUSEKEEPING_QUEUE_URL": "RUNS_FLEET_HOUSEKEEPING_DLQ_URL",
}
BUCKETS = ["RUNS_FLEET_ARCHIVE_BUCKET", "BATCH_OUTBOX_BUCKET"]


@pytest.mark.slow
def test_template_passes_cfn_lint():
    """Its informational checks too (I3011: a stateful resource without DeletionPolicy and
    UpdateReplacePolicy is deleted on replacement, dead letters and all)."""
    from cfnlint.api import ManualArgs, lint_file

    matches = lint_file(TEMPLATE_PATH, config=ManualArgs(regions=["us-east-1"], include_checks=["I"]))
    assert not matches, "\n".join(str(m) for m in matches)


def test_every_provisioned_variable_of_the_contract_is_an_output():
    text = CONTRACTS.read_text()
    provisioned = set()
    for line in text.splitlines():
        if line.startswith("|") and "| provisioned |" in line:
            provisioned.update(re.findall(r"`([A-Z_]+)`", line.split("|")[1]))
    assert provisioned, "no provisioned variables found in the contract"
    assert provisioned <= set(OUTPUT_ENV.values()), provisioned - set(OUTPUT_ENV.values())


def test_deploy_creates_every_table_index_queue_dlq_and_bucket(aws):
    ddb, sqs, s3 = aws.client("dynamodb"), aws.client("sqs"), aws.client("s3")
    for env_name, (hash_key, indexes) in TABLES.items():
        table = ddb.describe_table(TableName=aws.env[env_name])["Table"]
        assert table["KeySchema"] == [{"AttributeName": hash_key, "KeyType": "HASH"}], env_name
        found = {
            g["IndexName"]: {k["KeyType"]: k["AttributeName"] for k in g["KeySchema"]}
            for g in table.get("GlobalSecondaryIndexes", [])
        }
        for name, (idx_hash, idx_range) in indexes.items():
            assert name in found, f"{env_name} lacks GSI {name}"
            assert found[name].get("HASH") == idx_hash
            assert found[name].get("RANGE") == idx_range
    for queue_env, dlq_env in QUEUES.items():
        attrs = sqs.get_queue_attributes(QueueUrl=aws.env[queue_env], AttributeNames=["All"])["Attributes"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=aws.env[dlq_env], AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        redrive = json.loads(attrs["RedrivePolicy"])
        assert redrive["deadLetterTargetArn"] == dlq_arn
        assert int(redrive["maxReceiveCount"]) == 3
    for bucket_env in BUCKETS:
        s3.head_bucket(Bucket=aws.env[bucket_env])
    policies = aws.client("iam").list_policies(Scope="Local")["Policies"]
    assert any(p["PolicyName"] == "groundskeeper-dev" for p in policies)


def test_deploy_is_repeatable(aws):
    again = deploy(aws.client("cloudformation"))
    assert again == {k: v for k, v in aws.env.items() if k in OUTPUT_ENV.values()}


def test_a_failing_template_reports_cloudformations_reason(aws):
    broken = "Resources:\n  Bad:\n    Type: AWS::Nope::Thing\n"
    with pytest.raises(DeployError) as info:
        deploy(aws.client("cloudformation"), stack_name="broken", template_body=broken)
    assert "broken" in str(info.value)


def test_termination_round_markers_expire_only_after_sqs_could_redeliver():
    from cfnlint.decode import decode

    from pipelines.fleet.termination import ROUNDS_PREFIX

    template, errors = decode(str(TEMPLATE_PATH))
    assert not errors
    rules = template["Resources"]["ArchiveBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    (rule,) = [r for r in rules if r.get("Prefix") == f"{ROUNDS_PREFIX}/"]
    assert rule["Status"] == "Enabled"
    assert rule["ExpirationInDays"] > 14  # SQS keeps a message 14 days at most


def test_the_only_alarm_is_the_alerts_heartbeat_one_source_per_signal():
    """What the alerts sensor alerts on (dead letters, reclaim's item errors) has no alarm of its
    own: the one alarm is the sensor's heartbeat, which nothing in Dagster can watch."""
    from tests.iam_support import load_template

    resources = load_template()["Resources"]
    alarms = {name: res["Properties"] for name, res in resources.items() if res["Type"] == "AWS::CloudWatch::Alarm"}
    assert sorted(alarms) == ["AlertsHeartbeatAlarm"]
    assert alarms["AlertsHeartbeatAlarm"]["MetricName"] == "AlertsHeartbeat"


def test_reclaim_may_be_granted_tables_outside_the_stack(aws):
    """ReclaimTableArns (empty by default) adds a managed policy for AgendaProgress/OperationProgress
    tables the stack does not own; the default deploys without it."""
    from cfnlint.decode import decode

    template, errors = decode(str(TEMPLATE_PATH))
    assert not errors
    policy = template["Resources"]["ReclaimTablesPolicy"]
    assert policy["Condition"] == "HasReclaimTableArns"
    (granted,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert granted["Resource"] == {"Ref": "ReclaimTableArns"}
    assert "dynamodb:UpdateItem" in granted["Action"]
    local = aws.client("iam").list_policies(Scope="Local")["Policies"]
    assert "groundskeeper-reclaim-tables-dev" not in {p["PolicyName"] for p in local}  # the default: none
    arns = "arn:aws:dynamodb:us-east-1:123456789012:table/OperationProgress-dev"
    arns += f",{arns}/index/*"
    env = deploy(aws.client("cloudformation"), parameters={"ReclaimTableArns": arns})
    assert env == {k: v for k, v in aws.env.items() if k in OUTPUT_ENV.values()}
    iam = aws.client("iam")
    names = {p["PolicyName"]: p["Arn"] for p in iam.list_policies(Scope="Local")["Policies"]}
    assert "groundskeeper-reclaim-tables-dev" in names
    assert "groundskeeper-dev" in names
    version = iam.get_policy(PolicyArn=names["groundskeeper-reclaim-tables-dev"])["Policy"]["DefaultVersionId"]
    document = iam.get_policy_version(PolicyArn=names["groundskeeper-reclaim-tables-dev"], VersionId=version)
    assert document["PolicyVersion"]["Document"]["Statement"][0]["Resource"] == arns.split(",")


STATEFUL = {
    "AWS::DynamoDB::Table",
    "AWS::SQS::Queue",
    "AWS::S3::Bucket",
    "AWS::Logs::LogGroup",
    "AWS::SecretsManager::Secret",
    "AWS::KMS::Key",
    "AWS::RDS::DBInstance",
}


def test_stateful_resources_outlive_deletion_and_replacement_and_tables_recover_to_a_point_in_time():
    """A replaced queue would drop its waiting messages and dead letters, a replaced log group its
    logs, a deleted secret the password of the database's snapshots: each is kept (Retain, or a
    Snapshot of the database). moto ignores DeletionPolicy and PITR: checked on the template."""
    from tests.iam_support import load_template

    resources = load_template()["Resources"]
    stateful = {name: res for name, res in resources.items() if res["Type"] in STATEFUL}
    assert {"TerminationDeadLetterQueue", "HousekeepingDeadLetterQueue", "DatabaseSecret", "EcsLogGroup"} <= set(
        stateful
    )
    for name, res in stateful.items():
        assert res.get("DeletionPolicy") in ("Retain", "Snapshot"), name
        assert res.get("UpdateReplacePolicy") == res["DeletionPolicy"], name
    tables = [name for name, res in stateful.items() if res["Type"] == "AWS::DynamoDB::Table"]
    assert len(tables) == 6
    for name in tables:
        pitr = resources[name]["Properties"].get("PointInTimeRecoverySpecification")
        assert pitr == {"PointInTimeRecoveryEnabled": True}, name
