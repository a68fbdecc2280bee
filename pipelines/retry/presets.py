"""Policies by preset name and by JSON form (docs/retry.md); bad input raises ``RetryPolicyError``."""

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

from pipelines.retry import policy as p


def _doubling(n: int) -> float:
    return 2.0 ** (n - 1)


PRESETS: dict[str, p.Formula] = {
    policy.name: policy
    for policy in (
        p.Formula(
            name="sidekiq",
            formula=lambda n: (n - 1) ** 4 + 15,
            jitter=p.SidekiqJitter(),
            max_attempts=26,
            summary="(n-1)**4 + 15 s plus rand(10)*n, 25 retries",
            source="Sidekiq 7 lib/sidekiq/job_retry.rb delay_for: (count**4) + 15 + rand(10) * (count + 1), "
            "count = retries so far; default retry: 25 (wiki Error-Handling)",
        ),
        p.Formula(
            name="oban",
            formula=lambda n: 15 + 2**n,
            jitter=p.Jitter("increase", 0.0, 0.1),  # Oban's jitter(mode: :inc): up to 10% more
            max_attempts=20,
            summary="15 + 2**n s plus up to 10%, 20 attempts",
            source="Oban 2.x lib/oban/worker.ex backoff/1: Backoff.exponential(attempt, mult: 1, max_pow: 100, "
            "min_pad: 15) then Backoff.jitter(mode: :inc); max_attempts default 20",
        ),
        p.Formula(
            name="river",
            formula=lambda n: float(n) ** 4,
            jitter=p.JITTERS["plus-minus"],
            max_attempts=25,
            summary="n**4 s +/-10%, 25 attempts",
            source="River retry_policy.go DefaultClientRetryPolicy: attempt**4 seconds +/-10% jitter "
            "(attempt = errors so far); MaxAttempts default 25",
        ),
        p.Formula(
            name="celery",
            formula=lambda n: 180.0,
            max_attempts=4,
            summary="fixed 180 s, 3 retries",
            source="Celery docs, Tasks > Retrying: Task.default_retry_delay = 180 s, Task.max_retries = 3",
        ),
        p.Formula(
            name="celery-backoff",
            formula=_doubling,
            jitter=p.JITTERS["full"],
            max_delay=600.0,
            max_attempts=4,
            summary="2**(n-1) s capped at 600 s, full jitter, 3 retries",
            source="Celery docs, Tasks > Automatic retry for known exceptions: retry_backoff=True (factor 1), "
            "retry_backoff_max=600, retry_jitter=True (full jitter), max_retries=3",
        ),
        p.Formula(
            name="temporal",
            formula=_doubling,
            max_delay=100.0,
            max_attempts=None,
            summary="1 s doubling, capped at 100 s, unlimited attempts",
            source="Temporal docs, Retry Policies defaults: InitialInterval 1s, BackoffCoefficient 2.0, "
            "MaximumInterval 100 x InitialInterval, MaximumAttempts 0 (unlimited)",
        ),
        p.Formula(
            name="runs-fleet",
            formula=lambda n: 0.1 * 5.0 ** (n - 1),
            max_delay=1.0,
            max_attempts=4,
            summary="0.1 s, 0.5 s, 1 s, 3 retries, no jitter",
            source="runs-fleet pkg/events/handler.go: retries an AWS call after 100 ms, 500 ms and 1 s, then "
            "gives up (exponential: initial 0.1 s, coefficient 5, max delay 1 s, 4 attempts, no jitter)",
        ),
        p.Formula(
            name="step-functions",
            formula=_doubling,
            max_attempts=4,
            summary="1 s doubling, 3 retries, no jitter",
            source="AWS Step Functions docs, Retry field defaults: IntervalSeconds 1, MaxAttempts 3, "
            "BackoffRate 2.0, no MaxDelaySeconds, JitterStrategy NONE",
        ),
        p.Formula(
            name="progressor",
            formula=lambda n: 5.0,  # check_retryable: trunc(last_retry_interval x 1.0), from 5 s
            max_attempts=3,
            summary="5 s, then trunc(last x 1.0), 2 retries (timer tasks only)",
            source="progressor include/progressor.hrl DEFAULT_RETRY_POLICY and src/prg_worker.erl check_retryable: "
            "initial_timeout 5 s, backoff_coefficient 1.0, no max_timeout, max_attempts 3 "
            "(retried while attempts_count + 1 < max_attempts)",
        ),
    )
}


def preset(name: str, non_retryable: p.Names = ()) -> p.Formula:
    names = p._names(non_retryable)
    try:
        base = PRESETS[name]
    except (KeyError, TypeError):
        raise p.invalid("name", name, f"one of {sorted(PRESETS)}") from None
    return dataclasses.replace(base, non_retryable=names) if names else base


_FIELDS: dict[str, tuple[Callable[..., p.RetryPolicy], set[str], set[str]]] = {
    # kind: (constructor, taking the fields in snake_case; required and optional fields besides nonRetryable)
    "none": (p.none, set(), set()),
    "fixed": (p.fixed, {"delay", "maxAttempts"}, set()),
    "exponential": (p.exponential, {"initial", "maxAttempts"}, {"coefficient", "maxDelay", "jitter", "jitterRatio"}),
    "preset": (preset, {"name"}, set()),
    "function": (p.function, {"path"}, {"maxAttempts"}),
}


def policy_from_json(obj: Any) -> p.RetryPolicy:
    """Build a policy from its JSON form (a dict, or a JSON string of one)."""
    if isinstance(obj, str):
        try:
            obj = json.loads(obj)
        except json.JSONDecodeError as exc:
            raise p.RetryPolicyError(f"policy is not valid JSON: {exc}", field="policy", value=obj) from None
        except RecursionError:
            raise p.RetryPolicyError("policy is nested too deeply to be a policy", field="policy", value=None) from None
    if not isinstance(obj, dict):
        raise p.invalid("policy", obj, "a JSON object")
    if not isinstance(kind := obj.get("kind"), str) or kind not in _FIELDS:
        raise p.invalid("kind", kind, f"one of {sorted(_FIELDS)}")
    build, required, optional = _FIELDS[kind]
    if missing := sorted(required - obj.keys()):
        raise p.RetryPolicyError(f"{kind} policy needs {missing[0]!r}", field=missing[0], value=None)
    if unknown := sorted(obj.keys() - required - optional - {"kind", "nonRetryable"}):
        raise p.RetryPolicyError(
            f"{kind} policy has an unknown field {unknown[0]!r} (value {obj[unknown[0]]!r})",
            field=unknown[0],
            value=obj[unknown[0]],
        )
    try:
        return build(**{re.sub("([A-Z])", r"_\1", key).lower(): value for key, value in obj.items() if key != "kind"})
    except TypeError as exc:  # a value of a type no check above expected: a policy error, never the caller's crash
        raise p.RetryPolicyError(f"{kind} policy is malformed: {exc}", field="policy", value=obj) from None


def policy_from_text(text: str) -> p.RetryPolicy:
    """A run tag's value: a preset name (``sidekiq``), ``none``, or a JSON policy object."""
    if not isinstance(text, str) or not text.strip():
        raise p.invalid("policy", text, "a preset name or a JSON object")
    text = text.strip()
    if text.startswith("{"):
        return policy_from_json(text)
    if text == "none":
        return p.none()
    return preset(text)
