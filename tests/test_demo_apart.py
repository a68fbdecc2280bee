"""The demo is make dev's alone: the deployment is decided once, in ``pipelines/definitions.py``;
production's definitions and image hold nothing of the dev package (``infra/demo``)."""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEV_PACKAGE = "infra/demo"
DECIDES_THE_DEPLOYMENT = {Path("pipelines/definitions.py")}
"""Of the product outside ``resources/``, the one module that may take or ask for the deployment."""


def _deployment_uses(path: Path) -> list[str]:
    """``path:line what`` for each function or method with a ``deployment`` parameter and each call
    of ``deployment_name()`` in ``path``."""
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            a = node.args
            names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if p is not None]
            if "deployment" in names:
                found.append(f"{where}:{node.lineno} {getattr(node, 'name', 'lambda')}(deployment)")
        elif isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called == "deployment_name":
                found.append(f"{where}:{node.lineno} calls deployment_name()")
    return found


def _product_outside_the_decision() -> list[Path]:
    return [
        path
        for package in ("pipelines", "sensors")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT) not in DECIDES_THE_DEPLOYMENT
    ]


def test_the_check_sees_a_deployment_parameter_and_a_deployment_name_call(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f(x, *, deployment):\n    return deployment_name()\n")
    assert _deployment_uses(sample) == ["sample.py:1 f(deployment)", "sample.py:2 calls deployment_name()"]


def test_only_the_definitions_and_resources_take_or_ask_for_the_deployment():
    offending = [line for path in _product_outside_the_decision() for line in _deployment_uses(path)]
    assert not offending, "\n".join(offending)


def test_the_definitions_decide_the_deployment_once():
    uses = _deployment_uses(ROOT / "pipelines" / "definitions.py")
    assert [use.split(" ", 1)[1] for use in uses] == ["build_definitions(deployment)", "calls deployment_name()"]


@pytest.mark.cli
def test_prod_definitions_hold_no_demo_and_load_no_module_of_the_dev_package():
    from infra.demo.definitions import build_local_definitions
    from pipelines.definitions import build_definitions

    local, bare = build_local_definitions({}), build_definitions("local")
    demo = {
        "jobs": {j.name for j in local.resolve_all_job_defs()} - {j.name for j in bare.resolve_all_job_defs()},
        "schedules": {s.name for s in local.schedules} - {s.name for s in bare.schedules},
        "sensors": {s.name for s in local.sensors} - {s.name for s in bare.sensors},
    }
    assert {"demo_traffic", "progressor_demo_traffic"} <= demo["jobs"]
    assert {"demo_traffic_schedule", "progressor_demo_traffic_schedule"} <= demo["schedules"]
    assert demo["sensors"] == {"retry_policies_on_start"}
    code = (
        "import sys, json, pipelines.definitions as d; "
        "print(json.dumps({"
        "'jobs': [j.name for j in d.defs.resolve_all_job_defs()], "
        "'schedules': [s.name for s in d.defs.schedules], "
        "'sensors': [s.name for s in d.defs.sensors], "
        "'dev_modules': sorted(m for m in sys.modules if m == 'infra.demo' or m.startswith('infra.demo.'))}))"
    )
    env = {**os.environ, "DAGSTER_DEPLOYMENT": "prod", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    prod = json.loads(out.stdout.strip().splitlines()[-1])
    for kind in ("jobs", "schedules", "sensors"):
        assert not demo[kind] & set(prod[kind]), kind
    assert prod["dev_modules"] == []


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``path`` out of the build context under ``patterns`` (.dockerignore: the
    last pattern that matches the path or a folder above it decides; ``!`` includes)."""
    ignored = False
    parts = path.split("/")
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern[1:] if negated else pattern
        if any(fnmatch.fnmatchcase("/".join(parts[:n]), glob) for n in range(1, len(parts) + 1)):
            ignored = not negated
    return ignored


def test_the_production_image_leaves_the_dev_package_out():
    lines = (ROOT / "infra" / "Dockerfile.dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    dev_files = [str(p.relative_to(ROOT)) for p in sorted((ROOT / DEV_PACKAGE).rglob("*")) if p.is_file()]
    assert "infra/demo/definitions.py" in dev_files
    assert [f for f in dev_files if not _ignored(f, patterns)] == []
    for needed in ("infra/ecs_instance.py", "infra/dagster.ecs.yaml", "infra/workspace.ecs.yaml", "pipelines/cli.py"):
        assert not _ignored(needed, patterns), needed
    assert _ignored("workspace.yaml", patterns)  # make dev's workspace: it loads the dev package
    dockerfile = (ROOT / "infra" / "Dockerfile").read_text()
    copies = [line.split()[1:-1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    assert not [src for srcs in copies for src in srcs if src.startswith(DEV_PACKAGE) or src == "workspace.yaml"]


def test_the_package_leaves_the_dev_package_out():
    import tomllib

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert any(fnmatch.fnmatchcase("infra.demo", p) for p in find["exclude"])
    assert any(fnmatch.fnmatchcase("infra.demo.defs", p) for p in find["exclude"])
