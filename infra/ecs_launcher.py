"""The production run launcher: dagster-aws's ``EcsRunLauncher``, with run tags that cannot change
what a run task runs.

``EcsRunLauncher`` reads these run tags when it starts a run's task (dagster-aws 0.29,
``dagster_aws/ecs/launcher.py``):

- ``ecs/container_overrides``: merged into the container's override: ``command``, ``environment``,
  ``environmentFiles``, ``secrets`` are RunTask's;
- ``ecs/task_overrides``: merged into the task's override: ``taskRoleArn``, ``executionRoleArn``,
  ``containerOverrides`` (the command again), ``cpu``, ``memory``;
- ``ecs/run_task_kwargs``: merged into RunTask itself last: ``networkConfiguration`` (subnets,
  security groups, a public address), ``launchType``, ``capacityProviderStrategy``, ``cluster``,
  ``taskDefinition``, ``overrides``;
- ``ecs/cpu``, ``ecs/memory``, ``ecs/ephemeral_storage``: the task's size (integers).

Run tags are set by whoever launches the run (the Launchpad, a re-execution, the GraphQL API), so
the first three let anyone who reaches the Dagster UI run a command of their own with the run task's
role and secrets (``DAGSTER_PG_PASSWORD``, ``PROGRESSOR_DSN``). :class:`RestrictedEcsRunLauncher`
starts a run only if each of its ``ecs/`` tags is in ``allowed_run_tags`` (default: the three sizing
tags), with a well-formed value; any other ``ecs/`` tag (a tag dagster-aws may read in a later
version included) fails the run with one line before any ECS call. ``ecs/task_arn`` and
``ecs/cluster`` are the launcher's own record of the task it started (a re-executed run inherits its
parent's): they are blanked before RunTask, set to the new task once it runs, and never refused; a
termination stops the task they name only if its ECS tag ``dagster/run_id`` (RunTask's) is the run's.

What the launcher reads besides run tags comes from the deployment, not from whoever launches a run:
its own config (infra/dagster.ecs.yaml) and the code location's ``container_context`` (the code
server's, in the run's origin), which the webserver takes from the code server, never from a request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg
from dagster_aws.ecs import EcsRunLauncher

TAG_PREFIX = "ecs/"
SIZING_TAGS = ("ecs/cpu", "ecs/memory", "ecs/ephemeral_storage")
"""The task's size: allowed unless ``allowed_run_tags`` leaves them out."""
JSON_TAGS = ("ecs/container_overrides", "ecs/task_overrides", "ecs/run_task_kwargs")
"""Merged into RunTask: they can change the command, environment, secrets, roles, network and launch type."""
LAUNCHER_TAGS = ("ecs/task_arn", "ecs/cluster")
"""Written by the launcher once the task runs (and inherited by a re-executed run)."""
_INTEGER = re.compile(r"^[1-9][0-9]{0,5}$")


def refusal(tags: Mapping[str, str], allowed: Iterable[str]) -> str | None:
    """The one line that refuses a run with these tags, or None when every ``ecs/`` tag is allowed
    and well-formed."""
    allowed = set(allowed)
    for key in sorted(tags):
        if not key.startswith(TAG_PREFIX) or key in LAUNCHER_TAGS:
            continue
        value = tags[key]
        if key not in allowed:
            what = (
                "may change the run task's command, environment, secrets, role, network or launch type"
                if key in JSON_TAGS
                else "is not an ECS setting this deployment allows"
            )
            return (
                f"run tag {key} refused: it {what}; the run launcher's allowed_run_tags "
                f"({', '.join(sorted(allowed)) or 'none'}) does not name it"
            )
        if key in SIZING_TAGS and not _INTEGER.match(value.strip()):
            return f"run tag {key} refused: {value[:40]!r} is not a whole number"
        if key in JSON_TAGS:
            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                return f"run tag {key} refused: its value is not a JSON object"
    return None


class RestrictedEcsRunLauncher(EcsRunLauncher):
    """``EcsRunLauncher`` that starts (or resumes) a run only if its ``ecs/`` run tags are all in
    ``allowed_run_tags`` (see the module docstring); otherwise the run fails with one line and no
    ECS call is made."""

    def __init__(self, inst_data=None, allowed_run_tags: list[str] | None = None, **config: Any):
        self.allowed_run_tags = tuple(SIZING_TAGS if allowed_run_tags is None else allowed_run_tags)
        super().__init__(inst_data=inst_data, **config)

    @classmethod
    def config_type(cls):
        return {
            **EcsRunLauncher.config_type(),
            "allowed_run_tags": dg.Field(
                [str],
                is_required=False,
                default_value=list(SIZING_TAGS),
                description=(
                    "The ecs/ run tags a run may carry (the whole list: name the sizing tags to keep "
                    "them). Any other ecs/ tag fails the run before its task starts."
                ),
            ),
        }

    def _refused(self, run) -> bool:
        line = refusal(run.tags, self.allowed_run_tags)
        if line is None:
            return False
        self._instance.report_run_failed(run, message=line)
        return True

    def launch_run(self, context) -> None:
        run = context.dagster_run
        if self._refused(run):
            return
        # Inherited from a parent or set at launch, they name some other task until RunTask returns: a
        # termination or health check in between would act on it. Blank, they name none.
        if named := {key: "" for key in LAUNCHER_TAGS if run.tags.get(key)}:
            self._instance.add_run_tags(run.run_id, named)
        super().launch_run(context)

    def resume_run(self, context) -> None:
        if not self._refused(context.dagster_run):
            super().resume_run(context)

    def terminate(self, run_id: str) -> bool:
        """``EcsRunLauncher.terminate``, stopping the task ``ecs/task_arn`` names only if it is this run's (its
        ECS tag ``dagster/run_id``, set by RunTask): until the launcher writes them, the run's ``ecs/`` tags
        are whatever its launch set or its parent left, and may name another run's task."""
        arn, cluster = self._get_run_tags(run_id)[:2]
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        self._instance.report_run_canceling(run)
        if not (arn and cluster):
            return False
        tasks = self.ecs.describe_tasks(tasks=[arn], cluster=cluster, include=["TAGS"]).get("tasks") or []
        own = [task for task in tasks if {"key": "dagster/run_id", "value": run_id} in (task.get("tags") or [])]
        if not own or own[0].get("lastStatus") == "STOPPED":
            return False
        self.ecs.stop_task(task=arn, cluster=cluster)
        return True
