"""Print ``infra/constraints.txt``: every runtime dependency of the installed project, pinned.

The closure of ``groundskeeper``'s requirements without its extras (``dev``, ``ui``), following the
extras a requirement itself names, each at the version installed in this environment: the one the
tests ran with. ``infra/Dockerfile`` installs exactly these, then the project with ``--no-deps``.

    .venv/bin/python -m infra.constraints > infra/constraints.txt
"""

from __future__ import annotations

import importlib.metadata as md

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HEADER = """\
# Exact versions of every runtime dependency of the image: infra/Dockerfile installs these
# (`pip install -r infra/constraints.txt`), then the project with --no-deps, then runs `pip check`.
# They are the versions the tests ran with. Regenerate after a dependency change:
#   .venv/bin/python -m infra.constraints > infra/constraints.txt
"""


def runtime_closure(project: str = "groundskeeper") -> dict[str, str]:
    """Canonical name -> ``Name==version`` for every distribution the project needs at run time."""
    environment = default_environment()
    found: dict[str, str] = {}
    expanded: set[tuple[str, tuple[str, ...]]] = set()

    def wanted(req: Requirement, extras: tuple[str, ...]) -> bool:
        if req.marker is None:
            return True
        return any(req.marker.evaluate({**environment, "extra": extra}) for extra in (extras or ("",)))

    def visit(name: str, extras: tuple[str, ...]) -> None:
        key = (canonicalize_name(name), tuple(sorted(extras)))
        if key in expanded:
            return
        expanded.add(key)
        dist = md.distribution(name)
        found[canonicalize_name(name)] = f"{dist.metadata['Name']}=={dist.version}"
        for raw in dist.requires or []:
            req = Requirement(raw)
            if wanted(req, extras):
                visit(req.name, tuple(req.extras))

    for raw in md.distribution(project).requires or []:
        req = Requirement(raw)
        if wanted(req, ()):
            visit(req.name, tuple(req.extras))
    return found


def main() -> int:
    print(HEADER + "\n".join(line for _, line in sorted(runtime_closure().items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
