"""A parameters dataclass (``pipelines.common.params``) as Dagster config."""

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import dagster as dg

from pipelines.common.params import ParamsError, ParamSpec, parse_params, specs

T = TypeVar("T")


_DAGSTER_TYPES: dict[type, Any] = {int: dg.Int, float: dg.Float, bool: dg.Bool, str: dg.String, list: dg.Array(dg.Any)}


# One dg.Enum per name in the code location: Dagster tells config types apart by name, so a name
# means one set of values; the same declaration gets the same object each time.
_ENUMS: dict[str, tuple[tuple[str, ...], dg.Enum]] = {}


def _field(cls: type, spec: ParamSpec, description: str, *, with_default: bool) -> dg.Field:
    if spec.kind is dict:
        kind = dg.Permissive()
    elif spec.choices and spec.kind is str and all(isinstance(c, str) for c in spec.choices):
        name, values = f"{cls.__name__}_{spec.name}", tuple(spec.choices)  # <Class>_<field>
        if name not in _ENUMS:
            _ENUMS[name] = (values, dg.Enum(name, [dg.EnumValue(v) for v in values]))
        elif _ENUMS[name][0] != values:
            raise TypeError(f"two parameter declarations make the config enum {name} with other choices: rename one")
        kind = _ENUMS[name][1]
    else:
        kind = _DAGSTER_TYPES[spec.kind]
    kind = dg.Noneable(kind) if spec.optional else kind
    if with_default and not spec.required and spec.default is not None:
        return dg.Field(kind, is_required=False, default_value=spec.default, description=description)
    return dg.Field(kind, is_required=with_default and spec.required, description=description)


def config_schema(cls: type) -> dict[str, dg.Field]:
    """The config schema of ``cls``: choices as a ``dg.Enum`` (Dagster refuses another value before a
    run starts); each old name as an optional field."""
    schema: dict[str, dg.Field] = {}
    for spec in specs(cls):
        schema[spec.name] = _field(cls, spec, spec.describe(), with_default=True)
        for alias in spec.aliases:
            schema[alias] = _field(cls, spec, f"Deprecated: the old name of {spec.name}.", with_default=False)
    return schema


def flat_config(
    op_name: str,
    cls: type,
    *,
    execution: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None,
    console_level: str | None = None,
) -> dg.ConfigMapping:
    """The parameters of a job's one op at the top of its run config. ``execution`` picks the executor's
    config from the values (it must not raise: the op validates); ``console_level``: the lowest level
    of the run's console output (Dagster's default is DEBUG)."""

    def mapping(values: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"ops": {op_name: {"config": {k: v for k, v in values.items() if v is not None}}}}
        if execution is not None:
            out["execution"] = {"config": execution(values)}
        if console_level is not None:
            out["loggers"] = {"console": {"config": {"log_level": console_level}}}
        return out

    mapping.params = cls  # type: ignore[attr-defined]  # what flat_params finds
    return dg.ConfigMapping(config_fn=mapping, config_schema=config_schema(cls))


def flat_params(job: dg.JobDefinition) -> type | None:
    """The parameters class of a job with a flat run config (:func:`flat_config`), else None."""
    return getattr(job.config_mapping and job.config_mapping.config_fn, "params", None)


def params_from_config(context: Any, cls: type[T], raw: Mapping[str, Any] | None = None) -> T:
    """The op's parameters (``raw``, default its config): a bad value fails it in one line, no retry."""
    try:
        params, warnings = parse_params(cls, context.op_config if raw is None else raw)
    except ParamsError as exc:
        raise dg.Failure(description=f"invalid run config: {exc}", allow_retries=False) from None
    for warning in warnings:
        context.log.warning(f"run config: {warning}")
    return params
