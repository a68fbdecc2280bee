"""The Dagster helpers every capability uses in the same way, one module per kind:

- ``config``: a parameters dataclass as the op's config schema, a flat run config, and the
  validated parameters inside the op;
- ``failures``: the one AWS failure policy (the declared ``retry_policy=AWS_RETRY_POLICY`` and the
  body's :func:`~pipelines.common.defs.failures.one_line_failures`);
- ``metrics``: metrics published after a committed change (``CommittedChangeMetrics``);
- ``metadata``: a result dict as UI metadata, rows as a table;
- ``active_runs``: the one "is a run of this job still queued or running" check, and the
  schedule that skips its tick while one is;
- ``cadence``: a schedule's cron, default status and description as its factory builds it (its
  own cron, or the one the code location gives it by name);
- ``summary``: how every job ends (``run_summary``) and the ``operations_summary`` asset;
- ``executors``: the Celery executor of the jobs that fan out (the ``cluster`` deployment's).

:func:`build_defs` holds what spans capabilities: the ``operations_summary`` asset and the code
location's default executor.
"""

import dagster as dg

from pipelines.common.defs.summary import operations_summary_asset


def build_defs(executor: dg.ExecutorDefinition | None = None) -> dg.Definitions:
    """``operations_summary`` (it adds up every job's run_summary counters) and the default executor.

    Runs execute in process unless a job has real fan-out (reclaim's parallel-scan segments choose
    the multiprocess executor themselves): no second process importing the code location per step,
    also for asset jobs and backfills launched from the UI. Given ``executor`` (the cluster's
    Celery executor) those asset runs (batching backfills) run their steps on the workers."""
    return dg.Definitions(assets=[operations_summary_asset()], executor=executor or dg.in_process_executor)
