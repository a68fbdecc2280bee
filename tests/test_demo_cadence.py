"""The local demo's cadence, GROUNDSKEEPER_DEMO (off, quiet, busy): a fresh make dev starts a few
dozen runs in half an hour instead of over a hundred, production's cadences never change."""

import datetime as dt

import dagster as dg
import pytest

from infra.demo.cadence import DEMO_ENV, DEMO_TRAFFIC_SCHEDULES, QUIET_CRONS, demo_crons, demo_mode
from infra.demo.definitions import CHECK_NOTES, build_local_definitions
from pipelines.common.defs.metadata import noted
from pipelines.common.defs.schedules import schedule as build_schedule
from pipelines.definitions import build_definitions


def _local(monkeypatch, mode: str | None) -> dg.Definitions:
    if mode is None:
        monkeypatch.delenv(DEMO_ENV, raising=False)
    else:
        monkeypatch.setenv(DEMO_ENV, mode)
    return build_local_definitions()


def _crons(defs: dg.Definitions) -> dict[str, str]:
    return {s.name: s.cron_schedule for s in defs.schedules}


def _matches(field: str, value: int) -> bool:
    """One cron field (``*``, ``n``, ``a-b``, with ``/step``, comma lists) against a value."""
    for part in field.split(","):
        spread, _, step = part.partition("/")
        low, high = (0, 59) if spread == "*" else map(int, (spread.split("-") * 2)[:2])
        if (
            low <= value <= (high if step or "-" in spread or spread == "*" else low)
            and (value - low) % int(step or 1) == 0
        ):
            return True
    return False


def _fires_in_30_minutes(cron: str) -> int:
    """How often ``cron`` fires from 10:00 to 10:29 of a weekday (hour, day fields: ``*`` or a number)."""
    minute, hour = cron.split()[:2]
    return sum(1 for m in range(30) if _matches(minute, m) and _matches(hour, 10))


def test_quiet_is_the_default_and_slows_the_frequent_local_schedules(monkeypatch):
    quiet, busy = _crons(_local(monkeypatch, None)), _crons(_local(monkeypatch, "busy"))
    assert set(QUIET_CRONS) <= set(quiet)  # the table names schedules that exist
    assert {name: quiet[name] for name in QUIET_CRONS} == QUIET_CRONS
    assert {name: cron for name, cron in quiet.items() if name not in QUIET_CRONS} == {
        name: cron for name, cron in busy.items() if name not in QUIET_CRONS
    }
    # what the schedules alone start in 30 minutes (the batch decider starts a run only when a batch is due)
    launched = {name: _fires_in_30_minutes(cron) for name, cron in quiet.items() if name != "batch_decider"}
    assert sum(launched.values()) < 40, launched
    assert sum(_fires_in_30_minutes(c) for n, c in busy.items() if n != "batch_decider") > 100


def test_busy_keeps_every_schedule_at_its_own_cadence_and_prod_never_reads_the_variable(monkeypatch):
    busy = _local(monkeypatch, "busy")
    crons = _crons(busy)
    assert crons["demo_traffic_schedule"] == "*/2 * * * *"
    assert crons["progressor_demo_traffic_schedule"] == crons["collect_zombies_default_default"] == "* * * * *"
    assert crons["housekeeping_orphaned_instances_schedule"] == "*/5 * * * *"
    monkeypatch.setenv(DEMO_ENV, "off")
    prod = build_definitions("prod")
    assert _crons(prod) == {name: cron for name, cron in crons.items() if name in _crons(prod)}
    assert all(s.default_status == dg.DefaultScheduleStatus.RUNNING for s in prod.schedules)


def test_off_stops_the_demo_traffic_and_says_so(monkeypatch):
    off = _local(monkeypatch, "off")
    for name in DEMO_TRAFFIC_SCHEDULES:
        schedule = off.resolve_schedule_def(name)
        assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
        assert f"Stopped by {DEMO_ENV}=off" in schedule.description
    assert off.resolve_schedule_def("reclaim_demo_agendas").default_status == dg.DefaultScheduleStatus.RUNNING


