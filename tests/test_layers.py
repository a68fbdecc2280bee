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
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOUNDATIONS = {"common", "retry"}
DEMO_PACKAGE = ROOT / "infra" / "demo"
DEMO_LAYERS = {"defs.py", "definitions.py"}
DEMO_IMPORTERS = {Path("infra/local.py")}
"""Besides the dev package itself, the one module that imports it: ``make dev``'s launcher."""
DEFINITIONS_ALSO = {
    ("pipelines.common.defs.metadata", ("CheckNotes",)),
    ("pipelines.common.targets", ("targets_path",)),
    ("pipelines.progressor.targets", ("TARGETS_ENV",)),
    ("pipelines.reclaim.targets", ("TARGETS_ENV",)),
}
"""What ``pipelines/definitions.py`` imports of the product besides ``build_defs``: the values it
decides per deployment (the targets files' variables) and their types."""
DAGSTER_ENTRY_POINTS = {Path("pipelines/definitions.py"), Path("pipelines/cli.py")}
PRODUCT_PACKAGES = ("pipelines", "resources", "sensors")
LAYER_NAMES = {"jobs.py", "sensors.py", "schedules.py", "checks.py", "assets.py"}
DEFINITIONS = ROOT / "pipelines/definitions.py"
ALLOWED_PRIVATE_DAGSTER = {
    ("pipelines/redrive/defs.py", "dagster._core.execution"),
    ("resources/settings.py", "dagster._core.errors"),
    ("resources/settings.py", "dagster_shared.error"),
}
"""The private Dagster imports, each with its reason beside it: Dagster has no public API to launch an
asset backfill from code, nor to show a code location's load error without a stack."""


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
    settings = (ROOT / "resources/settings.py").read_text()
    assert "No public API shows a code location's load error without a stack" in settings


def _modules_named_like_run_config() -> list[Path]:
    return [
        path
        for package in PRODUCT_PACKAGES
        for path in _modules(package)
        if path.stem.startswith("param") and path != ROOT / "pipelines/common/params.py"
    ]


def test_there_are_run_config_modules_to_check():
    assert ROOT / "pipelines/reclaim/params.py" in _modules_named_like_run_config()


@pytest.mark.parametrize("path", _modules_named_like_run_config(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_named_params_declares_run_config(path):
    """``params`` means run config: a module named so declares its parameters through
    ``pipelines.common.params`` (runs-fleet's SSM parameters are named for SSM, in ``calls.py``)."""
    assert "pipelines.common.params" in _imports(path)


FOUNDATION_PACKAGES = ("pipelines/common", "pipelines/retry", "resources")


def _classes(paths) -> dict[str, list[str]]:
    """Class name -> the modules (relative paths) that define a class of that name."""
    found: dict[str, list[str]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    return found


def test_a_capability_does_not_reuse_the_name_of_a_foundation_class():
    """One name, one thing: ``Transacted`` is the toolkit's, ``RetryPolicy`` the retry library's."""
    foundations = _classes(path for package in FOUNDATION_PACKAGES for path in _modules(package))
    capabilities = _classes(
        path
        for package in PRODUCT_PACKAGES
        for path in _modules(package)
        if not any(path.is_relative_to(ROOT / foundation) for foundation in FOUNDATION_PACKAGES)
    )
    reused = sorted(
        f"{name}: {capabilities[name]} and {where}" for name, where in foundations.items() if name in capabilities
    )
    assert reused == []


PROJECT_PACKAGES = (*PRODUCT_PACKAGES, "infra")
"""Where an import is followed: the product and the tooling beside it."""


def _module_path(name: str) -> Path | None:
    """The file of module ``name`` in the project (``a/b.py`` or ``a/b/__init__.py``), or None."""
    if name.split(".")[0] not in PROJECT_PACKAGES:
        return None
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def _dotted(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


@functools.cache
def _project_imports(path: Path) -> frozenset[Path]:
    """The project modules that importing ``path`` runs: each module it imports (every import statement,
    also those inside functions; ``from a import b`` is ``a`` and, if it is one, the submodule ``a.b``;
    relative imports resolved), with the packages above each and above ``path`` itself (their
    ``__init__.py`` runs first)."""
    package = _dotted(path).split(".") if path.name == "__init__.py" else _dotted(path).split(".")[:-1]
    names: list[str] = [".".join(package)]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            names += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    found = set()
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            module = _module_path(".".join(parts[:i]))
            if module is not None and module != path:
                found.add(module)
    return frozenset(found)


@functools.cache
def _imports_dagster(path: Path) -> bool:
    return any(name.split(".")[0].startswith("dagster") for name in _imports(path))


def _path_to_dagster(start: Path) -> list[Path] | None:
    """The shortest chain of project imports from ``start`` to a module that imports Dagster, or None."""
    seen, frontier = {start}, [[start]]
    while frontier:
        nxt = []
        for chain in frontier:
            for module in sorted(_project_imports(chain[-1])):
                if module in seen:
                    continue
                if _imports_dagster(module):
                    return [*chain, module]
                seen.add(module)
                nxt.append([*chain, module])
        frontier = nxt
    return None


def _plain_modules() -> list[Path]:
    return [path for package in PRODUCT_PACKAGES for path in _modules(package) if not _is_dagster_layer(path)]


def test_no_plain_module_reaches_dagster_through_the_modules_it_imports():
    """Transitively: a plain module imports no Dagster layer, and no module (plain, or in ``infra``) that
    does, however many imports away. The chain is named (``a -> b -> c``, ``c`` importing Dagster)."""
    offending = []
    for path in _plain_modules():
        chain = _path_to_dagster(path)
        if chain is not None:
            offending.append(" -> ".join(str(p.relative_to(ROOT)) for p in chain))
    assert offending == [], "\n".join(offending)


def test_the_transitive_check_follows_imports_through_plain_modules_and_packages():
    assert ROOT / "pipelines/retry/attempts.py" in _project_imports(ROOT / "pipelines/retry/__init__.py")
    assert ROOT / "pipelines/__init__.py" in _project_imports(ROOT / "pipelines/common/params.py")
    assert ROOT / "pipelines/batching/__init__.py" in _project_imports(ROOT / "pipelines/batching/batcher.py")
    chain = _path_to_dagster(ROOT / "pipelines/definitions.py")
    assert chain is not None
    assert _imports_dagster(chain[-1])
