"""The one ``dg.Definitions`` of the Groundskeeper code location.

Each capability subpackage exposes ``build_defs(deployment)`` (``pipelines.common``'s holds what
spans capabilities: the ``operations_summary`` asset and the default executor; redrive's is the same
in every deployment and takes the code location's asset graph instead); resources come
from the per-deployment dict in ``resources``; the top-level ``sensors`` span capabilities. This
module only merges them (``tests/test_layers.py`` checks that it imports nothing else).
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from pipelines.alerts.defs import build_defs as alerts_defs
from pipelines.batching.defs import build_defs as batching_defs
from pipelines.common.defs import build_defs as common_defs
from pipelines.demo.defs import build_defs as demo_defs
from pipelines.fleet.defs import build_defs as fleet_defs
from pipelines.progressor.defs import build_defs as progressor_defs
from pipelines.reclaim.defs import build_defs as reclaim_defs
from pipelines.redrive.defs import build_defs as redrive_defs
from pipelines.retry.defs import build_defs as retry_defs
from resources import deployment_name, resources_for
from sensors.run_retries import build_delayed_run_retries

ROOT_DIR = Path(__file__).resolve().parent.parent


def build_definitions(deployment: str) -> dg.Definitions:
    """Everything the code location serves in ``deployment`` (``local`` or ``prod``)."""
    built: list[dg.Definitions] = []  # the finished Definitions, for redrive's asset graph at run time
    base = dg.Definitions.merge(
        reclaim_defs(deployment),
        fleet_defs(deployment),
        batching_defs(deployment),
        progressor_defs(deployment),
        alerts_defs(deployment),
        # The local deployment's demo traffic (each schedule has the demo's cadence from its factory).
        demo_defs(deployment),
        # redrive_failed_partitions works on any partitioned asset of the capabilities above.
        redrive_defs(asset_graph=lambda: built[0].resolve_asset_graph()),
        # operations_summary (it adds up every job's run_summary counters) and the default executor.
        common_defs(deployment),
        dg.Definitions(resources=resources_for(deployment)),
    )
    retry = retry_defs(deployment, jobs=list(base.jobs or []))  # renders the jobs' retry policies
    # The delayed_run_retries sensor spans capabilities: it may re-launch any job of the code location.
    jobs = [*(base.jobs or []), *(retry.jobs or [])]
    built.append(dg.Definitions.merge(base, retry, dg.Definitions(sensors=[build_delayed_run_retries(jobs)])))
    return built[0]


DEPLOYMENT = deployment_name()
defs = build_definitions(DEPLOYMENT)
