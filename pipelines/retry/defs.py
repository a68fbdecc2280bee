"""Dagster wiring of the retry library: the ``retry_policies`` asset and the local ``retry_demo``
job. The ``delayed_run_retries`` sensor spans capabilities: it is ``sensors/run_retries.py``,
wired to every job in ``pipelines/definitions.py``.
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg
from botocore.exceptions import ClientError

from pipelines.common.defs import aws_errors, config_schema, params_from_config
from pipelines.common.params import param
from pipelines.retry.config import policy_from_text
from pipelines.retry.policy import RetryPolicyError, none
from pipelines.retry.presets import PRESETS
from pipelines.retry.simulate import human, timeline
from pipelines.retry.tags import ATTEMPT_TAG, POLICY_TAG

__all__ = ["RetryDemoParams", "RetryPoliciesParams", "build_defs", "build_retry_policies_asset"]


# -- the retry_policies asset ------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPoliciesParams:
    """Extra policies for the ``retry_policies`` asset to render, beside the presets and the jobs' tags."""

    policies: dict = param(
        {},
        description=(
            "Extra policies to render, by name: each value is a preset name, none, or a JSON policy "
            'such as {"kind": "fixed", "delay": 30, "maxAttempts": 3}.'
        ),
    )
    horizon: int = param(
        30, description="Attempts to simulate for a policy with unlimited attempts.", minimum=1, maximum=1000
    )


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
        config_schema=config_schema(RetryPoliciesParams),
    )
    def retry_policies(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        params = params_from_config(context, RetryPoliciesParams)
        named = {**{f"preset {name}": name for name in PRESETS}, **tagged, **params.policies}
        document, count = policy_tables(named, params.horizon)
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


@dataclass(frozen=True)
class RetryDemoParams:
    """How the local retry demo fails."""

    succeed_on_attempt: int = param(
        3,
        description="The attempt (groundskeeper/retry_attempt tag) that succeeds; earlier ones are throttled.",
        minimum=1,
        maximum=100,
    )
    seconds: float = param(
        0.0,
        description="Seconds of work before the attempt fails or succeeds (time to try terminating it from the UI).",
        minimum=0,
        maximum=3600,
    )


@dg.op(
    description="Local demo: throttled (a simulated ThrottlingException) until attempt N, by its run tag.",
    config_schema=config_schema(RetryDemoParams),
)
def throttled_until_attempt(context: dg.OpExecutionContext) -> int:
    params = params_from_config(context, RetryDemoParams)
    attempt = int(context.run.tags.get(ATTEMPT_TAG, "1"))
    time.sleep(params.seconds)
    with aws_errors(context, none()):  # no op-level retry: the run fails, the sensor re-launches it
        if attempt < params.succeed_on_attempt:
            error = {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded (simulated)"}}
            raise ClientError(error, "Query")
    context.log.info(f"attempt {attempt} succeeded")
    return attempt


@dg.job(
    description="Local only: fails twice with a transient error; delayed_run_retries re-launches it after 10 s, 20 s.",
    tags={POLICY_TAG: DEMO_POLICY, "groundskeeper/capability": "retry"},
    executor_def=dg.in_process_executor,  # one op
)
def retry_demo():
    throttled_until_attempt()


def build_defs(deployment: str, jobs: Sequence = ()) -> dg.Definitions:
    """The retry capability: the ``retry_policies`` asset (with the policies ``jobs`` are tagged
    with) and, locally, the ``retry_demo`` job."""
    own_jobs = [retry_demo] if deployment == "local" else []
    return dg.Definitions(assets=[build_retry_policies_asset([*jobs, *own_jobs])], jobs=own_jobs)
