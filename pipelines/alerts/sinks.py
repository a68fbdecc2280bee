"""The sinks, each chosen by one environment variable (docs/alerts.md, "Sinks"): :class:`SnsSink` and a
Slack-compatible :class:`WebhookSink`. A sink that does not take a message raises :class:`SinkError`
with one line, never a credential (a webhook URL's path is its secret). No Dagster.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from pipelines.alerts.incidents import SinkError, text_of
from pipelines.common.http import NO_REDIRECTS, UnsafeURL, credential_url, location
from pipelines.retry import classify_aws_error

WEBHOOK_TIMEOUT_SECONDS = 10
SNS_TIMEOUT_SECONDS = WEBHOOK_TIMEOUT_SECONDS  # the longest request of a tick, whichever the sink
_TOPIC_ARN = re.compile(r"arn:aws(?:-[a-z]+)*:sns:([a-z0-9-]+):(\d{12}):([A-Za-z0-9_-]{1,256})")
_SUBJECT_TEXT = re.compile(r"[^\x20-\x7e]")


class _Deadline:
    """The sockets of one request, all cut (shut down) when its deadline passes: a socket timeout bounds
    each read only, and a server that trickles its answer a byte at a time would hold the tick."""

    def __init__(self, seconds: float) -> None:
        self.socks: list[socket.socket] = []
        self.cut = False
        self.lock = threading.Lock()
        self.timer = threading.Timer(seconds, self.cut_all)
        self.timer.daemon = True

    def add(self, sock: socket.socket) -> socket.socket:
        with self.lock:
            self.socks.append(sock)
            if self.cut:
                sock.shutdown(socket.SHUT_RDWR)
        return sock

    def cut_all(self) -> None:
        with self.lock:
            self.cut = True
            for sock in self.socks:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # the blocked connect, send or read returns at once


def _watched(connection_class, deadline: _Deadline):
    def make(host, **kwargs):
        connection = connection_class(host, **kwargs)
        connection._create_connection = lambda *args: deadline.add(socket.create_connection(*args))
        return connection

    return make


class _DeadlineHTTP(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(_watched(http.client.HTTPConnection, req.deadline), req)


class _DeadlineHTTPS(urllib.request.HTTPSHandler):
    def https_open(self, req):
        return self.do_open(_watched(http.client.HTTPSConnection, req.deadline), req, context=self._context)


_NO_REDIRECTS = next(h for h in NO_REDIRECTS.handlers if isinstance(h, urllib.request.HTTPRedirectHandler))
_OPENER = urllib.request.build_opener(type(_NO_REDIRECTS), _DeadlineHTTP, _DeadlineHTTPS)
"""``NO_REDIRECTS``' rules, with a deadline over each whole request (``Request.deadline``)."""


class SinkConfigError(ValueError):
    """A sink's setting cannot be used (one line naming the variable, never a credential)."""


class NoAnswer(TimeoutError):
    """A call that did not return within its time (it goes on in the background, its result unused)."""


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result (or its exception), or :class:`NoAnswer` after ``seconds``: for a client whose own
    timeouts are longer (boto3's). The call runs in a daemon thread, left to end by itself when cut."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 (handed to the caller, whatever it is)
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="bounded-call", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise NoAnswer(f"no answer within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


class SnsSink:
    name = "sns"

    def __init__(self, sns, topic_arn: str, *, region: str, account: str | None = None) -> None:
        found = _TOPIC_ARN.fullmatch(topic_arn.strip())
        if not found:
            raise SinkConfigError(f"ALERTS_SNS_TOPIC_ARN {topic_arn!r} is not an SNS topic ARN")
        if found.group(1) != region:
            raise SinkConfigError(
                f"ALERTS_SNS_TOPIC_ARN names a topic in {found.group(1)}, not in this deployment's region {region}"
            )
        self.sns, self.topic_arn = sns, topic_arn.strip()
        self.elsewhere = None  # why it cannot be published to, when known up front
        if account and found.group(2) != account:
            self.elsewhere = (
                f"SNS Publish to {self.topic_arn}: the topic is in account {found.group(2)}, "
                f"not in this deployment's {account} (not tried)"
            )

    def send(self, message: Mapping[str, Any]) -> None:
        if self.elsewhere:
            raise SinkError(self.elsewhere)
        attributes = {
            name: {"DataType": "String", "StringValue": str(message.get(name) or "-")}
            for name in ("severity", "state", "alert_key")
        }
        subject = _SUBJECT_TEXT.sub("?", text_of(message))[:100]  # e-mail subscribers' subject line
        body = json.dumps(message, sort_keys=True, default=str)
        try:
            within(
                SNS_TIMEOUT_SECONDS,
                lambda: self.sns.publish(
                    TopicArn=self.topic_arn, Message=body, Subject=subject, MessageAttributes=attributes
                ),
            )
        except NoAnswer as exc:
            raise SinkError(f"SNS Publish to {self.topic_arn}: {exc}") from None
        except Exception as exc:
            raise SinkError(f"SNS Publish to {self.topic_arn}: {classify_aws_error(exc).reason}") from None


class WebhookSink:
    name = "webhook"

    def __init__(self, url: str, *, timeout: float = WEBHOOK_TIMEOUT_SECONDS) -> None:
        try:
            self.url = credential_url("ALERTS_WEBHOOK_URL", url, query=True)  # a chat webhook's query may hold its key
        except UnsafeURL as exc:
            raise SinkConfigError(str(exc)) from None
        self.timeout = timeout
        self.where = location(self.url, path=False)  # what a log line may show: its path is the secret

    def send(self, message: Mapping[str, Any]) -> None:
        body = json.dumps({"text": text_of(message), **message}, default=str).encode()
        request = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        request.deadline = deadline = _Deadline(self.timeout)
        deadline.timer.start()
        try:
            with _OPENER.open(request, timeout=self.timeout) as response:
                response.read()
        except Exception as exc:
            raise SinkError(f"webhook at {self.where} {self._why(exc, deadline.cut)}") from None
        finally:
            deadline.timer.cancel()

    def _why(self, exc: Exception, cut: bool) -> str:
        """One line on why a request failed, without its URL's path (a secret)."""
        reason = getattr(exc, "reason", exc) if isinstance(exc, urllib.error.URLError) else exc
        if cut or isinstance(reason, TimeoutError | socket.timeout):
            return f"did not answer within {self.timeout:g} s"
        if isinstance(exc, urllib.error.HTTPError):
            return f"answered HTTP {exc.code}" + (", a redirect: not followed" if 300 <= exc.code < 400 else "")
        if isinstance(exc, http.client.HTTPException):  # not HTTP, or it stopped mid-answer (not an OSError)
            return f"did not answer HTTP: {type(exc).__name__}"
        return f"cannot be reached: {type(reason).__name__}"
