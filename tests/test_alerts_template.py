"""The template's alerting: deployed into moto, it has the alerts topic (exported as
ALERTS_SNS_TOPIC_ARN) and the heartbeat alarm (missing data breaching), each alarm firing to the
topic with its runbook in AlarmDescription; dead letters and reclaim's item errors have one source,
the alerts sensor."""

import json
import re
from pathlib import Path

from pipelines.alerts.defs import HEARTBEAT_METRIC
from pipelines.alerts.sources import check_evaluated

ROOT = Path(__file__).resolve().parent.parent


def _alarms(aws) -> dict[str, dict]:
    alarms = aws.client("cloudwatch").describe_alarms()["MetricAlarms"]
    return {a["AlarmName"]: a for a in alarms}


def test_the_template_deploys_the_topic_and_the_heartbeat_alarm(aws):
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

    for name, alarm in alarms.items():
        assert alarm["AlarmActions"] == [topic], name
        runbook = re.search(r"Runbook: (docs/runbooks/[a-z_]+\.md)", alarm["AlarmDescription"])
        assert runbook, name
        assert (ROOT / runbook.group(1)).is_file(), name


def test_the_heartbeat_runbook_says_it_is_the_templates_only_alarm_exactly_when_it_is(aws):
    """Without the alerts sensor only the template's alarms alert: the runbook says whether any other does."""
    text = (ROOT / "docs" / "runbooks" / "heartbeat.md").read_text()
    others = sorted(name for name in _alarms(aws) if name != "groundskeeper-alerts-heartbeat-dev")
    assert ("this alarm is the template's only alarm" in text) == (others == []), others


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


def test_dead_letters_page_from_one_source_the_sensor_and_no_alarm_of_the_template(aws):
    dlq_names = {aws.env[f"RUNS_FLEET_{q}_DLQ_URL"].rsplit("/", 1)[-1] for q in ("TERMINATION", "HOUSEKEEPING")}
    watched = {d["Value"] for alarm in _alarms(aws).values() for d in alarm["Dimensions"] if d["Name"] == "QueueName"}
    assert watched & dlq_names == set()


def test_the_dead_letter_depth_checks_do_not_alert_a_second_time():
    """The fleet's dead_letter_depth check reads the depth the sensor's dead_letters incident reads."""
    signal = check_evaluated("runs_fleet/termination_dead_letters", "dead_letter_depth", False, "WARN", "3 message(s)",
                             run_id="r", ui_url=None)  # fmt: skip
    assert signal is None


def test_reclaim_item_errors_page_from_one_source_the_sensor_and_no_alarm_of_the_template(aws):
    """The sensor's reclaim_errors incident links its run and resolves by its table's next clean run;
    the metric stays (reclaim publishes it) with no alarm on it."""
    assert [a["AlarmName"] for a in _alarms(aws).values() if a["MetricName"] == "AgendaReclaimErrors"] == []
