"""Presets: the published default retry timing of other systems, each with its ``source``. Each maps
the other system's counter onto ``n`` (attempts made so far); ``max_attempts`` counts the first run."""

from __future__ import annotations

import dataclasses

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


def preset(name: str, non_retryable: tuple[str, ...] | list[str] = ()) -> p.Formula:
    """A preset by name, optionally with non-retryable error types added."""
    names = p._names(non_retryable)
    try:
        base = PRESETS[name]
    except (KeyError, TypeError):
        raise p.RetryPolicyError(
            f"name must be one of {sorted(PRESETS)}, got {name!r}", field="name", value=name
        ) from None
    return dataclasses.replace(base, non_retryable=names) if names else base
