"""Retry policies: ``delay(n) -> seconds | STOP``, ``n`` the attempts made so far (docs/retry.md)."""

import importlib
import inspect
import math
import os
import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar


class _Stop:
    """The "do not retry" answer of a delay function. Falsy, printed as ``STOP``, pickled as the one ``STOP``."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "STOP"

    def __reduce__(self) -> str:
        return "STOP"


STOP = _Stop()


class RetryPolicyError(ValueError):
    """A policy that cannot be built or evaluated. ``field`` and ``value`` name what is wrong."""

    def __init__(self, message: str, *, field: str | None = None, value: Any = None):
        super().__init__(message)
        self.field = field
        self.value = value


def invalid(name: str, value: Any, what: str) -> RetryPolicyError:
    return RetryPolicyError(f"{name} must be {what}, got {value!r}", field=name, value=value)


class DelayFunctionError(RetryPolicyError):
    """A user delay function raised or returned garbage. Never retried (the retry RFC's warning)."""

    def __init__(self, path: str, n: int, cause: str):
        super().__init__(f"retry delay function {path!r} failed for n={n}: {cause}", field="path", value=path)


@dataclass(frozen=True)
class Jitter:
    """How a nominal delay ``base`` is spread: uniformly over ``base * (1 + [low, high])``; by default not at all."""

    name: str = "none"
    low: float = 0.0
    high: float = 0.0

    def sample(self, base: float, n: int, rng: random.Random) -> float:
        return base * (1.0 + rng.uniform(self.low, self.high))

    def bounds(self, base: float, n: int) -> tuple[float, float]:
        return base * (1.0 + self.low), base * (1.0 + self.high)


@dataclass(frozen=True)
class SidekiqJitter(Jitter):
    """Sidekiq's ``rand(10) * (count + 1)`` with ``count = n - 1``: an integer ``0..9`` times ``n``."""

    name: str = "sidekiq"

    def sample(self, base: float, n: int, rng: random.Random) -> float:
        return base + rng.randrange(10) * n

    def bounds(self, base: float, n: int) -> tuple[float, float]:
        return base, base + 9 * n


JITTERS: dict[str, Jitter] = {
    "none": Jitter(),
    "full": Jitter("full", -1.0, 0.0),  # uniform in [0, base] (AWS Architecture Blog, "Exponential Backoff And Jitter")
    "plus-minus": Jitter("plus-minus", -0.1, 0.1),  # base * (1 +/- 0.1), River's; exponential() takes another ratio
}


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Base of every policy: subclasses give the nominal delay ``_base(n)`` for ``n >= 1``. ``max_attempts``
    counts the first attempt (``None``: unlimited); ``non_retryable``: the names :meth:`is_retryable` refuses."""

    max_attempts: int | None = 1
    non_retryable: tuple[str, ...] = ()
    jitter: Jitter = field(default_factory=Jitter)
    max_delay: float | None = None

    kind = "abstract"
    json_fields: ClassVar[dict[str, str]] = {}  # JSON key -> attribute, after "kind"

    def _base(self, n: int) -> float | _Stop:
        raise NotImplementedError

    def _cap(self, seconds: float) -> float:
        return min(seconds, MAX_DELAY_SECONDS if self.max_delay is None else self.max_delay)

    def nominal(self, n: int) -> float | _Stop:
        """The delay after ``n`` attempts without jitter, or ``STOP``."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise RetryPolicyError(f"n (attempts made so far) must be an integer >= 0, got {n!r}", field="n", value=n)
        if self.max_attempts is not None and n >= self.max_attempts:
            return STOP
        if n == 0:
            return self._first()
        try:
            base = self._base(n)
        except OverflowError:  # a formula past the largest float: capped, or waits forever
            base = math.inf
        return STOP if base is STOP else self._cap(base)

    def delay(self, n: int, rng: random.Random | None = None) -> float | _Stop:
        """Seconds to wait before the next attempt once ``n`` attempts were made, or ``STOP``."""
        base = self.nominal(n)
        if base is STOP or n == 0:
            return base
        return self._cap(max(0.0, self.jitter.sample(base, n, rng or random)))

    def bounds(self, n: int) -> tuple[float, float] | _Stop:
        """The lowest and highest delay jitter can give after ``n`` attempts, or ``STOP``."""
        base = self.nominal(n)
        if base is STOP:
            return STOP
        if n == 0:
            return base, base
        low, high = self.jitter.bounds(base, n)
        return self._cap(max(0.0, low)), self._cap(high)

    def _first(self) -> float:
        return 0.0

    def is_retryable(self, error: BaseException | str) -> bool:
        """False for errors this policy lists as non-retryable, by any name the error answers to (class
        names and dotted names along its MRO, its AWS error code), and always for policy errors."""
        if isinstance(error, RetryPolicyError):
            return False
        if isinstance(error, str):
            return error not in self.non_retryable
        names = {name for cls in type(error).__mro__ for name in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")}
        response = getattr(error, "response", None)
        if isinstance(response, dict) and (code := (response.get("Error") or {}).get("Code")):
            names.add(str(code))
        return not (names & set(self.non_retryable))

    def describe(self) -> str:
        return self.kind

    def to_json(self) -> dict[str, Any]:
        out = {"kind": self.kind, **{key: getattr(self, attr) for key, attr in self.json_fields.items()}}
        return {**out, **({"nonRetryable": list(self.non_retryable)} if self.non_retryable else {})}


@dataclass(frozen=True, kw_only=True)
class NoRetry(RetryPolicy):
    """``none``: one attempt, never retried."""

    kind = "none"

    def _base(self, n: int) -> float | _Stop:
        return STOP


@dataclass(frozen=True, kw_only=True)
class FixedDelay(RetryPolicy):
    """``fixed(delay, max_attempts)``: the same wait before every retry."""

    seconds: float = 0.0
    kind = "fixed"
    json_fields = {"delay": "seconds", "maxAttempts": "max_attempts"}

    def _base(self, n: int) -> float:
        return float(self.seconds)

    def describe(self) -> str:
        return f"fixed {self.seconds:g}s, {_attempts(self.max_attempts)}"


@dataclass(frozen=True, kw_only=True)
class Exponential(RetryPolicy):
    """``delay(n) = min(initial * coefficient ** (n - 1), max_delay)`` for ``n >= 1``, then jitter
    (the result never exceeds ``max_delay``)."""

    initial: float = 1.0
    coefficient: float = 2.0
    kind = "exponential"
    json_fields = dict(initial="initial", coefficient="coefficient", maxDelay="max_delay", maxAttempts="max_attempts")

    def _base(self, n: int) -> float:
        return 0.0 if self.initial == 0 else self.initial * self.coefficient ** (n - 1)  # 0 x overflow is 0

    def to_json(self) -> dict[str, Any]:
        ratio = self.jitter.name == "plus-minus" and self.jitter != JITTERS["plus-minus"]
        return {**super().to_json(), "jitter": self.jitter.name, **({"jitterRatio": self.jitter.high} if ratio else {})}

    def describe(self) -> str:
        cap = f", max {self.max_delay:g}s" if self.max_delay is not None else ""
        return (
            f"exponential {self.initial:g}s x{self.coefficient:g}{cap}, "
            f"{_attempts(self.max_attempts)}, jitter {self.jitter.name}"
        )


@dataclass(frozen=True, kw_only=True)
class Formula(RetryPolicy):
    """A named formula (the presets): ``formula(n)`` for ``n >= 1``, then jitter and cap."""

    name: str = ""
    formula: Callable[[int], float] = field(default=lambda n: 0.0, compare=False)
    source: str = field(default="", compare=False)
    summary: str = field(default="", compare=False)
    kind = "preset"
    json_fields = {"name": "name"}

    def _base(self, n: int) -> float:
        return float(self.formula(n))

    def describe(self) -> str:
        return f"preset {self.name}: {self.summary}"


@dataclass(frozen=True, kw_only=True)
class FunctionPolicy(RetryPolicy):
    """A user delay function ``package.module:function`` of ``n``: seconds, or ``False``/``None``/``STOP``
    for "do not retry"; anything else it returns or raises is a ``DelayFunctionError`` (docs/retry.md)."""

    path: str = ""
    function: Callable[[int], Any] = field(default=lambda n: STOP, compare=False, repr=False)
    kind = "function"
    json_fields = {"path": "path", "maxAttempts": "max_attempts"}

    def _base(self, n: int) -> float | _Stop:
        try:
            value = self.function(n)
        except BaseException as exc:  # the retry RFC's warning: identify it, never retry it, never exit
            raise DelayFunctionError(self.path, n, _type_and_message(exc)) from exc
        if value is None or value is False or value is STOP:
            return STOP
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_DELAY_SECONDS:
            raise DelayFunctionError(
                self.path, n, f"returned {value!r}; expected seconds from 0 to {MAX_DELAY_SECONDS}, or False"
            )
        return float(value)

    def _first(self) -> float | _Stop:  # type: ignore[override]
        return self._base(0)

    def describe(self) -> str:
        return f"function {self.path}, {_attempts(self.max_attempts)}"


# Constructors (validated)

_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", re.ASCII)  # one name after ':', no walk

FUNCTIONS_ENV = "GROUNDSKEEPER_RETRY_FUNCTIONS"  # the module prefixes a function policy may name (docs/retry.md)


def registered_function_modules() -> tuple[str, ...]:
    return tuple(p.strip() for p in os.environ.get(FUNCTIONS_ENV, "").split(",") if p.strip())


def _registered(module_name: str) -> list[str]:
    """The registered prefixes that ``module_name`` is or is under (none: it is not registered)."""
    prefixes = registered_function_modules()
    return [p.rstrip(".") for p in prefixes if module_name == p or module_name.startswith(p.rstrip(".") + ".")]


MAX_DELAY_SECONDS = 30 * 86_400  # the longest wait a policy may give: a run waits, it does not wait forever
MAX_COEFFICIENT = 100
MAX_ATTEMPTS = 10_000
Names = tuple[str, ...] | list[str]  # error type names (nonRetryable)


def none(*, non_retryable: Names = ()) -> NoRetry:
    return NoRetry(max_attempts=1, non_retryable=_names(non_retryable))


def fixed(delay: float, max_attempts: int | None, *, non_retryable: Names = ()) -> FixedDelay:
    return FixedDelay(
        seconds=_seconds("delay", delay),
        max_attempts=_max_attempts(max_attempts),
        non_retryable=_names(non_retryable),
    )


def exponential(
    initial: float,
    coefficient: float = 2.0,
    max_delay: float | None = None,
    max_attempts: int | None = 5,
    jitter: str = "none",
    *,
    jitter_ratio: float = 0.1,
    non_retryable: Names = (),
) -> Exponential:
    return Exponential(
        initial=_seconds("initial", initial),
        coefficient=_number("coefficient", coefficient, 1, MAX_COEFFICIENT, f"a number from 1 to {MAX_COEFFICIENT}"),
        max_delay=None if max_delay is None else _seconds("maxDelay", max_delay),
        jitter=_jitter(jitter, jitter_ratio),
        max_attempts=_max_attempts(max_attempts),
        non_retryable=_names(non_retryable),
    )


def _jitter(name: Any, ratio: Any) -> Jitter:
    if not isinstance(name, str) or name not in JITTERS:
        raise invalid("jitter", name, f"one of {sorted(JITTERS)}")
    ratio = _number("jitterRatio", ratio, 0, 1, "a number in [0, 1]")
    return Jitter("plus-minus", -ratio, ratio) if name == "plus-minus" else JITTERS[name]


def function(path: str, max_attempts: int | None = None, *, non_retryable: Names = ()) -> FunctionPolicy:
    """Resolve ``package.module:function`` now, so a bad path fails when the policy is built (what it may
    name, and why: docs/retry.md). Anything raised while resolving it, ``SystemExit`` too, is a ``RetryPolicyError``."""
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise RetryPolicyError(f"path must look like 'package.module:function', got {path!r}", field="path", value=path)
    module_name, _, attr = path.partition(":")
    if not _registered(module_name):
        registered = ", ".join(registered_function_modules()) or "none"
        raise _path_error(
            path,
            f"is not in a registered module: function policies may name only public functions "
            f"of the modules in {FUNCTIONS_ENV} (registered: {registered})",
        )
    if any(part.startswith("_") for part in [*module_name.split("."), attr]):
        raise _path_error(
            path,
            "has a part that starts with '_' (a private module or name, or a package's "
            "__main__, which runs its command line): a function policy names a public function of a public module",
        )
    try:
        target = _resolve(path, module_name, attr)
    except RetryPolicyError:
        raise
    except BaseException as exc:  # SystemExit, KeyboardInterrupt...: a policy error, never an exit
        raise _path_error(path, f"cannot be resolved: {_type_and_message(exc)}") from None
    return FunctionPolicy(
        path=path,
        function=target,
        max_attempts=_max_attempts(max_attempts),
        non_retryable=_names(non_retryable),
    )


def _path_error(path: str, problem: str) -> RetryPolicyError:
    return RetryPolicyError(f"path {path!r} {problem}", field="path", value=path)


def _resolve(path: str, module_name: str, attr: str) -> Callable[[int], Any]:
    """The function ``path`` names, importing only the registered modules it is under."""
    for registered in _registered(module_name):
        try:
            importlib.import_module(registered)
        except BaseException as exc:  # a registered module that exits on import is a policy error
            raise _path_error(
                path,
                f"cannot be imported: {_type_and_message(exc)} (importing {registered}, registered in {FUNCTIONS_ENV})",
            ) from None
    module = sys.modules.get(module_name)
    if module is None:
        raise _path_error(
            path,
            f"names {module_name}, which is not imported by its registered module, and a policy never imports "
            f"one: register {module_name} itself in {FUNCTIONS_ENV}",
        )
    target = vars(module).get(attr)  # the module's own namespace: no module __getattr__
    if target is None:
        raise _path_error(path, f"cannot be imported: no {attr!r} in {module_name}")
    if not inspect.isfunction(target) or not _registered(getattr(target, "__module__", None) or ""):
        raise _path_error(
            path,
            f"is not a function defined in a registered module ({_describe(target)}): "
            f"a function policy names a plain function defined in a module of {FUNCTIONS_ENV}",
        )
    return target


def _type_and_message(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def _describe(value: Any) -> str:
    """What a path resolved to, for the refusal: ``builtin function sys.exit``, ``function json.dumps``..."""
    if inspect.isfunction(value):
        return f"function {value.__module__}.{value.__qualname__}"
    if inspect.isbuiltin(value):
        return f"builtin function {getattr(value, '__module__', None) or '?'}.{value.__name__}"
    if inspect.ismodule(value):
        return f"module {value.__name__}"
    if inspect.isclass(value):
        return f"class {value.__module__}.{value.__qualname__}"
    return f"a {type(value).__name__}"


def _number(name: str, value: Any, low: float, high: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:  # NaN too
        raise invalid(name, value, what)
    return float(value)


def _seconds(name: str, value: Any) -> float:
    return _number(name, value, 0, MAX_DELAY_SECONDS, f"a number of seconds from 0 to {MAX_DELAY_SECONDS} (30 days)")


def _max_attempts(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS):
        raise invalid("maxAttempts", value, f"an integer from 1 to {MAX_ATTEMPTS} (or null for unlimited)")
    return value


def _names(values: Any) -> tuple[str, ...]:
    if not isinstance(values, list | tuple) or not all(isinstance(v, str) and v for v in values):
        raise invalid("nonRetryable", values, "a list of error type names")
    return tuple(values)


def _attempts(max_attempts: int | None) -> str:
    return "unlimited attempts" if max_attempts is None else f"{max_attempts} attempts"
