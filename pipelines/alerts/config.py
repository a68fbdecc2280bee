"""The alerting settings (``ALERTS_*``, ``DAGSTER_UI_URL``), read into an :class:`AlertConfig` at each
evaluation of the sensor. No Dagster. A bad value never stops alerting: it is one line in
:attr:`AlertConfig.problems` and its default is used (a sink whose setting is bad is left out).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipelines.alerts.incidents import Sink
from pipelines.alerts.sinks import SinkConfigError, SnsSink, WebhookSink
from pipelines.common.env import ALERT_ENV
from pipelines.common.http import UnsafeURL, credential_url
from pipelines.retry import RetryPolicy, RetryPolicyError, exponential, policy_from_text

DEFAULT_MAX_PER_TICK = 20
DEFAULT_HEARTBEAT_ENV = "dev"  # the template's default Env
_ENV = re.compile(r"[a-z0-9-]{1,20}")  # the template's Env pattern
DEFAULT_TICK_FAILURES = 3


def default_policy() -> RetryPolicy:
    """How a sink that is down is tried again on later ticks: 30 s, doubling up to 15 min, then every 15 min."""
    return exponential(30, 2, 900, 8)


@dataclass(frozen=True)
class AlertConfig:
    sinks: list[Sink] = field(default_factory=list)
    max_per_tick: int = DEFAULT_MAX_PER_TICK
    tick_failures: int = DEFAULT_TICK_FAILURES
    remind_seconds: float | None = None
    ui_url: str | None = None
    runbook_url: str | None = None  # ALERTS_RUNBOOK_BASE_URL: where docs/runbooks is served
    policy: RetryPolicy = field(default_factory=default_policy)
    muted_checks: frozenset[str] = frozenset()  # "asset/key:check" of WARN checks that never page
    heartbeat_env: str = DEFAULT_HEARTBEAT_ENV  # the heartbeat's Env dimension
    demo_jobs: frozenset[str] = frozenset()  # a development code location's demo jobs (no setting): demo alerts
    problems: list[str] = field(default_factory=list)


def _checked_url(name: str, raw: str | None) -> str | None:
    """An http(s) URL that messages link under: no user info, query or fragment (as a credential's URL)."""
    url = (raw or "").strip().rstrip("/") or None
    if url is None:
        return None
    try:
        return credential_url(name, url)
    except UnsafeURL as exc:
        raise SinkConfigError(str(exc)) from None


def _names(raw: str | None) -> frozenset[str]:
    return frozenset(name.strip() for name in (raw or "").split(",") if name.strip())


def _heartbeat_env(raw: str | None) -> str:
    value = (raw or "").strip() or DEFAULT_HEARTBEAT_ENV
    if not _ENV.fullmatch(value):
        raise SinkConfigError(f"ALERTS_HEARTBEAT_ENV={value[:40]!r} is not a template Env (a-z, 0-9, -; 1 to 20)")
    return value


def alert_config(settings: Any, *, sns=None, region: str = "us-east-1", account: str | None = None) -> AlertConfig:
    """``settings``: the typed settings (any object with the fields of :data:`ALERT_ENV`; unset: None).
    ``sns``: the SNS client, when there is a topic; ``account``: the deployment's AWS account, when known
    (a topic of another one is never published to). A bad setting is one line and its default (a sink:
    left out)."""
    problems: list[str] = []

    def raw(field_name: str) -> str | None:
        value = getattr(settings, field_name, None)
        return value if value is None or isinstance(value, str) else str(value)

    def setting(field_name: str, read: Callable[[str], Any], default: Any, then: str) -> Any:
        """``read(its value)``; ``default`` when unset or blank, or with one line when it fails in any way:
        the line names the variable and the error's kind, never the value (which may be a credential)."""
        name, value = ALERT_ENV[field_name], raw(field_name)
        if value is None or not value.strip():
            return default
        try:
            return read(value)
        except SinkConfigError as exc:
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
            raise SinkConfigError(f"{ALERT_ENV[field_name]}={value!r} is not a number from {low:g} to {high:g}")

        return setting(field_name, read, default, f"using {default!r}")

    def url(field_name: str, then: str) -> str | None:
        return setting(field_name, lambda v: _checked_url(ALERT_ENV[field_name], v), None, then)

    makers = {"sns_topic_arn": lambda v: SnsSink(sns, v, region=region, account=account), "webhook_url": WebhookSink}
    sinks = [setting(name, make, None, "that sink is off") for name, make in makers.items()]
    policy = default_policy()
    policy = setting("retry_policy", policy_from_text, policy, f"using {policy.describe()}")
    remind = number("remind_hours", None, float, 0.01, 24 * 365)
    return AlertConfig(
        sinks=[sink for sink in sinks if sink is not None],
        policy=policy,
        remind_seconds=remind * 3600 if remind else None,
        ui_url=url("ui_url", "messages carry no link"),
        runbook_url=url("runbook_base_url", "runbooks as repository paths"),
        muted_checks=setting("muted_warn_checks", _names, frozenset(), "no check is muted"),
        max_per_tick=number("max_per_tick", DEFAULT_MAX_PER_TICK, int, 1, 1000),
        tick_failures=number("tick_failures", DEFAULT_TICK_FAILURES, int, 1, 100),
        heartbeat_env=setting("heartbeat_env", _heartbeat_env, DEFAULT_HEARTBEAT_ENV, f"using {DEFAULT_HEARTBEAT_ENV}"),
        problems=problems,
    )
