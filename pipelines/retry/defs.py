"""Dagster wiring of retries: the ``retry_policies`` asset, the local ``retry_demo`` job, and the
``delayed_run_retries`` sensor (defined in ``sensors/run_retries.py``: it spans capabilities)
targeting every job of the code location.
"""

import time
from collections.abc import Sequence

import dagster as dg
from botocore.exceptions import ClientError

from pipelines.common.defs import aws_errors
from pipelines.retry.config import policy_from_text
from pipelines.retry.policy import RetryPolicyError, none
from pipelines.retry.presets import PRESETS
from pipelines.retry.simulate import human, timeline
from sensors.run_retries import (
    ATTEMPT_TAG,
    POLICY_TAG,
    RETRY_OF_TAG,
    ROOT_TAG,
    SENSOR_NAME,
    build_delayed_run_retries,
)

__all__ = ["ATTEMPT_TAG", "POLICY_TAG", "RETRY_OF_TAG", "ROOT_TAG", "SENSOR_NAME", "build_defs"]


# -- the retry_policies asset ------------------------------------------------------------------


class RetryPoliciesConfig(dg.Config):
    """Extra policies to show, by name: a preset name, ``none`` or a JSON policy."""

    policies: dict[str, str] = {}
    horizon: int = 30  # attempts simulated for policies without max_attempts


def policy_tables(named: dict[str, str], horizon: int) -> tuple[str, int]:
    """One markdown document with a timeline table per policy; bad policies are reported inline."""
    sections = []
    for name, text in named.items():
        try:
            policy = policy_from_text(text)
            t = timeline(policy, None if policy.max_attempts else horizon)
            summary = (
                f"{policy.describe()}. {t.attempts} attempts over {human(t.total)} "
                f"(worst case with jitter {human(t.worst_case)})."
            )
            source = getattr(policy, "source", "")
            sections.append(
                f"### {name}\n\n{summary}\n" + (f"\nSource: {source}\n" if source else "") + f"\n{t.to_markdown()}"
            )
        except RetryPolicyError as exc:
            sections.append(f"### {name}\n\n**invalid policy** `{text}`: {exc}\n")
    return "\n".join(sections), len(sections)


def build_retry_policies_asset(jobs: Sequence) -> dg.AssetsDefinition:
    tagged = {
        f"job {job.name}": job.tags[POLICY_TAG] for job in jobs if POLICY_TAG in (getattr(job, "tags", None) or {})
    }

    @dg.asset(
        name="retry_policies",
        group_name="retry",
        description="Every built-in and configured retry policy as a timeline: what each means in hours.",
        tags={"groundskeeper/capability": "retry"},
    )
    def retry_policies(context: dg.AssetExecutionContext, config: RetryPoliciesConfig) -> dg.MaterializeResult:
        named = {**{f"preset {name}": name for name in PRESETS}, **tagged, **config.policies}
        document, count = policy_tables(named, config.horizon)
        context.log.info(f"rendered {count} retry policies")
        return dg.MaterializeResult(
            metadata={
                "policies": dg.MetadataValue.int(count),
                "timelines": dg.MetadataValue.md(document),
            }
        )

    return retry_policies


# -- local demo: a job that fails with a transient error until its Nth attempt ----------------------

DEMO_POLICY = '{"kind": "exponential", "initial": 10, "coefficient": 2, "maxAttempts": 4}'


class RetryDemoConfig(dg.Config):
    succeed_on_attempt: int = 3  # attempts 1 and 2 are throttled, attempt 3 succeeds
    seconds: float = 0.0  # work this long first (time to try terminating it from the UI)


@dg.op(description="Local demo: throttled (a simulated ThrottlingException) until attempt N, by its run tag.")
def throttled_until_attempt(context: dg.OpExecutionContext, config: RetryDemoConfig) -> int:
    attempt = int(context.run.tags.get(ATTEMPT_TAG, "1"))
    time.sleep(max(0.0, config.seconds))
    with aws_errors(context, none()):  # no op-level retry: the run fails, the sensor re-launches it
        if attempt < config.succeed_on_attempt:
            error = {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded (simulated)"}}
            raise ClientError(error, "Query")
    context.log.info(f"attempt {attempt} succeeded")
    return attempt


@dg.job(
    description="Local only: fails twice with a transient error; delayed_run_retries re-launches it after 10 s, 20 s.",
    tags={POLICY_TAG: DEMO_POLICY, "groundskeeper/capability": "retry"},
)
def retry_demo():
    throttled_until_attempt()


def build_defs(deployment: str, jobs: Sequence = ()) -> dg.Definitions:
    """The retry capability. ``jobs`` are the code location's jobs: the sensor may re-launch them."""
    own_jobs = [retry_demo] if deployment == "local" else []
    targets = [*jobs, *own_jobs]
    sensors = [build_delayed_run_retries(targets)] if targets else []
    return dg.Definitions(assets=[build_retry_policies_asset(targets)], sensors=sensors, jobs=own_jobs)
