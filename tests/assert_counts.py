"""Counts the suite's asserts that check less than they seem to, and its imports of Dagster's internals.

Run it (``.venv/bin/python tests/assert_counts.py``) for the report; ``tests/test_suite_rules.py``
fails the suite on (a), (b) and (d) outside their justification lists. What each count is, exactly:

(a) chained: an ``assert`` whose test is ``a and b`` (an ``ast.BoolOp`` with ``ast.And``). A failure
    names neither operand; write one assert per fact.
(b) redundant success: ``assert x.success`` (also ``x.success is True`` and ``x.success == True``)
    where ``x`` is the result of a raising run: an ``execute_in_process(...)``, ``materialize(...)`` or
    ``materialize_to_memory(...)`` call made without ``raise_on_error=False`` (and without
    ``**kwargs``, which could pass it), or a call of a function of the same file whose body returns
    such a call. ``x`` is that call itself or the name assigned from it earlier in the same function.
    These raise on failure by default, so the assert cannot fail.
(c) bare truthiness: an ``assert`` whose test is a bare ``Name``, ``Attribute`` or ``Subscript``
    (``assert runs``, ``assert result.output``, ``assert rows[0]``): the value's truthiness alone
    is asserted. Calls (``path.exists()``, ``re.search(...)``), comparisons and ``not x`` are not
    counted: a call is usually a predicate, ``not x`` asserts the empty value exactly. Reported only:
    a flag (``result.success`` with ``raise_on_error=False``, ``done.is_set``) is a fine bare assert.
(d) private Dagster: a file under ``tests/`` that imports ``dagster._...`` or ``dagster_shared``.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

ALLOWED_CHAINED: dict[tuple[str, str], str] = {}
"""(file, function) -> reason: chained asserts kept on purpose (none)."""

ALLOWED_REDUNDANT_SUCCESS: dict[tuple[str, str], str] = {}
"""(file, function) -> reason: ``assert result.success`` kept after a raising execute_in_process (none)."""

ALLOWED_PRIVATE_DAGSTER: dict[str, str] = {
    "tests/suite_plugin.py": "drops the defs-state storage Dagster leaves set between tests: a private global",
    "tests/test_alerts_sensor.py": "records failed and skipped sensor ticks: no public API writes ticks",
    "tests/test_cluster.py": "terminates a run through the UI's GraphQL mutation, which needs a workspace context",
    "tests/test_config_enums.py": "asks the UI's GraphQL isPipelineConfigValid, which needs a workspace context",
    "tests/test_ecs.py": "a run with a Python code origin (the ECS launcher's task command) and the instance schema",
    "tests/test_ecs_stack.py": "validates the ECS instance and workspace files against Dagster's own config schemas",
    "tests/test_queue_hygiene.py": (
        "a queued run record needs a remote job origin, a backfill its PartitionBackfill: no public API builds either"
    ),
    "tests/test_fleet_ui_terminate.py": "terminates a run from the UI: a gRPC code server and its workspace context",
    "tests/test_redrive.py": (
        "runs the daemon's backfill iteration in process, and adds a job backfill: no public API does either"
    ),
    "tests/test_operations_summary.py": "50,000 run records in one transaction: no public API adds runs in bulk",
    "tests/test_definitions.py": "what the code server keeps as a load error: Dagster's own serialization of it",
}
"""file -> reason: the test files that import Dagster's internals, each because no public API does it."""


@dataclass
class Counts:
    chained: list[tuple[str, str, int]] = field(default_factory=list)
    redundant_success: list[tuple[str, str, int]] = field(default_factory=list)
    bare_truthiness: list[tuple[str, str, int]] = field(default_factory=list)
    private_dagster: dict[str, list[str]] = field(default_factory=dict)


RUNS = {"execute_in_process", "materialize", "materialize_to_memory"}
"""The calls that run a job or assets in process and raise on failure unless ``raise_on_error=False``."""


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _is_raising_execute(node: ast.AST, helpers: frozenset[str] = frozenset()) -> bool:
    """A run that raises on failure: a call in ``RUNS`` without ``raise_on_error=False``, or of ``helpers``."""
    if not isinstance(node, ast.Call):
        return False
    name = _called(node)
    if name in helpers:
        return True
    if name not in RUNS:
        return False
    for kw in node.keywords:
        if kw.arg == "raise_on_error":
            return isinstance(kw.value, ast.Constant) and kw.value.value is True
        if kw.arg is None:  # **kwargs: undecidable here, so not counted
            return False
    return True


