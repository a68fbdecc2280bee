"""Every ``dg launch --job <name>`` in README.md and docs/ names a job of the definitions that command loads:
``pipelines.definitions`` (``[tool.dg]``), or the module its ``-m`` names. A job only a targets file adds
(``progressor_health_job``) may be named without ``-m`` on a page that says to set ``PROGRESSOR_TARGETS_FILE``."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LAUNCH = re.compile(r"dg launch([^`\n]*)")


@cache
def job_names(module: str, targets: bool = False) -> frozenset[str]:
    from infra.demo.definitions import TARGETS_DIR, build_local_definitions
    from pipelines.definitions import build_definitions

    if module == "infra.demo.definitions":
        return frozenset(job.name for job in build_local_definitions({}).get_repository_def().get_all_jobs())
    assert module == "pipelines.definitions", f"dg launch -m {module}: not a code location module"
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PROGRESSOR_TARGETS_FILE", raising=False)
        if targets:
            patch.setenv("PROGRESSOR_TARGETS_FILE", str(TARGETS_DIR / "progressor.json"))
        return frozenset(job.name for job in build_definitions("local").get_repository_def().get_all_jobs())


def launches() -> list[tuple[Path, str, str]]:
    """(page, module, job) of each ``dg launch --job <name>`` (a placeholder such as ``<job>`` left out)."""
    found = []
    for page in PAGES:
        for match in LAUNCH.finditer(page.read_text()):
            args = match.group(1).split()
            options = dict(zip(args, args[1:], strict=False))
            module = options.get("-m") or options.get("--module-name") or "pipelines.definitions"
            if re.fullmatch(r"\w+", options.get("--job", "")):
                found.append((page, module, options["--job"]))
    return found


LAUNCHES = launches()


def test_the_pages_launch_jobs():
    assert {page.name for page, _, _ in LAUNCHES} >= {"README.md", "operator-guide.md", "check_failure.md"}


@pytest.mark.parametrize(
    ("page", "module", "job"), LAUNCHES, ids=[f"{p.relative_to(ROOT)}:{m}:{j}" for p, m, j in LAUNCHES]
)
def test_a_launched_job_is_one_of_the_definitions_dg_loads(page, module, job):
    if job in job_names(module):
        return
    assert module == "pipelines.definitions", f"{page.name}: dg launch -m {module} --job {job}: no such job"
    assert job in job_names(module, targets=True), f"{page.name}: dg launch --job {job}: no such job"
    assert "PROGRESSOR_TARGETS_FILE" in page.read_text(), f"{page.name}: --job {job} needs PROGRESSOR_TARGETS_FILE"
