"""The housekeeping task contract: one list of tasks (``pipelines.fleet.housekeeping.TASKS``), each
task's parameters declared once, and one Dagster adapter that gives each task with a look its
schedule."""

from __future__ import annotations

import ast
import dataclasses
import datetime as dt
from pathlib import Path

import dagster as dg
import pytest

from pipelines.common.params import ParamsError, param, specs
from pipelines.common.task import Task
from pipelines.definitions import build_definitions
from pipelines.fleet import messages
from pipelines.fleet.defs.schedules import DISPATCHER
from pipelines.fleet.housekeeping import TASKS, Housekeeping
from pipelines.fleet.messages import HousekeepingRequest, InvalidMessage
from resources import resources_for
from tests import fleet_support as fs

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("pipelines", "resources", "sensors")
SCHEDULED = [task for task in TASKS if task.look is not None]


def _ids(tasks):
    return [task.name for task in tasks]


def test_the_task_list_names_each_task_once():
    assert sorted(task.name for task in TASKS) == [
        "cost_report",
        "old_jobs",
        "orphaned_instances",
        "pool_audit",
        "stale_ssm",
    ]


@pytest.mark.parametrize("task", TASKS, ids=_ids(TASKS))
def test_the_dispatcher_accepts_exactly_the_declared_parameters_of_each_task(task):
    declared = {spec.name for spec in specs(task.params)}
    for name in declared:
        spec = next(s for s in specs(task.params) if s.name == name)
        request = Housekeeping().parse({"task_type": task.name, "params": {name: spec.default}})
        assert request.task_params == {name: spec.default}
    with pytest.raises(InvalidMessage, match=f"unknown parameter\\(s\\) for {task.name}: undeclared"):
        Housekeeping().parse({"task_type": task.name, "params": {"undeclared": 1}})


@pytest.mark.parametrize("task", TASKS, ids=_ids(TASKS))
def test_each_task_parameter_is_validated_by_its_declaration_with_one_line(task):
    for spec in specs(task.params):
        bad = spec.maximum + 1 if spec.maximum is not None else "not-a-value"
        with pytest.raises(InvalidMessage, match=f"^{spec.name} must be "):
            Housekeeping().parse({"task_type": task.name, "params": {spec.name: bad}})


def _task_rows() -> dict[str, str]:
    text = (ROOT / "docs/fleet.md").read_text()
    section = text[text.index("### Housekeeping") : text.index("### Redrive dead letters")]
    return {task.name: row for task in TASKS for row in section.splitlines() if row.startswith(f"| `{task.name}` |")}


@pytest.mark.parametrize("task", TASKS, ids=_ids(TASKS))
def test_the_fleet_page_lists_each_task_with_its_declared_parameters(task):
    row = _task_rows().get(task.name, "")
    for spec in specs(task.params):
        assert f"`{spec.name}`" in row
        assert f"({spec.default};" in row
        assert f"{spec.minimum:g} to {spec.maximum:g})" in row


def test_an_unknown_task_is_refused_with_the_known_ones():
    with pytest.raises(InvalidMessage, match="^unknown task_type 'defragment'; known: orphaned_instances, stale_ssm, "):
        Housekeeping().parse({"task_type": "defragment"})


def _param_reads(path: Path) -> list[str]:
    """``int_param(...)`` calls and ``<x>.params[...]`` / ``<x>.params.get(...)`` reads in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "int_param":
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: int_param(")
        target = node.value if isinstance(node, ast.Subscript) else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target = node.func.value
        if isinstance(target, ast.Attribute) and target.attr == "params":
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .params read")
    return found


def test_no_task_parameter_is_read_around_its_declaration():
    """Task parameters are read through their task's declaration only; the housekeeping request
    itself (``messages.py``) reads runs-fleet's common ``now`` and ``dryRun``."""
    allowed = {ROOT / "pipelines/fleet/messages.py"}
    paths = [p for top in PRODUCT for p in sorted((ROOT / top).rglob("*.py")) if p not in allowed]
    assert [read for path in paths for read in _param_reads(path)] == []


