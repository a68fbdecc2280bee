"""The dependency rule, checked on the source (every import statement, also those inside functions).

- A capability (a subpackage of ``pipelines`` other than ``common`` and ``retry``) imports no
  other capability: only ``resources``, ``pipelines.common`` and the retry library. The wiring
  between capabilities is in ``pipelines/definitions.py``.
- The demo is ``make dev``'s alone (``infra/demo``, a dev-only package): nothing in the product, nor
  the rest of ``infra`` but ``infra/local.py``, imports it; its traffic modules are plain (no
  Dagster), its Dagster layer is ``infra/demo/defs.py`` and its code location
  ``infra/demo/definitions.py``.
- ``pipelines.common`` and the retry library import no capability and nothing from ``sensors``.
- ``pipelines`` never imports ``sensors`` (the top-level sensors span capabilities and are wired
  in ``pipelines/definitions.py``), so there is no cycle between the two.
- Dagster is imported only by Dagster layers: ``defs`` modules (``defs.py``, or a module in a
  ``defs/`` subpackage), the top-level ``sensors`` and ``resources`` packages,
  ``pipelines/definitions.py`` and its command-line entry ``pipelines/cli.py``. A module is a
  Dagster layer by where it is, not by its name: a ``checks.py`` or ``jobs.py`` outside ``defs/`` is
  plain. Everything else is plain Python over boto3 clients.
- ``infra/`` (the local stack, the cluster profile, deployment helpers) is tooling around the code
  location: nothing in ``pipelines``, ``resources`` or ``sensors`` imports it.
- ``pipelines/definitions.py`` only merges: it imports the capabilities' (and the foundations')
  ``build_defs``, ``resources`` and the top-level ``sensors``, and of the rest of the product only
  what it passes to them per deployment (:data:`DEFINITIONS_ALSO`).
- The pool audit is the fleet's: nothing outside ``pipelines/fleet`` (in the product or ``infra``)
  imports ``pipelines.fleet.pool_audit``.
- Dagster's internals (``dagster._...``, ``dagster_shared``) are imported nowhere in the product
  or ``infra``, but for the backfill import of the redrive job and the cluster executor's one-line
  run failure (each with its reason beside it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOUNDATIONS = {"common", "retry"}
DEMO_PACKAGE = ROOT / "infra" / "demo"
DEMO_LAYERS = {"defs.py", "definitions.py"}
DEMO_IMPORTERS = {Path("infra/local.py")}
"""Besides the dev package itself, the one module that imports it: ``make dev``'s launcher."""
DEFINITIONS_ALSO = {
    ("pipelines.common.defs.executors", ("celery_fan_out_executor",)),
    ("pipelines.common.defs.metadata", ("CheckNotes",)),
    ("pipelines.common.targets", ("targets_path",)),
    ("pipelines.progressor.targets", ("TARGETS_ENV",)),
    ("pipelines.reclaim.targets", ("TARGETS_ENV",)),
}
"""What ``pipelines/definitions.py`` imports of the product besides ``build_defs``: the values it
decides per deployment (the cluster's executor, the targets files' variables) and their types."""
DAGSTER_ENTRY_POINTS = {Path("pipelines/definitions.py"), Path("pipelines/cli.py")}
PRODUCT_PACKAGES = ("pipelines", "resources", "sensors")
LAYER_NAMES = {"jobs.py", "sensors.py", "schedules.py", "checks.py", "assets.py"}
DEFINITIONS = ROOT / "pipelines/definitions.py"
ALLOWED_PRIVATE_DAGSTER = {
    ("pipelines/redrive/defs.py", "dagster._core.execution"),
}
"""The private Dagster imports, each with its reason beside it: Dagster has no public API to launch an
asset backfill from code."""


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _capabilities() -> list[str]:
    return sorted(
        p.name for p in (ROOT / "pipelines").iterdir() if (p / "__init__.py").exists() and p.name not in FOUNDATIONS
    )


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _is_dagster_layer(path: Path) -> bool:
    rel = path.relative_to(ROOT)
    return (
        rel.parts[0] in {"sensors", "resources"}
        or rel in DAGSTER_ENTRY_POINTS
        or path.name == "defs.py"
        or "defs" in rel.parts[:-1]
    )


def test_there_are_capabilities_to_check():
    assert {"reclaim", "fleet", "batching"} <= set(_capabilities())


def _imports_of_packages_or_sensors(package: str, packages: set[str]) -> list[str]:
    """``path imports name`` for each import in ``package`` of one of ``packages`` (or below
    them) or of the top-level ``sensors``."""
    return [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules(package)
        for name in _imports(path)
        if any(name == p or name.startswith(p + ".") for p in packages) or name.split(".")[0] == "sensors"
    ]


@pytest.mark.parametrize("capability", _capabilities())
def test_a_capability_imports_no_other_capability(capability):
    others = {f"pipelines.{c}" for c in _capabilities() if c != capability}
    offending = _imports_of_packages_or_sensors(f"pipelines/{capability}", others)
    assert not offending, "\n".join(offending)


def _demo_modules() -> list[Path]:
    return sorted(DEMO_PACKAGE.rglob("*.py"))


