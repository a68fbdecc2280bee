"""A parameter with choices is an enum in the job's config schema, so Dagster's own config
validation (the Launchpad, ``dagster job execute``) refuses a value outside them before a run
starts, instead of accepting it and failing the run."""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster_graphql.test.utils import execute_dagster_graphql

import pipelines
from pipelines.common.defs.config import config_schema
from pipelines.common.params import _META, ParamSpec, param, specs
from pipelines.definitions import build_definitions, defs
from pipelines.fleet.housekeeping import TASKS

ROOT = Path(__file__).resolve().parent.parent
RECLAIM = {"tableName": "AgendaProgress", "idFieldName": "id", "timeFieldName": "updatedTime"}


@pytest.fixture
def agenda_env(monkeypatch):
    """The reclaim job's resources read their tables from the environment."""
    monkeypatch.setenv("AGENDA_PROGRESS_TABLE", "AgendaProgress")
    monkeypatch.setenv("AGENDA_READY_TABLE", "AgendaReady")


def _refusal(job_name: str, run_config: dict) -> str:
    with pytest.raises(dg.DagsterInvalidConfigError) as caught:
        dg.validate_run_config(defs.resolve_job_def(job_name), run_config)
    return str(caught.value)


def test_dagster_refuses_a_reclaim_action_outside_its_choices():
    message = _refusal("reclaim_agendas", {**RECLAIM, "reclaimAction": "explode"})
    assert "root:reclaimAction not in enum type ReclaimParams_reclaimAction got explode" in message


def test_dagster_refuses_a_dead_letter_queue_outside_its_choices():
    message = _refusal("redrive_dead_letters", {"queue": "everything"})
    assert "root:queue not in enum type RedriveSettings_queue got everything" in message


def test_dagster_refuses_a_zombie_action_outside_its_choices():
    message = _refusal("collect_zombies", {"namespace": "default/default", "action": "kill"})
    assert "root:action not in enum type CollectParams_action got kill" in message


def test_dagster_refuses_a_housekeeping_task_outside_the_tasks():
    message = _refusal("housekeeping", {"task_type": "stale-ssm", "params": {"dryRun": True}})
    assert "root:task_type not in enum type HousekeepingJobRequest_task_type got stale-ssm" in message


def test_the_housekeeping_jobs_task_types_are_the_tasks():
    fields = defs.resolve_job_def("housekeeping").config_mapping.config_schema.config_type.fields
    assert _type(fields, "task_type").config_values == [task.name for task in TASKS]


@pytest.mark.parametrize("action", ["fail", "retry"])
def test_dagster_accepts_each_reclaim_action(agenda_env, action):
    config = dg.validate_run_config(defs.resolve_job_def("reclaim_agendas"), {**RECLAIM, "reclaimAction": action})
    assert config["ops"]["plan_reclaim"]["config"]["reclaimAction"] == action


def test_an_unset_choice_keeps_its_default(agenda_env):
    config = dg.validate_run_config(defs.resolve_job_def("reclaim_agendas"), RECLAIM)
    assert config["ops"]["plan_reclaim"]["config"]["reclaimAction"] == "fail"


@pytest.mark.parametrize("path", ["docs/examples/pop_reclaim_sample.json", "tests/data/pop_reclaim_sample.json"])
def test_pops_json_is_still_valid_run_config(agenda_env, path):
    raw = json.loads((ROOT / path).read_text())
    config = dg.validate_run_config(defs.resolve_job_def("reclaim_agendas"), raw)
    assert config["ops"]["plan_reclaim"]["config"]["tableName"] == raw["tableName"]


@dataclasses.dataclass(frozen=True)
class _Old:
    mode: str = param("a", description="A mode.", choices=("a", "b"), aliases=("Mode",))
    level: str | None = param(None, description="A level.", choices=("low", "high"))


def _type(schema: dict, key: str):
    kind = schema[key].config_type
    return kind.inner_type if isinstance(kind, dg.Noneable) else kind


def test_an_old_name_of_a_choices_field_is_the_same_enum():
    schema = config_schema(_Old)
    assert _type(schema, "Mode") is _type(schema, "mode")


def test_an_optional_choices_field_still_takes_null():
    schema = config_schema(_Old)
    assert isinstance(schema["level"].config_type, dg.Noneable)


def test_the_same_declaration_makes_the_same_enum_object():
    assert _type(config_schema(_Old), "mode") is _type(config_schema(_Old), "mode")


def test_a_declaration_with_the_same_field_name_gets_its_own_enum():
    @dataclasses.dataclass(frozen=True)
    class _Other:
        mode: str = param("x", description="Another mode.", choices=("x", "y"))

    assert _type(config_schema(_Other), "mode").given_name != _type(config_schema(_Old), "mode").given_name