def test_a_task_with_a_look_needs_its_cron_and_the_clients_of_its_pass():
    @dataclasses.dataclass(frozen=True)
    class Nothing:
        days: int = param(1, description="Days.", minimum=1, maximum=2)

    with pytest.raises(ValueError, match="a look, its cron and what it looks at go together"):
        Task(name="t", params=Nothing, run=print, clients=(), look=print)
    with pytest.raises(ValueError, match="the look's clients"):
        Task(
            name="t",
            params=Nothing,
            run=print,
            clients=("s3",),
            look=print,
            look_clients=("ec2",),
            cron="* * * * *",
            looks_at="x",
        )
    with pytest.raises(ParamsError, match="^days must be at most 2, got 3$"):
        Task(name="t", params=Nothing, run=print, clients=()).parse({"days": 3})


# ---------------------------------------------------------------- the Dagster adapter


@pytest.fixture(scope="module")
def defs():
    return build_definitions("prod")


@pytest.mark.parametrize("task", SCHEDULED, ids=_ids(SCHEDULED))
def test_the_adapter_gives_each_task_its_schedule_with_its_cron_and_the_look_clients(defs, task):
    schedule = defs.resolve_schedule_def(f"housekeeping_{task.name}_schedule")
    assert schedule.job_name == "housekeeping"
    assert schedule.cron_schedule == task.cron
    assert set(schedule.required_resource_keys) == {"fleet", *task.look_clients}
    assert task.looks_at in schedule.description


@pytest.mark.parametrize("task", SCHEDULED, ids=_ids(SCHEDULED))
def test_the_adapter_skips_a_tick_with_the_tasks_own_look(aws, defs, task, monkeypatch):
    """Nothing to do on an empty fleet: the tick skips with what the task's look says."""
    at = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    monkeypatch.setattr(messages, "utcnow", lambda: at)  # one clock for the tick and the direct look
    context = dg.build_schedule_context(resources=resources_for("local"), scheduled_execution_time=at)
    result = defs.resolve_schedule_def(f"housekeeping_{task.name}_schedule").evaluate_tick(context)
    request = HousekeepingRequest(task_type=task.name, timestamp=at.isoformat())
    params, _ = DISPATCHER.params(request)
    expected = task.look(fs.context(aws), request, params)
    assert result.skip_message == expected.reason


@pytest.mark.parametrize("task", TASKS, ids=_ids(TASKS))
def test_the_housekeeping_runs_give_each_task_the_clients_of_its_pass(defs, task):
    for job_name, op_name in (("housekeeping", "run_housekeeping_task"), ("process_housekeeping_queue", None)):
        nodes = defs.resolve_job_def(job_name).graph.node_dict
        op = nodes[op_name] if op_name else next(iter(nodes.values()))
        assert set(task.clients) <= set(op.definition.required_resource_keys), job_name


def test_only_tasks_with_a_look_have_a_schedule(defs):
    names = {s.name for s in defs.schedules if s.name.startswith("housekeeping_")}
    assert names == {f"housekeeping_{task.name}_schedule" for task in SCHEDULED}


INT_TASKS = [task for task in TASKS if any(spec.kind is int for spec in specs(task.params))]


@pytest.mark.parametrize("task", INT_TASKS, ids=_ids(INT_TASKS))
def test_a_null_parameter_is_its_default_and_a_whole_float_its_number_as_messages_always_were(task):
    spec = next(s for s in specs(task.params) if s.kind is int)
    from_null, _ = task.parse({spec.name: None})
    assert getattr(from_null, spec.name) == spec.default
    from_float, _ = task.parse({spec.name: float(spec.default)})
    assert getattr(from_float, spec.name) == spec.default
    with pytest.raises(ParamsError):
        task.parse({spec.name: spec.default + 0.5})
