"""The alerting settings (``ALERTS_*``, ``DAGSTER_UI_URL``), checked at each tick. No Dagster.

A bad value never stops alerting: it is one line in :attr:`AlertConfig.problems` and its default
is used (a sink whose setting is bad is left out, and that line says so, every tick).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipelines.alerts.incidents import Sink
from pipelines.alerts.sinks import SinkConfigError, SnsSink, WebhookSink
from pipelines.common.http import UnsafeURL, credential_url
from pipelines.retry import RetryPolicy, RetryPolicyError, exponential, policy_from_text

DEFAULT_MAX_PER_TICK = 20
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
    except ValueError:
        problems.append(f"{name}={raw!r} is not a number from {low:g} to {high:g}: using {default!r}")
        return default


def alert_config(settings: Mapping[str, str | None], *, sns=None, region: str = "us-east-1") -> AlertConfig:
    """``settings``: the variables by name (unset: None). ``sns``: the SNS client, when there is a topic."""
    problems: list[str] = []
    sinks: list[Sink] = []
    topic, webhook = settings.get("ALERTS_SNS_TOPIC_ARN"), settings.get("ALERTS_WEBHOOK_URL")
    for name, make in (("ALERTS_SNS_TOPIC_ARN", lambda v: SnsSink(sns, v, region=region)),
                       ("ALERTS_WEBHOOK_URL", WebhookSink)):  # fmt: skip
        value = topic if name == "ALERTS_SNS_TOPIC_ARN" else webhook
        if value and value.strip():
            try:
                sinks.append(make(value))
            except SinkConfigError as exc:
                problems.append(f"{exc}: that sink is off")
    policy = default_policy()
    if (settings.get("ALERTS_RETRY_POLICY") or "").strip():
        try:
            policy = policy_from_text(settings["ALERTS_RETRY_POLICY"])
        except RetryPolicyError as exc:
            problems.append(f"ALERTS_RETRY_POLICY: {exc}: using {policy.describe()}")
    remind = _number(settings.get("ALERTS_REMIND_HOURS"), "ALERTS_REMIND_HOURS", None, float, 0.01, 24 * 365, problems)
    ui_url = (settings.get("DAGSTER_UI_URL") or "").strip().rstrip("/") or None
    if ui_url:  # every message carries links under it: no user info, query or fragment
        try:
            ui_url = credential_url("DAGSTER_UI_URL", ui_url)
        except UnsafeURL as exc:
            problems.append(f"{exc}: messages carry no link")
            ui_url = None
    runbook_url = (settings.get("ALERTS_RUNBOOK_BASE_URL") or "").strip().rstrip("/") or None
    if runbook_url:
        try:
            runbook_url = credential_url("ALERTS_RUNBOOK_BASE_URL", runbook_url)
        except UnsafeURL as exc:
            problems.append(f"{exc}: runbooks as repository paths")
            runbook_url = None
    muted = frozenset(m.strip() for m in (settings.get("ALERTS_MUTED_WARN_CHECKS") or "").split(",") if m.strip())
    return AlertConfig(
        sinks=sinks,
        max_per_tick=_number(
            settings.get("ALERTS_MAX_PER_TICK"), "ALERTS_MAX_PER_TICK", DEFAULT_MAX_PER_TICK, int, 1, 1000, problems
        ),  # fmt: skip
        tick_failures=_number(
            settings.get("ALERTS_TICK_FAILURES"), "ALERTS_TICK_FAILURES", DEFAULT_TICK_FAILURES, int, 1, 100, problems
        ),  # fmt: skip
        remind_seconds=remind * 3600 if remind else None,
        ui_url=ui_url,
        runbook_url=runbook_url,
        policy=policy,
        muted_checks=muted,
        problems=problems,
    )
