"""How loud the local demo is: ``GROUNDSKEEPER_DEMO`` (``off``, ``quiet``, ``busy``). No Dagster.

``make dev`` runs every capability's schedules plus two demo traffic schedules. At their own
cadences (the production ones, and demo traffic every minute or two) that is about 270 runs an
hour, which buries a run an operator launches. So, under ``make dev``:

- ``quiet`` (the default): the schedules in :data:`QUIET_CRONS` run at the slower cadence given
  there (about 40 runs in 30 minutes), every capability still gets data;
- ``busy``: every schedule at its own cadence (the demo traffic every 1 or 2 minutes);
- ``off``: the quiet cadences, and the demo traffic schedules (:data:`DEMO_TRAFFIC_SCHEDULES`) are
  stopped (start them in the UI); ``make dev`` still seeds its demo data once.

The product never reads the variable: ``infra/demo/definitions.py`` passes :func:`demo_crons` to
``pipelines.definitions.build_definitions`` as a mapping of schedule name -> cron, and each schedule
factory builds its schedule at that cron (its description says so).
"""

from __future__ import annotations

from collections.abc import Mapping

DEMO_ENV = "GROUNDSKEEPER_DEMO"
MODES = ("off", "quiet", "busy")
DEFAULT_MODE = "quiet"

DEMO_TRAFFIC_SCHEDULES = ("demo_traffic_schedule", "progressor_demo_traffic_schedule")
"""The demo's own traffic: stopped by default under ``off``."""

QUIET_CRONS = {
    "demo_traffic_schedule": "*/10 * * * *",
    "progressor_demo_traffic_schedule": "*/10 * * * *",
    "collect_zombies_default_default": "5-59/10 * * * *",
    "progressor_health_schedule": "*/10 * * * *",
    "reclaim_demo_agendas": "*/15 * * * *",
    "housekeeping_orphaned_instances_schedule": "*/15 * * * *",
    "pool_audit_schedule": "*/15 * * * *",
}
"""Local schedules and their cadence under ``quiet`` and ``off`` (the others keep their own: the
batch decider still looks every minute, it starts a run only when a receiver's batch is due).
collect_zombies runs 5 minutes after each step of progressor's demo traffic, which leaves zombies."""


def demo_mode(environ: Mapping[str, str]) -> tuple[str, str | None]:
    """The mode ``GROUNDSKEEPER_DEMO`` names (unset or empty: ``quiet``), and a one-line problem
    when its value is not one of :data:`MODES` (the mode is then ``quiet``)."""
    raw = (environ.get(DEMO_ENV) or "").strip()
    if not raw:
        return DEFAULT_MODE, None
    if raw.lower() in MODES:
        return raw.lower(), None
    return DEFAULT_MODE, f"{DEMO_ENV}={raw!r} is invalid: one of {', '.join(MODES)}; using {DEFAULT_MODE}"


def demo_crons(mode: str) -> dict[str, str]:
    """The crons of the schedules that run at another cadence than their own under ``mode``: none
    under ``busy``, :data:`QUIET_CRONS` otherwise."""
    return {} if mode == "busy" else dict(QUIET_CRONS)
