"""Groundskeeper's Dagster code: one subpackage per capability, assembled in ``definitions.py``.

The one place where Dagster's BetaWarnings and PreviewWarnings for APIs used on purpose are
silenced (here, because this runs before any of ``pipelines`` or ``resources`` builds them, in the
code server and in every run worker; by message, so that this package needs no Dagster import).
Each entry names the API and why it stays:
"""

import warnings

QUIETED_WARNINGS = (
    # SensorDefinition's `owners` (beta): Dagster itself passes it (as None) when it copies a
    # sensor to bind the resources; Groundskeeper's sensors set no owners.
    r"Parameter `owners` of initializer `SensorDefinition.__init__` is currently in beta",
)

for _message in QUIETED_WARNINGS:
    warnings.filterwarnings("ignore", message=_message, category=Warning)
