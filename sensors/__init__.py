"""Sensors shared across capabilities (cursor-keeping, cheap ticks, ``run_key`` per request).

Capability-specific sensors live beside their capability under ``pipelines/`` or here when they
span capabilities (run-status sensors, for example).
"""
