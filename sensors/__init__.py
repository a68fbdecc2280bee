"""Sensors that span capabilities (capability-specific ones live beside their capability):
``run_retries.delayed_run_retries``, wired in ``pipelines/definitions.py`` to every job of the code location."""