def test_two_declarations_cannot_share_an_enum_name_with_other_choices():
    config_schema(_Old)
    other = dataclasses.make_dataclass(  # the same class name, other choices
        "_Old", [("mode", str, param("c", description="A mode.", choices=("c", "d")))], frozen=True
    )
    with pytest.raises(TypeError, match="_Old_mode"):
        config_schema(other)


# --- the Launchpad's check: the webserver's GraphQL isPipelineConfigValid ---------------------

VALIDATE = """
query Validate($selector: PipelineSelector!, $runConfigData: RunConfigData!) {
  isPipelineConfigValid(pipeline: $selector, mode: "default", runConfigData: $runConfigData) {
    __typename
    ... on RunConfigValidationInvalid { errors { message path } }
  }
}
"""


@pytest.fixture(scope="module")
def launchpad():
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(module_name="pipelines.definitions", attribute="defs"), location_name="groundskeeper"
    )
    with dg.instance_for_test() as instance:
        with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as process:
            yield process.create_request_context()


def _validate(context, run_config: dict) -> dict:
    selector = {"repositoryLocationName": "groundskeeper", "repositoryName": "__repository__"}
    selector["pipelineName"] = "reclaim_agendas"
    result = execute_dagster_graphql(context, VALIDATE, {"selector": selector, "runConfigData": run_config})
    return result.data["isPipelineConfigValid"]


def test_the_launchpad_refuses_a_reclaim_action_outside_its_choices(launchpad):
    answer = _validate(launchpad, {**RECLAIM, "reclaimAction": "explode"})
    assert answer["__typename"] == "RunConfigValidationInvalid"
    assert any("reclaimAction" in error["message"] for error in answer["errors"])


def test_the_launchpad_accepts_pops_json(launchpad, agenda_env):
    raw = json.loads((ROOT / "docs/examples/pop_reclaim_sample.json").read_text())
    assert _validate(launchpad, raw)["__typename"] == "PipelineConfigValidationValid"


# --- every choices field of every declaration of the code location is an enum ---------------


def _declarations() -> list[type]:
    """The parameter dataclasses of the product's modules (those whose fields are all params)."""
    found = []
    for info in pkgutil.walk_packages(pipelines.__path__, "pipelines."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if not (isinstance(value, type) and dataclasses.is_dataclass(value)) or value.__module__ != info.name:
                continue
            fields = dataclasses.fields(value)
            if fields and all(_META in f.metadata for f in fields):
                found.append(value)
    return found


def _schemas(job: dg.JobDefinition) -> list[tuple[str, dict]]:
    """(where, fields) for the field maps a user fills in: the flat keys of a config mapping
    (where = the job), and each op's own (where = the op)."""
    out = []
    if job.config_mapping is not None:
        out.append((job.name, job.config_mapping.config_schema.config_type.fields))
    for name, node in job.graph.node_dict.items():
        schema = node.definition.config_schema
        if schema is not None and hasattr(schema.config_type, "fields"):
            out.append((f"{job.name}.{name}", schema.config_type.fields))
    return out


def _choices_in_jobs() -> list[tuple[str, str, ParamSpec, dict]]:
    """(where, class, spec, fields) for each choices field of a declaration that a job's schema
    carries (its key with its description): the declarations of the code location."""
    prod = build_definitions("prod")
    out = []
    declarations = _declarations()
    for job in prod.resolve_all_job_defs():
        for where, fields in _schemas(job):
            for cls in declarations:
                declared = specs(cls)
                if not any(s.name in fields and fields[s.name].description == s.describe() for s in declared):
                    continue
                out.extend((where, cls.__name__, s, fields) for s in declared if s.choices)
    return out


CHOICES = _choices_in_jobs()


def test_the_code_location_has_choices_fields_to_check():
    assert {(where, spec.name) for where, _, spec, _ in CHOICES} >= {
        ("reclaim_agendas", "reclaimAction"),
        ("reclaim_agendas.plan_reclaim", "reclaimAction"),
        ("collect_zombies", "action"),
        ("redrive_dead_letters", "queue"),
        ("housekeeping", "task_type"),
    }


@pytest.mark.parametrize(
    ("where", "owner", "spec", "fields"), CHOICES, ids=[f"{w}.{o}.{s.name}" for w, o, s, _ in CHOICES]
)
def test_every_choices_field_is_an_enum_of_its_choices(where, owner, spec, fields):
    for key in (spec.name, *spec.aliases):
        kind = _type(fields, key)
        assert isinstance(kind, dg.Enum), f"{where}: {key} is {kind.given_name or kind.kind}, not an enum"
        assert kind.config_values == list(spec.choices), f"{where}: {key} takes {kind.config_values}"
