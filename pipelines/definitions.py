"""The one ``dg.Definitions``: the deployment is decided here, once, and what differs by it goes to each
capability's ``build_defs`` as plain values; a development code location adds :class:`Additions`."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from pipelines.alerts.defs import build_defs as alerts_defs
from pipelines.batching.defs import build_defs as batching_defs
from pipelines.common.defs import build_defs as common_defs
from pipelines.common.defs.metadata import CheckNotes
from pipelines.common.targets import targets_path
from pipelines.fleet.defs import build_defs as fleet_defs
from pipelines.progressor.defs import build_defs as progressor_defs
from pipelines.progressor.targets import TARGETS_ENV as PROGRESSOR_TARGETS_ENV
from pipelines.reclaim.defs import build_defs as reclaim_defs
from pipelines.reclaim.targets import TARGETS_ENV as RECLAIM_TARGETS_ENV
from pipelines.redrive.defs import build_defs as redrive_defs
from pipelines.retry.defs import build_defs as retry_defs
from resources import deployment_name, fixed, resources_for
from resources.cluster import celery_fan_out_executor
from sensors.run_retries import build_delayed_run_retries

ROOT_DIR = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Additions:
    """What a development code location adds (``make dev``'s demo). ``crons``: schedule -> the cron it
    runs on instead; ``alert_noise``: incident kinds never sent; ``demo_jobs``: jobs whose failures are
    demo alerts (``[demo]``, never critical)."""

    defs: dg.Definitions = field(default_factory=dg.Definitions)
    crons: Mapping[str, str] = field(default_factory=dict)
    reclaim_targets: Path | None = None
    progressor_targets: Path | None = None
    check_notes: CheckNotes = field(default_factory=dict)
    alert_noise: frozenset[str] = frozenset()
    demo_jobs: frozenset[str] = frozenset()


def build_definitions(deployment: str, additions: Additions | None = None) -> dg.Definitions:
    """Everything the code location serves in ``deployment``, with what ``additions`` adds."""
    add = additions or Additions()
    executor = celery_fan_out_executor() if deployment == "cluster" else None  # fan-out steps on Celery workers
    crons, notes = add.crons, add.check_notes
    built: list[dg.Definitions] = []  # the finished Definitions, for redrive's asset graph at run time
    base = dg.Definitions.merge(
        reclaim_defs(
            targets_file=targets_path(RECLAIM_TARGETS_ENV) or add.reclaim_targets, executor=executor, crons=crons
        ),
        fleet_defs(executor=executor, crons=crons, check_notes=notes),
        batching_defs(executor=executor),
        progressor_defs(
            targets_file=targets_path(PROGRESSOR_TARGETS_ENV) or add.progressor_targets, crons=crons, check_notes=notes
        ),
        alerts_defs(noise=add.alert_noise, demo_jobs=add.demo_jobs),
        add.defs,
        # redrive_failed_partitions works on any partitioned asset of the capabilities above.
        redrive_defs(asset_graph=lambda: built[0].resolve_asset_graph(), retried_jobs=lambda: {j.name for j in jobs}),
        common_defs(executor),
        dg.Definitions(resources=fixed(resources_for(deployment))),  # none set by a run's config
    )
    jobs = list(base.jobs or [])
    retry = retry_defs(jobs)  # renders the jobs' retry policies
    # The delayed_run_retries sensor spans capabilities: it may re-launch any named job of the code location.
    built.append(dg.Definitions.merge(base, retry, dg.Definitions(sensors=[build_delayed_run_retries(jobs)])))
    return built[0]


defs = build_definitions(deployment_name())