def _success_target(test: ast.expr) -> ast.expr | None:
    """``x`` of ``x.success``, ``x.success is True`` or ``x.success == True``."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        right = test.comparators[0]
        if isinstance(test.ops[0], (ast.Is, ast.Eq)) and isinstance(right, ast.Constant) and right.value is True:
            test = test.left
    if isinstance(test, ast.Attribute) and test.attr == "success":
        return test.value
    return None


def _functions(tree: ast.Module):
    yield "<module>", tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node


def _own_nodes(scope: ast.AST):
    """The nodes of ``scope`` in source order, without those of nested functions (their own scopes)."""
    for child in ast.iter_child_nodes(scope):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield child
        yield from _own_nodes(child)


def _raising_helpers(tree: ast.Module) -> frozenset[str]:
    """The functions of the file whose body returns a raising run (``return job.execute_in_process(...)``)."""
    return frozenset(
        fn.name
        for fn in tree.body
        if isinstance(fn, ast.FunctionDef)
        and any(isinstance(n, ast.Return) and _is_raising_execute(n.value) for n in _own_nodes(fn))
    )


def count_source(source: str, rel: str, counts: Counts) -> None:
    """Adds the counts of one file's ``source`` (named ``rel``) to ``counts``."""
    tree = ast.parse(source, filename=rel)
    helpers = _raising_helpers(tree)
    for name, scope in _functions(tree):
        raising: set[str] = set()  # names last assigned from a raising execute_in_process
        for node in _own_nodes(scope):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        (raising.add if _is_raising_execute(node.value, helpers) else raising.discard)(target.id)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if isinstance(item.optional_vars, ast.Name):
                        raising.discard(item.optional_vars.id)
            elif isinstance(node, ast.Assert):
                test = node.test
                where = (rel, name, node.lineno)
                if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
                    counts.chained.append(where)
                target = _success_target(test)
                if target is not None and (
                    (isinstance(target, ast.Name) and target.id in raising) or _is_raising_execute(target, helpers)
                ):
                    counts.redundant_success.append(where)
                if isinstance(test, (ast.Name, ast.Attribute, ast.Subscript)):
                    counts.bare_truthiness.append(where)
    for node in ast.walk(tree):
        modules = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        for module in modules:
            if module.startswith("dagster._") or module.split(".")[0] == "dagster_shared":
                counts.private_dagster.setdefault(rel, []).append(module)


def count(paths: list[Path] | None = None) -> Counts:
    counts = Counts()
    for path in paths if paths is not None else sorted(TESTS.rglob("*.py")):
        count_source(path.read_text(), str(path.relative_to(ROOT)), counts)
    return counts


def unjustified(counts: Counts) -> dict[str, list[str]]:
    """Each of (a), (b), (d) outside its justification list, as ``file:line (function)`` lines."""
    return {
        "chained asserts": [f"{f}:{line} ({fn})" for f, fn, line in counts.chained if (f, fn) not in ALLOWED_CHAINED],
        "redundant success asserts": [
            f"{f}:{line} ({fn})" for f, fn, line in counts.redundant_success if (f, fn) not in ALLOWED_REDUNDANT_SUCCESS
        ],
        "test files importing Dagster internals": [
            f"{f}: {', '.join(sorted(set(mods)))}"
            for f, mods in sorted(counts.private_dagster.items())
            if f not in ALLOWED_PRIVATE_DAGSTER
        ],
    }


def main() -> int:
    counts = count()
    print(f"(a) chained asserts: {len(counts.chained)}")
    print(f"(b) redundant success asserts: {len(counts.redundant_success)}")
    print(f"(c) bare-truthiness asserts: {len(counts.bare_truthiness)}")
    for f, n in Counter(f for f, _, _ in counts.bare_truthiness).most_common():
        print(f"      {n:4d}  {f}")
    print(f"(d) test files importing Dagster internals: {len(counts.private_dagster)}")
    for f, mods in sorted(counts.private_dagster.items()):
        print(f"      {f}: {', '.join(sorted(set(mods)))}  [{ALLOWED_PRIVATE_DAGSTER.get(f, 'NOT JUSTIFIED')}]")
    bad = unjustified(counts)
    for what, lines in bad.items():
        for line in lines:
            print(f"{what}: {line}")
    return 1 if any(bad.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
