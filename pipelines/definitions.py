"""The one ``dg.Definitions`` of the Groundskeeper code location.

Each capability subpackage exposes ``build_defs(deployment)``; resources come from the
per-deployment dict in ``resources``.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from pipelines.demo.defs import build_defs as demo_defs
from pipelines.fleet.defs import build_defs as fleet_defs
from pipelines.pool_audit.defs import build_defs as pool_audit_defs
from resources import deployment_name, resources_for

ROOT_DIR = Path(__file__).resolve().parent.parent


def build_definitions(deployment: str) -> dg.Definitions:
    """Everything the code location serves in ``deployment`` (``local`` or ``prod``)."""
    return dg.Definitions.merge(
        demo_defs(deployment),
        fleet_defs(deployment),
        pool_audit_defs(deployment),
        dg.Definitions(resources=resources_for(deployment)),
    )


DEPLOYMENT = deployment_name()
defs = build_definitions(DEPLOYMENT)
