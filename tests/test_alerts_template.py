"""The template's alerting: deployed into moto, it has the alerts topic (exported as
ALERTS_SNS_TOPIC_ARN), the heartbeat alarm (missing data breaching) and an alarm per dead-letter
queue, each firing to the topic with its runbook in AlarmDescription."""

import json
import re
from pathlib import Path

from pipelines.alerts.heartbeat import HEARTBEAT_METRIC

ROOT = Path(__file__).resolve().parent.parent


def _alarms(aws) -> dict[str, dict]:
    alarms = aws.client("cloudwatch").describe_alarms()["MetricAlarms"]
    return {a["AlarmName"]: a for a in alarms}


def test_the_template_deploys_the_topic_the_heartbeat_alarm_and_the_dead_letter_alarms(aws):
    topic = aws.env["ALERTS_SNS_TOPIC_ARN"]
    assert topic in [t["TopicArn"] for t in aws.client("sns").list_topics()["Topics"]]
    assert topic.endswith(":groundskeeper-alerts-dev")
    alarms = _alarms(aws)

    beat = alarms["groundskeeper-alerts-heartbeat-dev"]
    assert (beat["Namespace"], beat["MetricName"]) == (aws.env["RUNS_FLEET_METRICS_NAMESPACE"], HEARTBEAT_METRIC)
    assert beat["TreatMissingData"] == "breaching"
    assert beat["Period"] * beat["EvaluationPeriods"] == 600
    assert beat["ComparisonOperator"] == "LessThanThreshold"
    assert beat["Threshold"] == 1

    for queue in ("termination", "housekeeping"):
        alarm = alarms[f"groundskeeper-{queue}-dead-letters-dev"]
        dlq_name = aws.env[f"RUNS_FLEET_{queue.upper()}_DLQ_URL"].rsplit("/", 1)[-1]
        assert (alarm["Namespace"], alarm["MetricName"]) == ("AWS/SQS", "ApproximateNumberOfMessagesVisible")
        assert alarm["Dimensions"] == [{"Name": "QueueName", "Value": dlq_name}]
        assert alarm["ComparisonOperator"] == "GreaterThanThreshold"
        assert alarm["Threshold"] == 0

    for name, alarm in alarms.items():
        assert alarm["AlarmActions"] == [topic], name
        runbook = re.search(r"Runbook: (docs/runbooks/[a-z_]+\.md)", alarm["AlarmDescription"])
        assert runbook, name
        assert (ROOT / runbook.group(1)).is_file(), name


def test_the_alerts_topic_is_encrypted_with_a_key_its_alarms_may_use(aws):
    """A customer managed key, not alias/aws/sns: CloudWatch alarms publish to an encrypted topic only
    when the key's policy lets cloudwatch.amazonaws.com use it, which the AWS managed key's does not."""
    topic = aws.env["ALERTS_SNS_TOPIC_ARN"]
    key = aws.client("sns").get_topic_attributes(TopicArn=topic)["Attributes"].get("KmsMasterKeyId")
    assert key is not None
    assert not key.startswith("alias/aws/")
    kms = aws.client("kms")
    metadata = kms.describe_key(KeyId=key)["KeyMetadata"]
    assert metadata["KeyManager"] == "CUSTOMER"
    assert kms.get_key_rotation_status(KeyId=key)["KeyRotationEnabled"]
    policy = json.loads(kms.get_key_policy(KeyId=key, PolicyName="default")["Policy"])
    (alarms,) = [st for st in policy["Statement"] if st.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}]
    assert set(alarms["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey*"}
    assert alarms["Condition"] == {"StringEquals": {"aws:SourceAccount": metadata["AWSAccountId"]}}
    alarm_actions = {a for alarm in _alarms(aws).values() for a in alarm["AlarmActions"]}
    assert alarm_actions == {topic}
