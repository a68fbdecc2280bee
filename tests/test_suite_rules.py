"""The suite's own rules (tests/suite_plugin.py), each shown on a small suite of its own run by pytester
in a separate pytest process: grouping broken on purpose fails the run, a Dagster context leaked by
one test does not break the next, a missing tool skips only its tests with one line (and fails them
when GROUNDSKEEPER_NO_SKIPS is set)."""

from __future__ import annotations

import pytest

from tests import assert_counts
from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # each test starts pytest (and some, two xdist workers) in a subprocess

GROUPED = """
import pytest

pytestmark = pytest.mark.xdist_group("one_cluster")


@pytest.mark.parametrize("n", range(12))
def test_grouped(n):
    pass
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the subprocess imports tests.suite_plugin from here
    monkeypatch.delenv("GROUNDSKEEPER_NO_SKIPS", raising=False)
    return pytester


def _run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "tests.suite_plugin", "-p", "no:cacheprovider", *args)


def test_a_group_split_across_workers_fails_the_run(suite):
    suite.makepyfile(test_grouped=GROUPED)
    result = _run(suite, "-n", "2", "--dist", "load")  # grouping broken on purpose: plain load balancing
    result.stdout.fnmatch_lines(["*GROUPING BROKEN: the tests of xdist_group 'one_cluster' ran on 2 workers*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert result.parseoutcomes()["passed"] == 12  # every test passed: the guard alone failed the run


def test_a_group_kept_on_one_worker_passes(suite):
    suite.makepyfile(test_grouped=GROUPED)
    result = _run(suite, "-n", "2", "--dist", "loadgroup")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert "GROUPING BROKEN" not in result.stdout.str()


LEAK = """
import gc

import dagster as dg
from dagster._core.execution.context.init import build_init_resource_context

gc.disable()  # the collector runs only where these tests say, not at a random allocation between them


def test_leaves_a_context_in_a_reference_cycle():
    with dg.instance_for_test():
        box = [build_init_resource_context()]  # enters an ephemeral instance; exits in __del__
        box.append(box)  # a cycle: only the cyclic collector frees it, whenever it runs


def test_the_next_test_resolves_definitions():
    with dg.instance_for_test():
        gc.collect()  # the collector runs in the middle of this test, as it may at any allocation
        dg.Definitions(assets=[]).resolve_all_job_defs()
"""


def test_a_dagster_context_leaked_by_one_test_does_not_break_the_next(suite):
    suite.makepyfile(test_leak=LEAK)
    result = _run(suite)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=2)


def test_without_the_plugin_the_leak_breaks_the_next_test(suite):
    """The reproduction behind the rule: the same two tests, without the plugin."""
    suite.makepyfile(test_leak=LEAK)
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*undefined DagsterInstance weakref*"])


NEEDS_A_TOOL = """
import pytest

import tests.suite_plugin as plugin

plugin.PREREQUISITES["needs_tool"] = (
    plugin.Prerequisite("frobnicator", "apt-get install frobnicator", lambda: False),
)


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_tool: uses the frobnicator")
"""

TOOL_TESTS = """
import pytest


@pytest.mark.needs_tool
def test_uses_the_tool():
    pass


def test_needs_nothing():
    pass
"""


def test_a_missing_tool_skips_only_its_tests_with_one_line(suite):
    suite.makeconftest(NEEDS_A_TOOL)
    suite.makepyfile(test_tools=TOOL_TESTS)
    result = _run(suite)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=1, skipped=1)
    line = "SKIPPED 1 test(s) whose tools are missing: 1 test(s) for lack of frobnicator (install: apt-get install {})"
    result.stdout.fnmatch_lines([line.format("frobnicator")])


def test_in_ci_a_missing_tool_fails_its_tests_and_the_run(suite, monkeypatch):
    monkeypatch.setenv("GROUNDSKEEPER_NO_SKIPS", "1")
    suite.makeconftest(NEEDS_A_TOOL)
    suite.makepyfile(test_tools=TOOL_TESTS + "\n\ndef test_skips_itself():\n    pytest.skip('any reason')\n")
    result = _run(suite)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, errors=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*missing prerequisite: frobnicator*GROUNDSKEEPER_NO_SKIPS is set*",
            "*1 test(s) skipped while GROUNDSKEEPER_NO_SKIPS is set: CI runs every test*",
        ]
    )


# ---------------------------------------------------------------- asserts that check less than they seem


def test_no_chained_assert_and_no_success_assert_on_a_run_that_raises():
    """(a) and (b) of tests/assert_counts.py: none outside their justification lists."""
    bad = assert_counts.unjustified(assert_counts.count())
    assert bad["chained asserts"] == [], "one assert per fact:\n" + "\n".join(bad["chained asserts"])
    assert bad["redundant success asserts"] == [], "the run raises on failure already:\n" + "\n".join(
        bad["redundant success asserts"]
    )


def test_the_test_files_import_dagster_internals_only_where_no_public_api_does_it():
    """(d): each test file importing ``dagster._...`` or ``dagster_shared`` is listed with its reason."""
    counts = assert_counts.count()
    assert assert_counts.unjustified(counts)["test files importing Dagster internals"] == []
    stale = sorted(set(assert_counts.ALLOWED_PRIVATE_DAGSTER) - set(counts.private_dagster))
    assert stale == [], "listed but no longer importing Dagster's internals: drop them from the list"


COUNTED = """
import dagster as dg
from dagster._core.utils import make_new_run_id


def helper(job):
    return job.execute_in_process()


def test_sample(job, runs):
    result = job.execute_in_process()
    assert result.success
    assert result.success and runs
    assert job.execute_in_process(run_config={}).success
    assert helper(job).success
    assert dg.materialize([]).success
    lenient = job.execute_in_process(raise_on_error=False)
    assert lenient.success
    assert runs
    assert runs[0]
    assert not runs
    assert len(runs) == 2
    assert any(runs)
"""


def test_the_counts_find_each_kind_and_only_it():
    counts = assert_counts.Counts()
    assert_counts.count_source(COUNTED, "tests/test_sample.py", counts)
    assert [line for _, _, line in counts.chained] == [13]
    assert [line for _, _, line in counts.redundant_success] == [12, 14, 15, 16]
    assert [line for _, _, line in counts.bare_truthiness] == [12, 14, 15, 16, 18, 19, 20]  # not 21, 22, 23
    assert counts.private_dagster == {"tests/test_sample.py": ["dagster._core.utils"]}
