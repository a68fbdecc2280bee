"""How loud the local demo is: ``GROUNDSKEEPER_DEMO`` (``off``, ``quiet``, ``busy``). No Dagster.

The local deployment (``make dev``) runs every capability's schedules plus two demo traffic
schedules. At their own cadences (the production ones, and demo traffic every minute or two) that
is about 270 runs an hour, which buries a run an operator launches. So, in the local deployment only:

- ``quiet`` (the default): the schedules in :data:`QUIET_CRONS` run at the slower cadence given
  there (about 40 runs in 30 minutes), every capability still gets data;
- ``busy``: every schedule at its own cadence (the demo traffic every 1 or 2 minutes);
- ``off``: the quiet cadences, and the demo traffic schedules (:data:`DEMO_TRAFFIC_SCHEDULES`) are
  stopped (start them in the UI); ``make dev`` still seeds its demo data once.

The ``prod`` and ``cluster`` deployments never read the variable. No built schedule is changed
afterwards: each schedule factory named here builds its schedule at its cadence
(:func:`deployment_cadence`, through ``pipelines.common.defs.cadence.schedule_cadence``), with its
own cron as the argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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


def local_cron(name: str, cron: str, mode: str) -> str:
    """The cron of schedule ``name`` (own cron ``cron``) in the local deployment under ``mode``."""
    return cron if mode == "busy" else QUIET_CRONS.get(name, cron)


@dataclass(frozen=True)
class Cadence:
    """When a schedule runs: its cron, whether it starts stopped, and what its description adds
    (empty when it runs at its own cadence)."""

    cron: str
    stopped: bool = False
    note: str = ""


def local_cadence(name: str, cron: str, mode: str) -> Cadence:
    """The cadence of schedule ``name`` (own cron ``cron``) in the local deployment under ``mode``:
    under ``quiet`` and ``off`` the frequent ones slower, under ``off`` the demo traffic stopped,
    under ``busy`` its own. The note says what changed."""
    local = local_cron(name, cron, mode)
    stopped = mode == "off" and name in DEMO_TRAFFIC_SCHEDULES
    notes = []
    if local != cron:
        notes.append(f"Under make dev ({DEMO_ENV}={mode}) it runs on {local}, not {cron}.")
    if stopped:
        notes.append(f"Stopped by {DEMO_ENV}=off: start it here for demo traffic.")
    return Cadence(local, stopped, " ".join(notes))


def deployment_cadence(deployment: str, name: str, cron: str, environ: Mapping[str, str]) -> Cadence:
    """The cadence of schedule ``name`` (own cron ``cron``) in ``deployment``: in the local one the
    mode ``environ`` names (an invalid value: ``quiet``; the demo's wiring says so once), elsewhere
    its own."""
    if deployment != "local":
        return Cadence(cron)
    return local_cadence(name, cron, demo_mode(environ)[0])
