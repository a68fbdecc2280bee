"""Run a job of the code location from the command line, with a bad run config reported in one line.
A config that passes runs through ``dagster job execute`` (``docs/troubleshooting.md``, "Run config")."""

import argparse
import json
import runpy
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from pipelines.common import first_line
from pipelines.common.params import ParamsError, parse_params

ROOT_DIR = Path(__file__).resolve().parent.parent
USAGE_ERROR = 2
SETTINGS_ERROR = 1
MAX_DEPTH = 100  # levels of nesting in a run config (Dagster's own nest a few)
MAX_VALUES = 100_000  # values in a run config, aliases counted each time they are used
_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
_TOO_DEEP = f"nested too deeply (a run config nests at most {MAX_DEPTH} levels)"


class _RunConfigLoader(yaml.SafeLoader):
    """YAML as Dagster reads a run config: safe, and any date (also ``2026-13-45``) stays text."""

    yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


class RunConfigError(ValueError):
    """A run config that cannot be run: one line per problem."""


def _merge(into: dict[str, Any], more: Mapping[str, Any]) -> None:
    """Deep merge, as Dagster merges several ``-c`` files (later files win)."""
    for key, value in more.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _parse(text: str, source: str) -> dict[str, Any]:
    """One file's run config, read as Dagster reads it (its YAML loader: a date stays text)."""
    try:
        value = yaml.load(text, Loader=_RunConfigLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or first_line(exc, None)
        raise RunConfigError(f"{source}: not valid YAML or JSON{where}: {problem}") from None
    except RecursionError:
        raise RunConfigError(f"{source}: {_TOO_DEEP}") from None
    except Exception as exc:  # a value its tag refuses: !!timestamp 2026-13-45, !!float x...
        problem = " ".join(str(exc).split())[:200]
        raise RunConfigError(f"{source}: not valid YAML or JSON: {type(exc).__name__}: {problem}") from None
    _check_shape(value, source)
    if value is None:
        return {}
    if not isinstance(value, dict):
        kind = _KINDS.get(type(value), type(value).__name__)
        raise RunConfigError(f"{source}: a run config is a mapping (a JSON object), not {kind}")
    return value


def _check_shape(value: Any, source: str) -> None:
    """``RunConfigError`` unless ``value`` is what Dagster takes: mappings with text keys, lists and
    scalars, at most ``MAX_DEPTH`` deep and ``MAX_VALUES`` values (iterative: no recursion)."""
    stack: list[tuple[Any, str, int]] = [(value, "root", 0)]
    seen = 0
    while stack:
        node, where, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise RunConfigError(f"{source}: more than {MAX_VALUES} values: too large for a run config")
        if depth > MAX_DEPTH:
            raise RunConfigError(f"{source}: {_TOO_DEEP}")
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    raise RunConfigError(
                        f"{source}: the key {repr(key)[:50]} at {where[:200]} is not text: quote it (a run config's "
                        "keys are text)"
                    )
                stack.append((child, f"{where}:{key}", depth + 1))
        elif isinstance(node, list):
            stack.extend((child, f"{where}[{i}]", depth + 1) for i, child in enumerate(node))
        elif not isinstance(node, str | int | float | bool | None):
            raise RunConfigError(
                f"{source}: the value at {where[:200]} is {type(node).__name__}: a run config holds text, numbers, "
                "booleans, null, lists and mappings"
            )


def read_run_config(files: Sequence[str], config_json: str | None) -> dict[str, Any]:
    """The run config of ``-c`` files (merged) or of ``--config-json``; ``RunConfigError`` if one is bad."""
    config: dict[str, Any] = {}
    for name in files:
        try:
            text = Path(name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise RunConfigError(f"{name}: cannot be read: {exc}") from None
        _merge(config, _parse(text, name))
    if config_json is not None:
        _merge(config, _parse(config_json, "--config-json"))
    return config


def check_run_config(defs: Any, job_name: str, run_config: Mapping[str, Any]) -> None:
    """``RunConfigError`` (one line per problem) unless ``job_name`` is a job that accepts ``run_config``."""
    import dagster as dg

    names = sorted(job.name for job in defs.resolve_all_job_defs() if not job.name.startswith("__"))
    if job_name not in names:
        raise RunConfigError(f"no job {job_name!r} in the code location; one of: {', '.join(names)}")
    from pipelines.common.defs.config import flat_params

    job = defs.resolve_job_def(job_name)
    try:
        dg.validate_run_config(job, dict(run_config))
    except dg.DagsterInvalidConfigError as exc:
        problems = [error.message for error in exc.errors] or [str(exc)]
        lines = [f"invalid run config for {job_name}: {' '.join(problem.split())}" for problem in problems]
        raise RunConfigError("\n".join(lines)) from None
    try:  # the values the schema cannot refuse (ranges, old and new names that disagree), as the run would
        if params := flat_params(job):
            parse_params(params, run_config)
    except ParamsError as exc:
        raise RunConfigError(f"invalid run config for {job_name}: {exc}") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    at = args.index("--") if "--" in args else len(args)
    args, passthrough = args[:at], args[at + 1 :]
    parser = argparse.ArgumentParser(prog="python -m pipelines.cli", description=__doc__.splitlines()[0])
    parser.add_argument("job", help="the job to run")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("-c", "--config", action="append", default=[], help="run config file (YAML or JSON)")
    source.add_argument("--config-json", help="run config as JSON text")
    options = parser.parse_args(args)
    try:
        run_config = read_run_config(options.config, options.config_json)
        from resources import LoadSettingError  # Dagster is loaded only for a run config that parses

        try:
            from pipelines.definitions import defs
        except LoadSettingError as exc:  # DAGSTER_DEPLOYMENT, METRICS_SINK: the code location cannot load
            print(exc, file=sys.stderr)
            return SETTINGS_ERROR
        check_run_config(defs, options.job, run_config)
    except RunConfigError as exc:
        print(exc, file=sys.stderr)
        return USAGE_ERROR
    with tempfile.TemporaryDirectory(prefix="groundskeeper-run-") as tmp:
        config_file = Path(tmp, "run_config.json")
        config_file.write_text(json.dumps(run_config))
        command = ["job", "execute", "-m", "pipelines.definitions"]
        command += ["-d", str(ROOT_DIR), "-j", options.job, "-c", str(config_file), *passthrough]
        return dagster_cli(command)


def dagster_cli(args: Sequence[str]) -> int:
    """``python -m dagster <args>`` in this process, where Dagster and the code location are loaded
    already (a new process would take seconds to load them again); returns its exit status."""
    argv = sys.argv
    sys.argv = ["dagster", *args]
    try:
        runpy.run_module("dagster", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    finally:
        sys.argv = argv
    return 0


if __name__ == "__main__":
    sys.exit(main())
