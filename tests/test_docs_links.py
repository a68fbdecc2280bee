"""Every relative link in README.md and docs/ points at a file that exists, and a link's #anchor at
a heading of that file (GitHub's heading ids). Links inside code blocks and code spans are not
links; absolute URLs are not checked (no network)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The text without code blocks and code spans (their brackets are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's id for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading id of a markdown page, duplicates numbered as GitHub does (``-1``, ``-2``)."""
    seen: dict[str, int] = {}
    out = set()
    for match in HEADING.finditer(FENCE.sub("", page.read_text())):
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(prose(page.read_text()))]


def relative_links() -> list[tuple[Path, str]]:
    return [
        (page, target)
        for page in PAGES
        for target in links(page)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)  # http:, https:, mailto:...
    ]


LINKS = relative_links()


def test_the_pages_have_relative_links():
    assert len(LINKS) > 50
    assert {page.name for page, _ in LINKS} >= {"README.md", "operator-guide.md", "deployment.md"}


@pytest.mark.parametrize(("page", "target"), LINKS, ids=[f"{p.relative_to(ROOT)}:{t}" for p, t in LINKS])
def test_a_relative_link_points_at_an_existing_file_and_heading(page, target):
    path, _, anchor = target.partition("#")
    where = page if not path else (page.parent / unquote(path)).resolve()
    assert where.exists(), f"{page.relative_to(ROOT)}: link {target!r}: {path} does not exist"
    if anchor:
        assert where.is_file(), f"{page.relative_to(ROOT)}: link {target!r}: not a page"
        assert where.suffix == ".md", f"{page.relative_to(ROOT)}: link {target!r}: not a page"
        assert anchor in anchors(where), (
            f"{page.relative_to(ROOT)}: link {target!r}: {where.relative_to(ROOT)} has no heading #{anchor}"
        )


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Run retries: the `groundskeeper/retry_policy` tag", "run-retries-the-groundskeeperretry_policy-tag"),
        ("Redrive (`redrive_failed_partitions`)", "redrive-redrive_failed_partitions"),
        ("Under `make dev`", "under-make-dev"),
        ("Kubernetes (not built)", "kubernetes-not-built"),
    ],
)
def test_heading_ids_are_githubs(heading, expected):
    assert slug(heading) == expected


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [gone](missing.md) `[not a link](x.md)`\n\n```\n[nor](y.md)\n```\n")
    assert links(page) == ["#title", "missing.md"]
    assert anchors(page) == {"title"}
