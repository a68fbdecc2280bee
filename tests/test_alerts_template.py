"""The template's alerting: deployed into moto, it has the alerts topic (exported as
ALERTS_SNS_TOPIC_ARN), the heartbeat alarm (missing data breaching) and an alarm per dead-letter
queue, each firing to the topic with its runbook in AlarmDescription."""

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
