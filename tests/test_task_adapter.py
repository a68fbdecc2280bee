"""The one adapter of the task contract (``pipelines.common.defs.tasks``), over every task that runs
as a job of its own (``pipelines.tasks.TASKS``): its job, its run config, its failures, its run
summary and its schedule; and every task's parameters are read through their declaration only."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import dagster as dg
import pytest

from pipelines.common import summary
from pipelines.common.defs.tasks import task_job, task_schedule
from pipelines.common.looks import Look
from pipelines.common.params import specs
from pipelines.definitions import defs
from pipelines.tasks import TASKS

ROOT = Path(__file__).resolve().parent.parent
IDS = [task.name for task in TASKS]
EXAMPLES = {"namespace": "default/default"}
"""A value for each required parameter of a registered task."""
RESULT = {"errored": 2, "retried": 1, "found": 3}
"""What the test's pass returns: the figures the registered tasks' counters read."""


class _Client:
    """Any client a task names; the test's passes and looks never call it. A ``cloudwatch`` of this
    kind has no metrics sink."""

    metrics_sink = "none"


def _clients(names) -> dict[str, _Client]:
    return {name: _Client() for name in names}


def _config(task) -> dict:
    return {spec.name: EXAMPLES[spec.name] for spec in specs(task.params) if spec.required}


def _run(task, run, instance=None):
    job = task_job(dataclasses.replace(task, run=run), dg.in_process_executor)
    return job.execute_in_process(
        run_config=_config(task),
        resources=_clients(task.clients),
        instance=instance or dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def _failure_message(result) -> str:
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    return failure.event_specific_data.error.message.strip()


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_the_code_location_has_the_task_s_job_by_its_name(task):
    assert defs.resolve_job_def(task.job).name == task.job


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_the_job_runs_the_task_as_its_one_op(task):
    job = defs.resolve_job_def(task.job)
    assert [node.name for node in job.graph.nodes] == [task.op]


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_the_job_carries_the_task_s_tags(task):
    tags = defs.resolve_job_def(task.job).tags
    assert {key: tags.get(key) for key in task.tags} == dict(task.tags)


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_the_run_config_is_exactly_the_declared_parameters(task):
    fields = defs.resolve_job_def(task.job).config_mapping.config_schema.config_type.fields
    declared = {name for spec in specs(task.params) for name in (spec.name, *spec.aliases)}
    assert set(fields) == declared


CHOICES = [(task, spec) for task in TASKS for spec in specs(task.params) if spec.choices]


@pytest.mark.parametrize("task,spec", CHOICES, ids=[f"{t.name}.{s.name}" for t, s in CHOICES])
def test_a_choice_outside_the_declared_ones_is_refused_before_launch(task, spec):
    with pytest.raises(dg.DagsterInvalidConfigError, match=f"{task.params.__name__}_{spec.name}"):
        dg.validate_run_config(defs.resolve_job_def(task.job), {**_config(task), spec.name: "no-such-choice"})


def test_some_registered_task_has_choices():
    assert CHOICES


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_a_pass_that_raises_fails_the_run_with_one_line(task):
    def broken(*_):
        raise RuntimeError("the pass broke")

    message = _failure_message(_run(task, broken))
    assert message.endswith(": RuntimeError: the pass broke")
    assert len(message.splitlines()) == 1


FAILURES = [(task, error) for task in TASKS for error in task.failures]


@pytest.mark.parametrize("task,error", FAILURES, ids=[f"{t.name}.{e.__name__}" for t, e in FAILURES])
def test_a_declared_failure_fails_the_run_with_its_message_alone(task, error):
    def broken(*_):
        raise error("what went wrong, in one line")

    assert (
        _failure_message(_run(task, broken)) == "dagster._core.definitions.events.Failure: what went wrong, in one line"
    )


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_a_pass_that_raises_is_not_retried(task):
    def broken(*_):
        raise RuntimeError("the pass broke")

    result = _run(task, broken)
    assert [e.event_type_value for e in result.all_events].count("STEP_UP_FOR_RETRY") == 0


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_the_run_ends_with_its_summary(task):
    instance = dg.DagsterInstance.ephemeral()
    result = _run(task, lambda *_: dict(RESULT), instance)
    params, _ = task.parse(_config(task))
    lines = [r.user_message for r in instance.all_logs(result.run_id) if r.user_message.startswith("summary: ")]
    assert lines == [
        f"summary: {task.what(params)}: " + ", ".join(f"{k}={v}" for k, v in task.counters(RESULT).items())
    ]


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_the_run_is_tagged_with_its_counters(task):
    instance = dg.DagsterInstance.ephemeral()
    result = _run(task, lambda *_: dict(RESULT), instance)
    tags = instance.get_run_by_id(result.run_id).tags
    assert summary.run_counters(tags) == dict(task.counters(RESULT))


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_the_pass_s_result_is_the_op_s_output(task):
    assert _run(task, lambda *_: dict(RESULT)).output_for_node(task.op) == RESULT


SCHEDULED = [task for task in TASKS if task.look is not None]


def _schedule(task, look):
    params, _ = task.parse(_config(task))
    job = task_job(task, dg.in_process_executor)
    looking = dataclasses.replace(task, look=look)
    return task_schedule(looking, job, name="t_schedule", cron="*/5 * * * *", params=params, run_config=_config(task))


@pytest.mark.parametrize("task", SCHEDULED, ids=[t.name for t in SCHEDULED])
def test_a_schedule_skips_the_tick_when_the_task_s_look_finds_nothing(task):
    schedule = _schedule(task, lambda *_: Look.idle("nothing to collect here"))
    with dg.build_schedule_context(resources=_clients(task.look_clients)) as context:
        data = schedule.evaluate_tick(context)
    assert data.skip_message == "nothing to collect here"


@pytest.mark.parametrize("task", SCHEDULED, ids=[t.name for t in SCHEDULED])
def test_a_schedule_launches_the_task_s_run_config_when_its_look_finds_work(task):
    schedule = _schedule(task, lambda *_: Look.work("two zombies"))
    with dg.build_schedule_context(resources=_clients(task.look_clients)) as context:
        data = schedule.evaluate_tick(context)
    assert [request.run_config for request in data.run_requests] == [_config(task)]


@pytest.mark.parametrize("task", SCHEDULED, ids=[t.name for t in SCHEDULED])
def test_a_schedule_s_look_reads_with_the_look_s_clients_only(task):
    seen = []
    schedule = _schedule(task, lambda run, _request, _params: seen.append(set(run.clients)) or Look.idle("x"))
    with dg.build_schedule_context(resources=_clients(task.look_clients)) as context:
        schedule.evaluate_tick(context)
    assert seen == [set(task.look_clients)]


def test_some_registered_task_has_a_schedule():
    assert SCHEDULED


CONFIG_READERS = {
    Path("pipelines/common/defs/config.py"),  # params_from_config: the declaration's own reader
    Path("pipelines/fleet/defs/jobs.py"),  # runs-fleet's housekeeping message, read by the dispatcher's declarations
}


def _config_reads(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("op_config", "run_config") and _reads(node)
    ]


def _reads(node: ast.Attribute) -> bool:
    """``x.op_config`` / ``x.run_config`` read from a context (not a keyword or a value built here)."""
    return isinstance(node.ctx, ast.Load) and getattr(node.value, "id", "") in ("context", "ctx")


def test_no_run_config_is_read_outside_the_declarations():
    paths = [
        p
        for top in ("pipelines", "resources", "sensors")
        for p in sorted((ROOT / top).rglob("*.py"))
        if p.relative_to(ROOT) not in CONFIG_READERS
    ]
    assert [read for path in paths for read in _config_reads(path)] == []
