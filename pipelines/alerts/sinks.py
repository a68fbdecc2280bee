"""The sinks and the settings that choose them (docs/alerts.md, "Sinks", "Settings"). A sink that does not take
a message raises :class:`SinkError` with one line, never a credential (a webhook URL's path is its secret)."""

import contextlib
import http.client
import json
import re
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipelines.alerts.incidents import Sink, SinkError, text_of
from pipelines.common.env import ALERT_ENV, SettingsError
from pipelines.common.http import NO_REDIRECTS, UnsafeURL, credential_url, location
from pipelines.retry import RetryPolicy, RetryPolicyError, classify_aws_error, exponential, policy_from_text

REQUEST_TIMEOUT_SECONDS = 10  # a request to either sink is cut after it: the longest request of a tick
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

    def watched(self, connection_class):
        def make(host, **kwargs):
            connection = connection_class(host, **kwargs)
            connection._create_connection = lambda *args: self.add(socket.create_connection(*args))
            return connection

        return make


class _DeadlineHandler(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    def http_open(self, req):
        return self.do_open(req.deadline.watched(http.client.HTTPConnection), req)

    def https_open(self, req):
        return self.do_open(req.deadline.watched(http.client.HTTPSConnection), req, context=self._context)


_NO_REDIRECTS = next(h for h in NO_REDIRECTS.handlers if isinstance(h, urllib.request.HTTPRedirectHandler))
_OPENER = urllib.request.build_opener(type(_NO_REDIRECTS), _DeadlineHandler)
"""``NO_REDIRECTS``' rules, with a deadline over each whole request (``Request.deadline``)."""


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
            raise SettingsError(f"ALERTS_SNS_TOPIC_ARN {topic_arn!r} is not an SNS topic ARN")
        if found.group(1) != region:
            raise SettingsError(
                f"ALERTS_SNS_TOPIC_ARN names a topic in {found.group(1)}, not in this deployment's region {region}"
            )
        self.sns, self.topic_arn = sns, topic_arn.strip()
        self.refuses = None  # why it cannot be published to, when known up front
        if account and found.group(2) != account:
            self.refuses = (
                f"SNS Publish to {self.topic_arn}: the topic is in account {found.group(2)}, "
                f"not in this deployment's {account} (not tried)"
            )

    def send(self, message: Mapping[str, Any]) -> None:
        if self.refuses:
            raise SinkError(self.refuses)
        attributes = {
            name: {"DataType": "String", "StringValue": str(message.get(name) or "-")}
            for name in ("severity", "state", "alert_key")
        }
        subject = _SUBJECT_TEXT.sub("?", text_of(message))[:100]  # e-mail subscribers' subject line
        body = json.dumps(message, sort_keys=True, default=str)
        try:
            within(
                REQUEST_TIMEOUT_SECONDS,
                lambda: self.sns.publish(
                    TopicArn=self.topic_arn, Message=body, Subject=subject, MessageAttributes=attributes
                ),
            )
        except Exception as exc:
            why = exc if isinstance(exc, NoAnswer) else classify_aws_error(exc).reason
            raise SinkError(f"SNS Publish to {self.topic_arn}: {why}") from None


class WebhookSink:
    name = "webhook"
    refuses = None

    def __init__(self, url: str, *, timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
        try:
            self.url = credential_url("ALERTS_WEBHOOK_URL", url, query=True)  # a chat webhook's query may hold its key
        except UnsafeURL as exc:
            raise SettingsError(str(exc)) from None
        self.timeout = timeout
        self.where = location(self.url, path=False)  # what a log line may show: its path is the secret

    def send(self, message: Mapping[str, Any]) -> None:
        text = text_of(message).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # Slack's escapes
        body = json.dumps({"text": text, **message}, default=str).encode()
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


class RefusedSink:
    """A sink whose setting was refused: it takes no message, so its messages wait for the setting to be fixed
    and the heartbeat stops (the alarm pages) rather than alerts going nowhere."""

    def __init__(self, name: str, refuses: str) -> None:
        self.name, self.refuses = name, refuses

    def send(self, message: Mapping[str, Any]) -> None:
        raise SinkError(self.refuses)


DEFAULT_HEARTBEAT_ENV = "dev"  # the template's default Env
_ENV = re.compile(r"[a-z0-9-]{1,20}")  # the template's Env pattern


@dataclass(frozen=True)
class AlertConfig:
    sinks: list[Sink]
    max_per_tick: int
    tick_failures: int
    remind_seconds: float | None
    ui_url: str | None
    runbook_url: str | None  # ALERTS_RUNBOOK_BASE_URL: where docs/runbooks is served
    policy: RetryPolicy  # how a sink that is down is tried again on later ticks
    muted_checks: frozenset[str]  # "asset/key:check" of WARN checks that never page
    heartbeat_env: str  # the heartbeat's Env dimension
    problems: list[str]
    demo_jobs: frozenset[str] = frozenset()  # a development code location's demo jobs (no setting): demo alerts

    @property
    def refusing(self) -> list[str]:
        """The sinks known up front to take no message (a refused setting, a topic of another account)."""
        return [sink.name for sink in self.sinks if getattr(sink, "refuses", None)]


def _names(raw: str) -> frozenset[str]:
    return frozenset(name.strip() for name in raw.split(",") if name.strip())


def _heartbeat_env(raw: str) -> str:
    value = raw.strip()
    if not _ENV.fullmatch(value):
        raise SettingsError(f"ALERTS_HEARTBEAT_ENV={value[:40]!r} is not a template Env (a-z, 0-9, -; 1 to 20)")
    return value


def alert_config(settings: Any, *, sns=None, region: str = "us-east-1", account: str | None = None) -> AlertConfig:
    """``settings``: ``AlertSettings`` (a string or None per field of :data:`ALERT_ENV`); ``sns``: the SNS client,
    when there is a topic. A bad setting is one line in ``problems`` and its default (a sink: left out)."""
    problems: list[str] = []

    def setting(field_name: str, read: Callable[[str], Any], default: Any, then: str) -> Any:
        """``read(its value)``; ``default`` when unset or blank, or with one line when it fails in any way:
        the line names the variable and the error's kind, never the value (which may be a credential)."""
        name, value = ALERT_ENV[field_name], getattr(settings, field_name)
        if value is None or not value.strip():
            return default
        try:
            return read(value)
        except (SettingsError, UnsafeURL) as exc:
            problems.append(f"{exc}: {then}")
        except RetryPolicyError as exc:
            problems.append(f"{name}: {exc}: {then}")
        except Exception as exc:  # noqa: BLE001 (any value a person can set is untrusted)
            problems.append(f"{name} cannot be used ({type(exc).__name__}): {then}")
        return default

    def number(field_name: str, default: Any, cast: Callable[[str], Any], low: float, high: float) -> Any:
        def read(value: str) -> Any:
            with contextlib.suppress(ValueError, OverflowError):
                number = cast(value.strip())
                if low <= number <= high:
                    return number
            raise SettingsError(f"{ALERT_ENV[field_name]}={value!r} is not a number from {low:g} to {high:g}")

        return setting(field_name, read, default, f"using {default!r}")

    def url(field_name: str, then: str) -> str | None:
        def read(value: str) -> str | None:  # messages link under it: no user info, query or fragment
            value = value.strip().rstrip("/")
            return credential_url(ALERT_ENV[field_name], value) if value else None

        return setting(field_name, read, None, then)

    def sink(field_name: str, name: str, make: Callable[[str], Sink]) -> Sink | None:
        """The sink, None when unset, or a :class:`RefusedSink` when set to what it cannot use."""
        known = len(problems)
        made = setting(field_name, make, None, "its alerts wait until it is fixed, and no heartbeat")
        return RefusedSink(name, problems[-1]) if len(problems) > known else made

    sinks = [
        sink("sns_topic_arn", SnsSink.name, lambda v: SnsSink(sns, v, region=region, account=account)),
        sink("webhook_url", WebhookSink.name, WebhookSink),
    ]
    policy = exponential(30, 2, 900, 8)  # 30 s, doubling up to 15 min, then every 15 min
    policy = setting("retry_policy", policy_from_text, policy, f"using {policy.describe()}")
    remind = number("remind_hours", None, float, 0.01, 24 * 365)
    return AlertConfig(
        sinks=[sink for sink in sinks if sink is not None],
        policy=policy,
        remind_seconds=remind * 3600 if remind else None,
        ui_url=url("ui_url", "messages carry no link"),
        runbook_url=url("runbook_base_url", "runbooks as repository paths"),
        muted_checks=setting("muted_warn_checks", _names, frozenset(), "no check is muted"),
        max_per_tick=number("max_per_tick", 20, int, 1, 1000),
        tick_failures=number("tick_failures", 3, int, 1, 100),
        heartbeat_env=setting("heartbeat_env", _heartbeat_env, DEFAULT_HEARTBEAT_ENV, f"using {DEFAULT_HEARTBEAT_ENV}"),
        problems=problems,
    )