def test_a_slowed_schedule_launches_what_it_launched_and_its_description_says_when(monkeypatch):
    moment = dt.datetime(2026, 11, 24, 10, 15, tzinfo=dt.UTC)
    quiet, busy = _local(monkeypatch, "quiet"), _local(monkeypatch, "busy")
    for name in ("housekeeping_orphaned_instances_schedule", "collect_zombies_default_default", "reclaim_demo_agendas"):
        slow, own = quiet.resolve_schedule_def(name), busy.resolve_schedule_def(name)
        assert f"This code location runs it on {QUIET_CRONS[name]}, not {own.cron_schedule}." in slow.description
        assert (slow.job_name, slow.tags, slow.execution_timezone) == (own.job_name, own.tags, own.execution_timezone)
        requests = []
        for schedule in (slow, own):
            with dg.build_schedule_context(
                instance=dg.DagsterInstance.ephemeral(), scheduled_execution_time=moment
            ) as context:
                (request,) = schedule.evaluate_tick(context).run_requests
            requests.append((request.run_config, request.tags, request.run_key))
        assert requests[0] == requests[1]


def test_each_capability_builds_its_schedules_at_the_crons_it_is_given():
    from infra.demo.definitions import TARGETS_DIR
    from infra.demo.defs import demo_defs
    from pipelines.fleet.defs import build_defs as fleet_defs
    from pipelines.progressor.defs import build_defs as progressor_defs
    from pipelines.reclaim.defs import build_defs as reclaim_defs

    crons = demo_crons("off")
    built = {
        schedule.name: schedule
        for defs in (
            reclaim_defs(targets_file=TARGETS_DIR / "reclaim.json", crons=crons),
            fleet_defs(crons=crons),
            progressor_defs(targets_file=TARGETS_DIR / "progressor.json", crons=crons),
            demo_defs("off"),
        )
        for schedule in defs.schedules
    }
    assert {name: built[name].cron_schedule for name in QUIET_CRONS} == QUIET_CRONS
    stopped = {name for name, s in built.items() if s.default_status == dg.DefaultScheduleStatus.STOPPED}
    assert stopped == set(DEMO_TRAFFIC_SCHEDULES)


def test_a_cadence_is_the_schedule_own_unless_the_crons_name_another():
    own = "*/10 * * * *"
    assert demo_crons("busy") == {}
    assert demo_crons("quiet") == demo_crons("off") == QUIET_CRONS

    def cadence(name: str, cron: str, crons=None) -> dg.ScheduleDefinition:
        return build_schedule(name=name, cron_schedule=cron, description="Own.", job_name="a_job", crons=crons)

    assert cadence("pool_audit_schedule", own).cron_schedule == own
    assert cadence("pool_audit_schedule", own).description == "Own."
    given = cadence("pool_audit_schedule", own, QUIET_CRONS)
    assert given.cron_schedule == QUIET_CRONS["pool_audit_schedule"]
    assert given.description == f"Own. This code location runs it on {QUIET_CRONS['pool_audit_schedule']}, not {own}."
    assert cadence("batch_decider", "* * * * *", QUIET_CRONS).cron_schedule == "* * * * *"  # not named


def test_an_invalid_value_is_one_line_and_the_demo_stays_quiet(monkeypatch):
    assert demo_mode({}) == ("quiet", None)
    assert demo_mode({DEMO_ENV: " Busy "}) == ("busy", None)
    mode, problem = demo_mode({DEMO_ENV: "loud"})
    assert mode == "quiet"
    assert problem == f"{DEMO_ENV}='loud' is invalid: one of off, quiet, busy; using quiet"
    with pytest.warns(UserWarning, match="is invalid"):
        defs = _local(monkeypatch, "loud")
    assert _crons(defs)["demo_traffic_schedule"] == QUIET_CRONS["demo_traffic_schedule"]


def test_a_failure_the_demo_causes_says_so_only_where_the_notes_are_given():
    check = dg.AssetCheckKey(dg.AssetKey("pool_audit"), "instances_tag_known_pools")
    note = CHECK_NOTES[check]
    assert note.startswith("the demo seeds this on purpose: ")
    assert noted(check, False, "1 instance", CHECK_NOTES) == (f"1 instance ({note})", {"demo": note})
    assert noted(check, True, "0 instances", CHECK_NOTES) == ("0 instances", {})
    other = dg.AssetCheckKey(dg.AssetKey("pool_audit"), "no_such_check")
    assert noted(other, False, "1 instance", CHECK_NOTES) == ("1 instance", {})  # not one the demo causes
    assert noted(check, False, "1 instance", None) == ("1 instance", {})  # production: no notes


def test_every_check_note_names_a_check_of_the_local_definitions():
    local = build_local_definitions({})
    assert set(CHECK_NOTES) <= set(local.resolve_asset_graph().asset_check_keys)
