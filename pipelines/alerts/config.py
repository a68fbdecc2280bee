"""The alerting settings (``ALERTS_*``, ``DAGSTER_UI_URL``), read from the typed settings resource
into an :class:`AlertConfig` once per evaluation of the sensor. No Dagster.

A bad value never stops alerting: it is one line in :attr:`AlertConfig.problems` and its default
is used (a sink whose setting is bad is left out, and that line says so, every tick).
"""

from __future__ import annotations

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


def _number(raw: str | None, name: str, default: Any, cast: Callable[[str], Any], low: float, high: float,
            problems: list[str]) -> Any:  # fmt: skip
    if raw is None or not str(raw).strip():
        return default
    try:
        value = cast(str(raw).strip())
        if not low <= value <= high:
            raise ValueError
        return value
    except (ValueError, OverflowError):
        problems.append(f"{name}={raw!r} is not a number from {low:g} to {high:g}: using {default!r}")
        return default


def _setting(name: str, read: Callable[[], Any], default: Any, problems: list[str], then: str) -> Any:
    """``read()``, or ``default`` with one line when it fails in any way (a bad value never stops alerting;
    the line names the variable and the error's kind, never the value, which may be a credential)."""
    try:
        return read()
    except SinkConfigError as exc:
        problems.append(f"{exc}: {then}")
    except RetryPolicyError as exc:
        problems.append(f"{name}: {exc}: {then}")
    except Exception as exc:  # noqa: BLE001 (any value a person can set is untrusted)
        problems.append(f"{name} cannot be used ({type(exc).__name__}): {then}")
    return default


def _checked_url(name: str, raw: str | None) -> str | None:
    """An http(s) URL that messages link under: no user info, query or fragment (as a credential's URL)."""
    url = (raw or "").strip().rstrip("/") or None
    if url is None:
        return None
    try:
        return credential_url(name, url)
    except UnsafeURL as exc:
        raise SinkConfigError(str(exc)) from None


def _heartbeat_env(raw: str | None) -> str:
    value = (raw or "").strip() or DEFAULT_HEARTBEAT_ENV
    if not _ENV.fullmatch(value):
        raise SinkConfigError(f"ALERTS_HEARTBEAT_ENV={value[:40]!r} is not a template Env (a-z, 0-9, -; 1 to 20)")
    return value


def alert_config(settings: Any, *, sns=None, region: str = "us-east-1", account: str | None = None) -> AlertConfig:
    """``settings``: the typed settings (``AlertSettings``, or any object with the fields of
    :data:`pipelines.common.env.ALERT_ENV`; unset: None), read field by field. ``sns``: the SNS client, when there is a
    topic; ``account``: the deployment's AWS account, when known (a topic of another one is never
    published to). Each setting is read on its own: a bad one is one line and its default (a sink:
    left out)."""
    problems: list[str] = []

    def raw(field_name: str) -> str | None:
        value = getattr(settings, field_name, None)
        return value if value is None or isinstance(value, str) else str(value)

    sinks: list[Sink] = []
    makers = {
        "sns_topic_arn": lambda v: SnsSink(sns, v, region=region, account=account),
        "webhook_url": WebhookSink,
    }
    for name, make in makers.items():
        value = raw(name)
        if value and value.strip():
            sink = _setting(ALERT_ENV[name], lambda: make(value), None, problems, "that sink is off")  # noqa: B023
            sinks += [sink] if sink is not None else []
    policy = default_policy()
    if (raw("retry_policy") or "").strip():
        policy = _setting(
            "ALERTS_RETRY_POLICY", lambda: policy_from_text(raw("retry_policy")), policy, problems,
            f"using {policy.describe()}",
        )  # fmt: skip
    remind = _number(raw("remind_hours"), "ALERTS_REMIND_HOURS", None, float, 0.01, 24 * 365, problems)
    ui_url = _setting("DAGSTER_UI_URL", lambda: _checked_url("DAGSTER_UI_URL", raw("ui_url")), None,
                      problems, "messages carry no link")  # fmt: skip
    runbook_url = _setting(
        "ALERTS_RUNBOOK_BASE_URL",
        lambda: _checked_url("ALERTS_RUNBOOK_BASE_URL", raw("runbook_base_url")),
        None, problems, "runbooks as repository paths",
    )  # fmt: skip
    muted = _setting(
        "ALERTS_MUTED_WARN_CHECKS",
        lambda: frozenset(m.strip() for m in (raw("muted_warn_checks") or "").split(",") if m.strip()),
        frozenset(), problems, "no check is muted",
    )  # fmt: skip
    return AlertConfig(
        sinks=sinks,
        max_per_tick=_number(
            raw("max_per_tick"), "ALERTS_MAX_PER_TICK", DEFAULT_MAX_PER_TICK, int, 1, 1000, problems
        ),  # fmt: skip
        tick_failures=_number(
            raw("tick_failures"), "ALERTS_TICK_FAILURES", DEFAULT_TICK_FAILURES, int, 1, 100, problems
        ),  # fmt: skip
        remind_seconds=remind * 3600 if remind else None,
        ui_url=ui_url,
        runbook_url=runbook_url,
        policy=policy,
        muted_checks=muted,
        heartbeat_env=_setting(
            "ALERTS_HEARTBEAT_ENV",
            lambda: _heartbeat_env(raw("heartbeat_env")),
            DEFAULT_HEARTBEAT_ENV,
            problems,
            f"using {DEFAULT_HEARTBEAT_ENV}",
        ),  # fmt: skip
        problems=problems,
    )
