"""``make dev``'s code location (``workspace.yaml``): the product's definitions for the local
deployment (``pipelines.definitions.build_definitions``) with the demo added as plain values
(``pipelines.definitions.Additions``):

- the demo traffic jobs and their schedules, and the ``retry_demo`` job (``infra/demo/defs.py``);
- the demo's targets files (``infra/demo/targets/``: the ``demo_agendas`` table, the
  ``default/default`` progressor namespace), unless ``RECLAIM_TARGETS_FILE`` or
  ``PROGRESSOR_TARGETS_FILE`` name others;
- the quiet crons of ``GROUNDSKEEPER_DEMO`` (``infra/demo/cadence.py``; an invalid value is one
  warning, and the demo stays quiet);
- what each check the demo fails on purpose says (:data:`CHECK_NOTES`), and the dead letters as
  alert noise (recorded, never sent);
- the sensor that materializes ``retry_policies`` once;
- its jobs (the traffic jobs above and ``retry_demo``), whose failures alerting marks as the demo's.

Production never imports this package (``tests/test_layers.py``), and the image leaves it out
(``infra/Dockerfile.dockerignore``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from infra.demo.cadence import demo_crons, demo_mode
from infra.demo.common import SEEDED
from infra.demo.defs import demo_defs
from pipelines.definitions import Additions, build_definitions

TARGETS_DIR = Path(__file__).with_name("targets")

CRASHED_WORKERS = (
    "progressor_demo_traffic crashes a worker every third step, and collect_zombies collects its task later"
)
PROGRESSOR_HEALTH = dg.AssetKey(["progressor", "health_default_default"])
CHECK_NOTES = {
    dg.AssetCheckKey(key, name): f"{SEEDED}: {what}"
    for key, name, what in (
        (
            dg.AssetKey(["runs_fleet", "termination_dead_letters"]),
            "dead_letter_depth",
            "demo_traffic sends malformed termination messages, which the drain dead-letters",
        ),
        (
            dg.AssetKey("pool_audit"),
            "idle_cost_below_threshold",
            "it keeps idle runners warm, linux-small wants 1 idle and gets 2",
        ),
        (
            dg.AssetKey("pool_audit"),
            "instances_tag_known_pools",
            "it keeps an instance without a pool tag and one tagged with the retired pool legacy-pool",
        ),
        (PROGRESSOR_HEALTH, "no_zombies", CRASHED_WORKERS),
        (PROGRESSOR_HEALTH, "oldest_running_task", CRASHED_WORKERS),
        (
            PROGRESSOR_HEALTH,
            "timers_on_time",
            "progressor_demo_traffic plays the timer scanner only when it runs, so timers wait between",
        ),
        (
            PROGRESSOR_HEALTH,
            "no_recent_process_errors",
            "collect_zombies errors the processes of the demo's crashed workers",
        ),
    )
}
"""What the demo does that fails each check, as the failed check says it."""


def demo_additions(environ: Mapping[str, str]) -> Additions:
    """The demo under the mode ``environ`` names (``GROUNDSKEEPER_DEMO``; an invalid value is one
    warning, and the mode is then ``quiet``)."""
    mode, problem = demo_mode(environ)
    if problem:
        warnings.warn(problem, stacklevel=2)
    defs = demo_defs(mode)
    return Additions(
        defs=defs,
        crons=demo_crons(mode),
        reclaim_targets=TARGETS_DIR / "reclaim.json",
        progressor_targets=TARGETS_DIR / "progressor.json",
        check_notes=CHECK_NOTES,
        alert_noise=frozenset({"dead_letters"}),
        demo_jobs=frozenset(job.name for job in defs.jobs or []),
    )


def build_local_definitions(environ: Mapping[str, str] | None = None) -> dg.Definitions:
    """The local deployment's definitions with the demo (``environ``: default the process's)."""
    return build_definitions("local", demo_additions(os.environ if environ is None else environ))


defs = build_local_definitions()
