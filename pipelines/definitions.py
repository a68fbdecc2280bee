"""The one ``dg.Definitions`` of the Groundskeeper code location.

Each capability subpackage exposes ``build_defs(deployment)``; resources come from the
per-deployment dict in ``resources``.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from pipelines.batching.defs import build_defs as batching_defs
from pipelines.demo.defs import build_defs as demo_defs
from pipelines.fleet.defs import build_defs as fleet_defs
from pipelines.pool_audit.defs import build_defs as pool_audit_defs
from pipelines.progressor.defs import build_defs as progressor_defs
from pipelines.reclaim.defs import build_defs as reclaim_defs
from pipelines.retry.defs import build_defs as retry_defs
from resources import deployment_name, resources_for

ROOT_DIR = Path(__file__).resolve().parent.parent


def build_definitions(deployment: str) -> dg.Definitions:
    """Everything the code location serves in ``deployment`` (``local`` or ``prod``)."""
    base = dg.Definitions.merge(
        demo_defs(deployment),
        reclaim_defs(deployment),
        fleet_defs(deployment),
        pool_audit_defs(deployment),
        batching_defs(deployment),
        progressor_defs(deployment),
        dg.Definitions(resources=resources_for(deployment)),
    )
    # Retries come last: the delayed_run_retries sensor may re-launch any job defined above.
    return dg.Definitions.merge(base, retry_defs(deployment, jobs=list(base.jobs or [])))


DEPLOYMENT = deployment_name()
defs = build_definitions(DEPLOYMENT)
