"""Parameters declared once: a frozen dataclass of :func:`param` fields (cross-field rules in ``__post_init__``)."""

import dataclasses
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_META = "groundskeeper"


class ParamsError(ValueError):
    """A parameter is missing, unknown or out of range; the message names it and its value."""


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """What :func:`param` recorded about one field, with its Python type resolved."""

    name: str
    kind: type  # int, float, bool, str, dict or list
    required: bool
    default: Any  # dataclasses.MISSING when required
    optional: bool  # None is a valid value (the field is typed ``X | None``)
    description: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] | None = None
    aliases: tuple[str, ...] = ()

    def describe(self) -> str:
        """The description with the range or the choices, as the Launchpad and README show it."""
        text = self.description
        if self.choices:
            text += " One of: " + ", ".join(str(c) for c in self.choices) + "."
        if self.minimum is not None and self.maximum is not None:
            text += f" Range {_num(self.minimum)} to {_num(self.maximum)}."
        elif self.minimum is not None:
            text += f" At least {_num(self.minimum)}."
        elif self.maximum is not None:
            text += f" At most {_num(self.maximum)}."
        if self.aliases:
            text += f" Old name{'s' if len(self.aliases) > 1 else ''} (deprecated): {', '.join(self.aliases)}."
        return text


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def param(
    default: Any = dataclasses.MISSING,
    *,
    description: str,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: Sequence[Any] | None = None,
    aliases: Sequence[str] = (),
) -> Any:
    """A parameter's dataclass field (no ``default``: required; a dict or list default is copied)."""
    spec = {"description": description, "minimum": minimum, "maximum": maximum, "aliases": tuple(aliases)}
    metadata = {_META: {**spec, "choices": tuple(choices) if choices is not None else None}}
    if isinstance(default, dict | list):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _resolve(hint: Any) -> tuple[type, bool]:
    """``int`` -> (int, False); ``int | None`` -> (int, True); ``dict[str, Any]`` -> (dict, False)."""
    optional = False
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        if len(args) != 1:
            raise TypeError(f"unsupported parameter type {hint!r}")
        hint = args[0]
        origin = typing.get_origin(hint)
    kind = origin or hint
    if kind not in (int, float, bool, str, dict, list):
        raise TypeError(f"unsupported parameter type {hint!r}")
    return kind, optional


def specs(cls: type) -> list[ParamSpec]:
    """The declared parameters of ``cls``, in declaration order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_META)
        if meta is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with pipelines.common.params.param")
        kind, optional = _resolve(hints[f.name])
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        required = default is dataclasses.MISSING
        out.append(ParamSpec(name=f.name, kind=kind, required=required, default=default, optional=optional, **meta))
    return out


def _check_value(spec: ParamSpec, key: str, value: Any) -> Any:
    if value is None:
        if spec.optional:
            return None
        raise ParamsError(f"{key} must not be null")
    kind = spec.kind
    if kind is bool:
        if not isinstance(value, bool):
            raise ParamsError(f"{key} must be true or false, got {value!r}")
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamsError(f"{key} must be a whole number, got {value!r}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not abs(value) <= sys.float_info.max:
            raise ParamsError(f"{key} must be a number within a float's range, got {value!r:.40}")  # not NaN, 1e400
        value = float(value)
    elif not isinstance(value, kind):
        raise ParamsError(f"{key} must be a {kind.__name__}, got {value!r}")
    if spec.minimum is not None and value < spec.minimum:
        raise ParamsError(f"{key} must be at least {_num(spec.minimum)}, got {value!r}")
    if spec.maximum is not None and value > spec.maximum:
        raise ParamsError(f"{key} must be at most {_num(spec.maximum)}, got {value!r}")
    if spec.choices is not None and value not in spec.choices:
        raise ParamsError(f"{key} must be one of {', '.join(map(str, spec.choices))}, got {value!r}")
    return value


def parse_params(cls: type[T], raw: Mapping[str, Any], *, what: str = "parameter") -> tuple[T, list[str]]:
    """The instance of ``cls`` from ``raw``, and the deprecation warnings for old names used."""
    if not isinstance(raw, Mapping):
        raise ParamsError(f"the {what}s must be a JSON object, got {type(raw).__name__}")
    declared = specs(cls)
    known = {s.name for s in declared} | {a for s in declared for a in s.aliases}
    unknown = sorted(set(raw) - known)
    if unknown:
        names = ", ".join(s.name for s in declared)
        raise ParamsError(f"unknown {what}(s) {', '.join(unknown)}; known: {names}")
    values: dict[str, Any] = {}
    warnings: list[str] = []
    for spec in declared:
        key, value = spec.name, raw.get(spec.name, spec.default)
        for alias in spec.aliases:
            if alias not in raw:
                continue
            warnings.append(f"{alias} is deprecated: use {spec.name}")
            given = raw.get(spec.name, spec.default)
            if spec.name in raw and given != spec.default and given != raw[alias]:
                raise ParamsError(f"{spec.name}={given!r} and its old name {alias}={raw[alias]!r} disagree: give one")
            key, value = alias, raw[alias]
        if value is dataclasses.MISSING:
            raise ParamsError(f"{spec.name} is required")
        values[spec.name] = _check_value(spec, key, value)
    return cls(**values), warnings
