"""Every environment variable that ``make dev`` or the code location reads has a row in the
environment table of docs/deployment.md.

The variables are found in the source: string constants shaped like ``NAME_OF_VARIABLE`` passed to
``os.environ.get``/``os.getenv``/``dg.EnvVar`` and the settings readers, used as an
``os.environ[...]`` key, or assigned to a module constant ending in ``_ENV`` (alone, or as the values
of a dict literal: a settings field's variable)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [
    ROOT / "infra" / "local.py",
    *sorted((ROOT / "infra" / "demo").rglob("*.py")),
    *sorted((ROOT / "resources").rglob("*.py")),
    *sorted((ROOT / "pipelines").rglob("*.py")),
    *sorted((ROOT / "sensors").rglob("*.py")),
]
NAME = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
READERS = {"get", "getenv", "EnvVar", "int_env", "bool_env", "date_env", "_optional_env", "checked", "_number"}
MAPPINGS = {"environ", "settings", "env"}


def variables_read(source: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(source)):
        names: list[object] = []
        if isinstance(node, ast.Call):
            fn = node.func
            if (fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")) in READERS:
                names = [a.value for a in node.args if isinstance(a, ast.Constant)]
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            mapping = node.value
            if (mapping.attr if isinstance(mapping, ast.Attribute) else getattr(mapping, "id", "")) in MAPPINGS:
                names = [node.slice.value]
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant | ast.Dict):
            if any(isinstance(t, ast.Name) and t.id.endswith("_ENV") for t in node.targets):
                values = node.value.values if isinstance(node.value, ast.Dict) else [node.value]
                names = [v.value for v in values if isinstance(v, ast.Constant)]
        out.update(n for n in names if isinstance(n, str) and NAME.match(n))
    return out


def documented() -> set[str]:
    """The variables named in the first column of docs/deployment.md's environment table."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    section = text.split("\n## Environment\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split(" | ")[0])}


READ = sorted(set().union(*(variables_read(p.read_text()) for p in SOURCES)))


def test_the_source_reads_variables():
    assert {"AGENDA_ENDPOINT_PORT", "MOTO_PORT", "PROGRESSOR_DSN", "DAGSTER_DEPLOYMENT"} <= set(READ)


@pytest.mark.parametrize("name", READ)
def test_every_variable_read_is_in_the_environment_table(name):
    assert name in documented(), f"{name} is read by the code but has no row in docs/deployment.md#environment"


def test_variables_are_found_in_each_form():
    source = (
        "import os\nFOO_ENV = 'A_ONE'\nos.environ.get('B_TWO')\nos.environ['C_THREE']\n"
        "dg.EnvVar('D_FOUR')\nint_env(problems, 'E_FIVE', 1)\nprint('NOT_READ')\n"
    )
    assert variables_read(source) == {"A_ONE", "B_TWO", "C_THREE", "D_FOUR", "E_FIVE"}
