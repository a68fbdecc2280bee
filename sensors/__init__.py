"""Sensors shared across capabilities (cursor-keeping, cheap ticks, ``run_key`` per request).

Capability-specific sensors live beside their capability under ``pipelines/``; sensors that span
capabilities live here:

- ``run_retries``: ``delayed_run_retries`` re-launches failed runs of any job after its retry
  policy's delay (wired in ``pipelines/definitions.py`` to every job of the code location).
"""
