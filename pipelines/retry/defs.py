"""Dagster wiring of the retry library: the ``retry_policies`` asset (the ``delayed_run_retries`` sensor
spans capabilities: ``sensors/run_retries.py``; the local ``retry_demo`` job is the demo's, ``infra/demo``)."""

from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg

from pipelines.common.defs.config import config_schema, params_from_config
from pipelines.common.defs.metadata import table_from
from pipelines.common.params import param
from pipelines.retry.policy import RetryPolicyError
from pipelines.retry.presets import PRESETS, policy_from_text
from pipelines.retry.runs import run_policy
from pipelines.retry.simulate import human, timeline
from pipelines.retry.tags import POLICY_TAG


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


# 4 columns, the most the asset page shows inline
TIMELINE_COLUMNS = {"policy": "policy", "attempts": "attempts", "over": "over (worst case)", "timeline": "timeline"}


def build_defs(jobs: Sequence = ()) -> dg.Definitions:
    """The ``retry_policies`` asset, with the policies ``jobs`` are tagged with."""
    tagged = {
        f"job {job.name}": job.tags[POLICY_TAG] for job in jobs if POLICY_TAG in (getattr(job, "tags", None) or {})
    }

    @dg.asset(
        name="retry_policies",
        group_name="retry",
        description=(
            "Every built-in and configured retry policy as a timeline: what each means in hours. "
            "`timelines` sketches each policy's attempts on a line; `waits` lists every wait."
        ),
        tags={"groundskeeper/capability": "retry"},
        config_schema=config_schema(RetryPoliciesParams),
    )
    def retry_policies(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        params = params_from_config(context, RetryPoliciesParams)
        named = {**{f"preset {name}": name for name in PRESETS}, **tagged, **params.policies}
        rows, sections = [], []  # a bad policy is reported in both
        for name, text in named.items():
            try:
                policy = run_policy(text) if name in tagged else policy_from_text(text)
                t = timeline(policy, None if policy.max_attempts else params.horizon)
                total, worst = human(t.total), human(t.worst_case)
                summary = f"{policy.describe()}. {t.attempts} attempts over {total} (worst case with jitter {worst})."
                source = f"\nSource: {policy.source}\n" if getattr(policy, "source", "") else ""
                sections.append(f"### {name}\n\n{summary}\n{source}\n{t.to_markdown()}")
                attempts = f"{t.attempts}" if t.stopped else f"{t.attempts}+"
                over = f"{total} ({worst})"
                rows.append({"policy": name, "attempts": attempts, "over": over, "timeline": t.sketch()})
            except RetryPolicyError as exc:
                sections.append(f"### {name}\n\n**invalid policy** `{text}`: {exc}\n")
                rows.append({"policy": name, "attempts": "-", "over": "-", "timeline": f"invalid policy: {exc}"})
        context.log.info(f"rendered {len(rows)} retry policies")
        return dg.MaterializeResult(
            metadata={
                "policies": dg.MetadataValue.int(len(rows)),
                "timelines": table_from(rows, TIMELINE_COLUMNS),  # inline on the asset page
                "waits": dg.MetadataValue.md("\n".join(sections)),  # every wait, behind "[Show Markdown]"
            }
        )

    return dg.Definitions(assets=[retry_policies])
