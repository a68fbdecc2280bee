"""Where alert messages go, each sink chosen by one environment variable. No Dagster.

- :class:`SnsSink` (``ALERTS_SNS_TOPIC_ARN``): the message JSON as the body, message attributes
  ``severity``, ``state`` and ``alert_key``; e-mail, chat (AWS Chatbot) and paging subscribe to the
  topic. The topic must be in the deployment's region (its ARN is checked before any call).
- :class:`WebhookSink` (``ALERTS_WEBHOOK_URL``): a Slack-compatible incoming-webhook POST, ``text``
  plus the message's fields. The URL is a credential (a chat webhook's path is its secret): it is
  checked once (http(s), a path that stays where it says), never logged beyond scheme and host, and
  no redirect is followed. Each request times out.

A sink that does not take a message raises :class:`SinkError` with one line; the caller keeps the
message for a later tick.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pipelines.alerts.incidents import SinkError, text_of
from pipelines.common.http import NO_REDIRECTS, leaves_its_path
from pipelines.retry import classify_aws_error

WEBHOOK_TIMEOUT_SECONDS = 10
_TOPIC_ARN = re.compile(r"arn:aws(?:-[a-z]+)*:sns:([a-z0-9-]+):(\d{12}):([A-Za-z0-9_-]{1,256})")
_SUBJECT_TEXT = re.compile(r"[^\x20-\x7e]")


class SinkConfigError(ValueError):
    """A sink's setting cannot be used (one line naming the variable, never a credential)."""


class SnsSink:
    name = "sns"

    def __init__(self, sns, topic_arn: str, *, region: str) -> None:
        found = _TOPIC_ARN.fullmatch(topic_arn.strip())
        if not found:
            raise SinkConfigError(f"ALERTS_SNS_TOPIC_ARN {topic_arn!r} is not an SNS topic ARN")
        if found.group(1) != region:
            raise SinkConfigError(
                f"ALERTS_SNS_TOPIC_ARN names a topic in {found.group(1)}, not in this deployment's region {region}"
            )
        self.sns, self.topic_arn = sns, topic_arn.strip()

    def send(self, message: Mapping[str, Any]) -> None:
        attributes = {
            name: {"DataType": "String", "StringValue": str(message.get(name) or "-")}
            for name in ("severity", "state", "alert_key")
        }
        subject = _SUBJECT_TEXT.sub("?", text_of(message))[:100]  # e-mail subscribers' subject line
        try:
            self.sns.publish(
                TopicArn=self.topic_arn,
                Message=json.dumps(message, sort_keys=True, default=str),
                Subject=subject,
                MessageAttributes=attributes,
            )
        except Exception as exc:
            raise SinkError(f"SNS Publish to {self.topic_arn}: {classify_aws_error(exc).reason}") from None


class WebhookSink:
    name = "webhook"

    def __init__(self, url: str, *, timeout: float = WEBHOOK_TIMEOUT_SECONDS) -> None:
        try:
            parts = urlsplit(url.strip())
            port = f":{parts.port}" if parts.port else ""
        except ValueError:  # a port out of range or not a number, a bracket left open
            parts, port = None, ""
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise SinkConfigError("ALERTS_WEBHOOK_URL is not an http(s) URL (its value is not shown: it is a secret)")
        if leaves_its_path(parts.path):
            raise SinkConfigError(
                f"ALERTS_WEBHOOK_URL (to {parts.scheme}://{parts.hostname}) has a dot segment or an encoded '/' "
                "or '\\' in its path: refused, a server that normalises the path would serve another one"
            )
        self.url, self.timeout = url.strip(), timeout
        self.where = f"{parts.scheme}://{parts.hostname}{port}"  # what a log line may show

    def send(self, message: Mapping[str, Any]) -> None:
        body = json.dumps({"text": text_of(message), **message}, default=str).encode()
        request = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with NO_REDIRECTS.open(request, timeout=self.timeout) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            kind = ", a redirect: not followed" if 300 <= exc.code < 400 else ""
            raise SinkError(f"webhook at {self.where} answered HTTP {exc.code}{kind}") from None
        except TimeoutError:
            raise SinkError(f"webhook at {self.where} did not answer within {self.timeout:g} s") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError | socket.timeout):
                raise SinkError(f"webhook at {self.where} did not answer within {self.timeout:g} s") from None
            raise SinkError(f"webhook at {self.where} cannot be reached: {type(reason).__name__}") from None
        except http.client.HTTPException as exc:  # not HTTP, or it stopped mid-answer (not an OSError)
            raise SinkError(f"webhook at {self.where} did not answer HTTP: {type(exc).__name__}") from None