def test_only_make_devs_launcher_imports_the_dev_package():
    offending = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _product_and_infra_modules()
        if not path.is_relative_to(DEMO_PACKAGE) and path.relative_to(ROOT) not in DEMO_IMPORTERS
        for name in _imports(path)
        if name == "infra.demo" or name.startswith("infra.demo.")
    ]
    assert not offending, "\n".join(offending)


@pytest.mark.parametrize("path", [p for p in _demo_modules() if p.name not in DEMO_LAYERS], ids=lambda p: p.name)
def test_the_demo_traffic_modules_are_plain(path):
    offending = [
        name for name in _imports(path) if name.split(".")[0].startswith("dagster") or "defs" in name.split(".")
    ]
    assert not offending, f"{path.relative_to(ROOT)} imports {offending}"


@pytest.mark.parametrize("foundation", sorted(FOUNDATIONS))
def test_the_foundations_import_no_capability_and_no_sensors(foundation):
    capabilities = {f"pipelines.{c}" for c in _capabilities()}
    offending = _imports_of_packages_or_sensors(f"pipelines/{foundation}", capabilities)
    assert not offending, "\n".join(offending)


def _product_imports(where=lambda path: True, what=lambda name: True) -> list[str]:
    """``path imports name`` for each product module ``where`` accepts and each import ``what`` accepts."""
    return [
        f"{path.relative_to(ROOT)} imports {name}"
        for package in PRODUCT_PACKAGES
        for path in _modules(package)
        if where(path)
        for name in _imports(path)
        if what(name)
    ]


def test_only_dagster_layers_import_dagster():
    offending = _product_imports(lambda path: not _is_dagster_layer(path), lambda name: name.startswith("dagster"))
    assert not offending, "\n".join(offending)


def test_the_retry_library_modules_import_no_dagster_helpers():
    offending = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules("pipelines/retry")
        if path.name != "defs.py"
        for name in _imports(path)
        if name.startswith("pipelines.common.defs")
    ]
    assert not offending, "\n".join(offending)


def test_the_product_never_imports_the_tooling_in_infra():
    offending = _product_imports(what=lambda name: name.split(".")[0] == "infra")
    assert not offending, "\n".join(offending)


def test_a_module_named_like_a_dagster_layer_outside_defs_counts_as_plain():
    assert not _is_dagster_layer(ROOT / "pipelines/fleet/pool_audit/checks.py")
    assert not _is_dagster_layer(ROOT / "pipelines/fleet/jobs.py")
    assert _is_dagster_layer(ROOT / "pipelines/fleet/defs/jobs.py")
    assert _is_dagster_layer(ROOT / "pipelines/batching/defs.py")


def _named_like_layers_outside_defs() -> list[Path]:
    return [
        path
        for package in PRODUCT_PACKAGES
        for path in _modules(package)
        if path.name in LAYER_NAMES and not _is_dagster_layer(path)
    ]


def test_there_are_plain_modules_named_like_dagster_layers():
    assert ROOT / "pipelines/fleet/pool_audit/checks.py" in _named_like_layers_outside_defs()


@pytest.mark.parametrize("path", _named_like_layers_outside_defs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_plain_module_named_like_a_dagster_layer_imports_no_dagster(path):
    offending = [name for name in _imports(path) if name.split(".")[0].startswith("dagster")]
    assert not offending, f"{path.relative_to(ROOT)} imports {offending}"


def _import_froms(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of each import statement (``import x`` gives ``(x, [])``)."""
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append(("." * node.level + (node.module or ""), [alias.name for alias in node.names]))
    return out


def test_the_definitions_only_merge_build_defs_resources_and_sensors():
    offending = []
    for module, names in _import_froms(DEFINITIONS):
        top = module.split(".")[0]
        if module in {"__future__", "collections.abc", "dataclasses", "pathlib", "dagster"}:
            continue
        if top in {"resources", "sensors"} or (module, tuple(names)) in DEFINITIONS_ALSO:
            continue
        parts = module.split(".")
        if len(parts) == 3 and parts[0] == "pipelines" and parts[2] == "defs" and names == ["build_defs"]:
            continue
        offending.append(f"{module}: {names}")
    said = "pipelines/definitions.py may import only build_defs, resources, sensors and DEFINITIONS_ALSO:\n"
    assert not offending, said + "\n".join(offending)


def _product_and_infra_modules() -> list[Path]:
    return [path for package in (*PRODUCT_PACKAGES, "infra") for path in _modules(package)]


def test_nothing_outside_the_fleet_imports_the_pool_audit():
    fleet = ROOT / "pipelines/fleet"
    offending = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _product_and_infra_modules()
        if fleet not in path.parents
        for name in _imports(path)
        if name == "pipelines.fleet.pool_audit" or name.startswith("pipelines.fleet.pool_audit.")
    ]
    assert not offending, "\n".join(offending)


def test_dagster_internals_are_imported_only_where_no_public_api_exists():
    found = {
        (str(path.relative_to(ROOT)), name)
        for path in _product_and_infra_modules()
        for name in _imports(path)
        if name.split(".")[0] == "dagster_shared" or name.startswith("dagster._")
    }
    assert found == ALLOWED_PRIVATE_DAGSTER
    redrive = (ROOT / "pipelines/redrive/defs.py").read_text()
    assert "no public API to launch an asset backfill" in redrive  # the reason, beside the import
