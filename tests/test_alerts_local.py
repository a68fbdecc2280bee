"""``make dev``'s alerting: an SQS queue subscribed (raw delivery) to the stack's alerts topic and the
local webhook receiver, whose page and ALERT lines show what would have paged someone."""

import io
import json
import urllib.request

import pytest

from infra.alerts_receiver import LocalAlertsReceiver, subscribe_inbox
from pipelines.alerts.incidents import AlertBook
from pipelines.alerts.sinks import SnsSink, WebhookSink
from pipelines.alerts.sources import dead_letters


@pytest.mark.slow
def test_the_inbox_and_the_receiver_show_what_would_have_paged(aws):
    topic = aws.env["ALERTS_SNS_TOPIC_ARN"]
    sqs = aws.client("sqs")
    inbox = subscribe_inbox(aws.client("sns"), sqs, topic, "groundskeeper-alerts-inbox")
    message = AlertBook().observe(dead_letters("runs-fleet-termination-dlq-dev", 3), 1_800_000_000.0)
    out = io.StringIO()
    with LocalAlertsReceiver(out=out) as receiver:
        SnsSink(aws.client("sns"), topic, region="us-east-1").send(message)
        WebhookSink(receiver.url).send(message)
        page = urllib.request.urlopen(receiver.page, timeout=60).read().decode()
    (got,) = sqs.receive_message(QueueUrl=inbox, MaxNumberOfMessages=10)["Messages"]
    assert json.loads(got["Body"])["alert_key"] == "dead_letters:runs-fleet-termination-dlq-dev"
    line = "FIRING [warning] runs-fleet-termination-dlq-dev holds 3 dead letter(s)"
    assert out.getvalue().startswith(f"ALERT {line}")
    assert line in page
    assert "docs/runbooks/dead_letters.md" in page
