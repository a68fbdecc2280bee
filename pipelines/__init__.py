"""Groundskeeper's Dagster code: one subpackage per capability, assembled in ``definitions.py``. Here,
before anything builds them, the Beta and Preview warnings of APIs used on purpose are silenced."""

import warnings

QUIETED_WARNINGS = (
    # dagster-aws's SSMResource (beta): the fleet's housekeeping deletes stale SSM parameters with it.
    r"Class `SSMResource` is currently in beta",
    # SensorDefinition's `owners` (beta): Dagster itself passes it (as None) when it copies a
    # sensor to bind the resources; Groundskeeper's sensors set no owners.
    r"Parameter `owners` of initializer `SensorDefinition.__init__` is currently in beta",
)

for _message in QUIETED_WARNINGS:
    warnings.filterwarnings("ignore", message=_message, category=Warning)
