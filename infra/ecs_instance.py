"""Write the ECS instance's ``dagster.yaml`` from ``infra/dagster.ecs.yaml`` and the environment.

``infra/dagster.ecs.yaml`` marks the two values Dagster cannot read from the environment itself
(the subnets and security groups inside EcsRunLauncher's ``run_task_kwargs``) as
``{env_list: NAME}``; this replaces each with the comma-separated list in ``$NAME`` and leaves every
``{env: NAME}`` to Dagster. The YAML is parsed and dumped again, never pasted into as text, so a
value cannot add keys.

    python -m infra.ecs_instance                       # writes $DAGSTER_HOME/dagster.yaml
    python -m infra.ecs_instance -- dagster-daemon run -w infra/workspace.ecs.yaml   # then runs it
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

INSTANCE_TEMPLATE = Path(__file__).with_name("dagster.ecs.yaml")
# ECS resource ids: subnet-..., sg-... (letters, digits and '-').
_ITEM = re.compile(r"^[A-Za-z0-9-]{1,255}$")


class InstanceConfigError(ValueError):
    """A variable the instance file names is missing or malformed; the message names it."""


def render(template: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """``template`` with each ``{env_list: NAME}`` replaced by ``env[NAME]`` split on commas."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if set(node) == {"env_list"}:
                name = node["env_list"]
                raw = env.get(name, "")
                items = [item.strip() for item in raw.split(",") if item.strip()]
                if not items:
                    raise InstanceConfigError(f"{name} is not set: it must list at least one id (comma-separated)")
                bad = [item for item in items if not _ITEM.match(item)]
                if bad:
                    raise InstanceConfigError(f"{name} has a value that is not an id: {bad[0]!r}")
                return items
            return {key: walk(value) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    return walk(dict(template))


def write_instance(dagster_home: Path, env: Mapping[str, str], template_path: Path = INSTANCE_TEMPLATE) -> Path:
    """Render the instance file into ``dagster_home/dagster.yaml``; returns its path."""
    config = render(yaml.safe_load(template_path.read_text()), env)
    dagster_home.mkdir(parents=True, exist_ok=True)
    target = dagster_home / "dagster.yaml"
    target.write_text(
        f"# Written by `python -m infra.ecs_instance` from {template_path.name}; edit that file instead.\n"
        + yaml.safe_dump(config, sort_keys=False)
    )
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dagster-home", default=os.environ.get("DAGSTER_HOME"), help="default: $DAGSTER_HOME")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after --: a command to exec once written")
    args = parser.parse_args(argv)
    if not args.dagster_home:
        print("ecs instance: DAGSTER_HOME is not set (or pass --dagster-home)", file=sys.stderr)
        return 2
    try:
        path = write_instance(Path(args.dagster_home), os.environ)
    except InstanceConfigError as exc:
        print(f"ecs instance: {exc}", file=sys.stderr)
        return 2
    print(f"ecs instance: wrote {path}", file=sys.stderr)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command:
        os.execvp(command[0], command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
