"""Retry policies: a policy is a delay function ``delay(n) -> seconds | STOP`` (the retry RFC).

``n`` is the number of attempts made so far: ``delay(0)`` is the wait before the first run (0 for
every built-in form), ``delay(1)`` the wait after the first attempt failed, and so on. Once ``n``
reaches ``max_attempts`` the answer is ``STOP``. No Dagster imports here.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class _Stop:
    """The "do not retry" answer of a delay function. Falsy, a singleton, printed as ``STOP``."""

    _instance: _Stop | None = None

    def __new__(cls) -> _Stop:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "STOP"

    def __reduce__(self) -> str:
        return "STOP"


STOP = _Stop()
"""Returned by ``RetryPolicy.delay`` when no further attempt should be made."""


class RetryPolicyError(ValueError):
    """A policy that cannot be built or evaluated. ``field`` and ``value`` name what is wrong."""

    def __init__(self, message: str, *, field: str | None = None, value: Any = None):
        super().__init__(message)
        self.field = field
        self.value = value


class DelayFunctionError(RetryPolicyError):
    """A user delay function raised or returned garbage. Never retried (the retry RFC's warning)."""

    def __init__(self, path: str, n: int, cause: str):
        super().__init__(f"retry delay function {path!r} failed for n={n}: {cause}", field="path", value=path)
        self.path = path
        self.n = n


# --------------------------------------------------------------------------------------------
# Jitter: how a nominal delay is spread. ``sample`` draws one delay, ``bounds`` gives its range.


@dataclass(frozen=True)
class Jitter:
    """No jitter: the delay is the nominal delay."""

    name = "none"

    def sample(self, base: float, n: int, rng: random.Random) -> float:
        return base

    def bounds(self, base: float, n: int) -> tuple[float, float]:
        return base, base


@dataclass(frozen=True)
class FullJitter(Jitter):
    """Uniform in ``[0, base]`` (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015)."""

    name = "full"

    def sample(self, base: float, n: int, rng: random.Random) -> float:
        return rng.uniform(0.0, base)

    def bounds(self, base: float, n: int) -> tuple[float, float]:
        return 0.0, base


@dataclass(frozen=True)
class PlusMinusJitter(Jitter):
    """Uniform in ``[base * (1 - ratio), base * (1 + ratio)]`` (River uses ratio 0.1)."""

    ratio: float = 0.1
    name = "plus-minus"

    def sample(self, base: float, n: int, rng: random.Random) -> float:
        return base * (1.0 + rng.uniform(-self.ratio, self.ratio))

    def bounds(self, base: float, n: int) -> tuple[float, float]:
        return base * (1.0 - self.ratio), base * (1.0 + self.ratio)


@dataclass(frozen=True)
class IncreaseJitter(Jitter):
    """Uniform in ``[base, base * (1 + ratio)]`` (Oban's ``jitter(mode: :inc)``, ratio 0.1)."""

    ratio: float = 0.1
    name = "increase"

    def sample(self, base: float, n: int, rng: random.Random) -> float:
        return base * (1.0 + rng.uniform(0.0, self.ratio))

    def bounds(self, base: float, n: int) -> tuple[float, float]:
        return base, base * (1.0 + self.ratio)


@dataclass(frozen=True)
class SidekiqJitter(Jitter):
    """Sidekiq's ``rand(10) * (count + 1)`` with ``count = n - 1``: an integer ``0..9`` times ``n``."""

    name = "sidekiq"

    def sample(self, base: float, n: int, rng: random.Random) -> float:
        return base + rng.randrange(10) * n

    def bounds(self, base: float, n: int) -> tuple[float, float]:
        return base, base + 9 * n


JITTERS: dict[str, Jitter] = {"none": Jitter(), "full": FullJitter(), "plus-minus": PlusMinusJitter()}


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Base of every policy. Subclasses give the nominal delay ``_base(n)`` for ``n >= 1``.

    ``max_attempts`` counts every attempt including the first (``None``: unlimited).
    ``non_retryable`` names error types that never retry: an exception class name (also any base
    class name, or a dotted ``module.Class``) or an AWS error code such as ``ValidationException``.
    """

    max_attempts: int | None = 1
    non_retryable: tuple[str, ...] = ()
    jitter: Jitter = field(default_factory=Jitter)
    max_delay: float | None = None

    kind = "abstract"

    def _base(self, n: int) -> float | _Stop:
        raise NotImplementedError

    def _stopped(self, n: int) -> bool:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise RetryPolicyError(f"n (attempts made so far) must be an integer >= 0, got {n!r}", field="n", value=n)
        return self.max_attempts is not None and n >= self.max_attempts

    def _cap(self, seconds: float) -> float:
        return min(seconds, self.max_delay) if self.max_delay is not None else seconds

    def nominal(self, n: int) -> float | _Stop:
        """The delay after ``n`` attempts without jitter, or ``STOP``."""
        if self._stopped(n):
            return STOP
        if n == 0:
            return self._first()
        base = self._base(n)
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
        """False for errors this policy lists as non-retryable, and always for policy errors."""
        if isinstance(error, RetryPolicyError):
            return False
        return not (error_names(error) & set(self.non_retryable))

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def describe(self) -> str:
        return self.kind

    def _common_json(self) -> dict[str, Any]:
        return {"nonRetryable": list(self.non_retryable)} if self.non_retryable else {}


def error_names(error: BaseException | str) -> set[str]:
    """Names an error answers to: class names (and dotted names) along its MRO, plus an AWS error code."""
    if isinstance(error, str):
        return {error}
    names: set[str] = set()
    for klass in type(error).__mro__:
        names.add(klass.__name__)
        names.add(f"{klass.__module__}.{klass.__qualname__}")
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = (response.get("Error") or {}).get("Code")
        if code:
            names.add(str(code))
    return names


@dataclass(frozen=True, kw_only=True)
class NoRetry(RetryPolicy):
    """``none``: one attempt, never retried."""

    kind = "none"

    def _base(self, n: int) -> float | _Stop:
        return STOP

    def to_json(self) -> dict[str, Any]:
        return {"kind": "none", **self._common_json()}


@dataclass(frozen=True, kw_only=True)
class FixedDelay(RetryPolicy):
    """``fixed(delay, max_attempts)``: the same wait before every retry."""

    seconds: float = 0.0
    kind = "fixed"

    def _base(self, n: int) -> float:
        return float(self.seconds)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "fixed", "delay": self.seconds, "maxAttempts": self.max_attempts, **self._common_json()}

    def describe(self) -> str:
        return f"fixed {_num(self.seconds)}s, {_attempts(self.max_attempts)}"


@dataclass(frozen=True, kw_only=True)
class Exponential(RetryPolicy):
    """``exponential(initial, coefficient, max_delay, max_attempts, jitter)``.

    ``delay(n) = min(initial * coefficient ** (n - 1), max_delay)`` for ``n >= 1``, then jitter
    (the result never exceeds ``max_delay``).
    """

    initial: float = 1.0
    coefficient: float = 2.0
    kind = "exponential"

    def _base(self, n: int) -> float:
        try:
            value = self.initial * self.coefficient ** (n - 1)
        except OverflowError:
            value = math.inf
        return value

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "exponential",
            "initial": self.initial,
            "coefficient": self.coefficient,
            "maxDelay": self.max_delay,
            "maxAttempts": self.max_attempts,
            "jitter": self.jitter.name,
        }
        if isinstance(self.jitter, PlusMinusJitter) and self.jitter.ratio != PlusMinusJitter().ratio:
            out["jitterRatio"] = self.jitter.ratio
        return {**out, **self._common_json()}

    def describe(self) -> str:
        cap = f", max {_num(self.max_delay)}s" if self.max_delay is not None else ""
        return (
            f"exponential {_num(self.initial)}s x{_num(self.coefficient)}{cap}, "
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

    def _base(self, n: int) -> float:
        try:
            return float(self.formula(n))
        except OverflowError:
            return math.inf

    def to_json(self) -> dict[str, Any]:
        return {"kind": "preset", "name": self.name, **self._common_json()}

    def describe(self) -> str:
        return f"preset {self.name}: {self.summary}"


@dataclass(frozen=True, kw_only=True)
class FunctionPolicy(RetryPolicy):
    """A user delay function named by a dotted path ``package.module:function``.

    The function gets ``n`` and returns seconds, or ``False``/``None``/``STOP`` for "do not
    retry". If it raises (anything, ``SystemExit`` and ``KeyboardInterrupt`` included) or returns
    anything else, ``delay`` raises ``DelayFunctionError`` naming the function: the caller must
    treat that as final, never as a reason to retry, and the process never exits because of it.
    """

    path: str = ""
    function: Callable[[int], Any] = field(default=lambda n: STOP, compare=False, repr=False)
    kind = "function"

    def _call(self, n: int) -> float | _Stop:
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

    def _base(self, n: int) -> float | _Stop:
        return self._call(n)

    def _first(self) -> float | _Stop:  # type: ignore[override]
        return self._call(0)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "function", "path": self.path, "maxAttempts": self.max_attempts, **self._common_json()}

    def describe(self) -> str:
        return f"function {self.path}, {_attempts(self.max_attempts)}"


# --------------------------------------------------------------------------------------------
# Constructors (validated)

_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*", re.ASCII)  # one name after ':', no walk

FUNCTIONS_ENV = "GROUNDSKEEPER_RETRY_FUNCTIONS"
"""Comma-separated module prefixes whose functions a ``function`` policy may name (the deployment
registers them). A run config or a run tag carries a policy, so without this list it could make the
run (or the sensor) call any importable function: ``os:_exit``."""


def registered_function_modules() -> tuple[str, ...]:
    """The module prefixes of ``GROUNDSKEEPER_RETRY_FUNCTIONS`` (empty: no function policy allowed)."""
    return tuple(p.strip() for p in os.environ.get(FUNCTIONS_ENV, "").split(",") if p.strip())


def _registered(module_name: str) -> bool:
    return any(module_name == p or module_name.startswith(p.rstrip(".") + ".") for p in registered_function_modules())


MAX_DELAY_SECONDS = 30 * 86_400
"""The longest wait a policy may give (30 days): a JSON policy is refused above it, and a delay
function that answers more fails as a policy error (a run waits, it does not wait forever)."""
MAX_COEFFICIENT = 100
MAX_ATTEMPTS = 10_000


def none(*, non_retryable: tuple[str, ...] | list[str] = ()) -> NoRetry:
    return NoRetry(max_attempts=1, non_retryable=_names(non_retryable))


def fixed(delay: float, max_attempts: int | None, *, non_retryable: tuple[str, ...] | list[str] = ()) -> FixedDelay:
    return FixedDelay(
        seconds=_seconds("delay", delay),
        max_attempts=_max_attempts("maxAttempts", max_attempts),
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
    non_retryable: tuple[str, ...] | list[str] = (),
) -> Exponential:
    initial = _seconds("initial", initial)
    if (
        isinstance(coefficient, bool)
        or not isinstance(coefficient, int | float)
        or not 1 <= coefficient <= MAX_COEFFICIENT
    ):
        raise RetryPolicyError(
            f"coefficient must be a number from 1 to {MAX_COEFFICIENT}, got {coefficient!r}",
            field="coefficient",
            value=coefficient,
        )
    if max_delay is not None:
        max_delay = _seconds("maxDelay", max_delay)
    if jitter not in JITTERS:
        raise RetryPolicyError(f"jitter must be one of {sorted(JITTERS)}, got {jitter!r}", field="jitter", value=jitter)
    if isinstance(jitter_ratio, bool) or not isinstance(jitter_ratio, int | float) or not 0 <= jitter_ratio <= 1:
        raise RetryPolicyError(
            f"jitterRatio must be a number in [0, 1], got {jitter_ratio!r}", field="jitterRatio", value=jitter_ratio
        )
    chosen = PlusMinusJitter(float(jitter_ratio)) if jitter == "plus-minus" else JITTERS[jitter]
    return Exponential(
        initial=initial,
        coefficient=float(coefficient),
        max_delay=max_delay,
        max_attempts=_max_attempts("maxAttempts", max_attempts),
        jitter=chosen,
        non_retryable=_names(non_retryable),
    )


def function(
    path: str, max_attempts: int | None = None, *, non_retryable: tuple[str, ...] | list[str] = ()
) -> FunctionPolicy:
    """Resolve ``package.module:function`` now, so a bad path fails when the policy is built.

    No part of the path starts with ``_`` (``pkg.__main__``, ``pkg._private``, ``:_exit``). The
    module is a registered module or one of its submodules, and the check never imports it: the
    registered module (the deployment's own name in ``GROUNDSKEEPER_RETRY_FUNCTIONS``) is imported,
    and the path's module must then be loaded already (the registered module itself, or a
    submodule it imports). The name after ``:`` is one attribute of that module (no dotted walk),
    and it must be a plain Python function defined in a registered module (its ``__module__``): not
    a builtin such as ``sys.exit`` or ``os.close`` that the module imported, nor a function it
    imported from an unregistered module, nor a class or another callable object. Anything raised
    while resolving it (``SystemExit`` included) is a ``RetryPolicyError``."""
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise RetryPolicyError(f"path must look like 'package.module:function', got {path!r}", field="path", value=path)
    module_name, _, attr = path.partition(":")
    if not _registered(module_name):
        registered = ", ".join(registered_function_modules()) or "none"
        raise RetryPolicyError(
            f"path {path!r} is not in a registered module: function policies may name only public functions "
            f"of the modules in {FUNCTIONS_ENV} (registered: {registered})",
            field="path",
            value=path,
        )
    if any(part.startswith("_") for part in [*module_name.split("."), attr]):
        raise RetryPolicyError(
            f"path {path!r} has a part that starts with '_' (a private module or name, or a package's "
            "__main__, which runs its command line): a function policy names a public function of a public module",
            field="path",
            value=path,
        )
    try:
        target = _resolve(path, module_name, attr)
    except RetryPolicyError:
        raise
    except BaseException as exc:  # SystemExit, KeyboardInterrupt...: a policy error, never an exit
        raise RetryPolicyError(
            f"path {path!r} cannot be resolved: {_type_and_message(exc)}", field="path", value=path
        ) from None
    return FunctionPolicy(
        path=path,
        function=target,
        max_attempts=_max_attempts("maxAttempts", max_attempts),
        non_retryable=_names(non_retryable),
    )


def _resolve(path: str, module_name: str, attr: str) -> Callable[[int], Any]:
    """The function ``path`` names, importing only the registered modules it is under."""
    for registered in (p.rstrip(".") for p in registered_function_modules()):
        if module_name == registered or module_name.startswith(registered + "."):
            try:
                importlib.import_module(registered)
            except BaseException as exc:  # a registered module that exits on import is a policy error
                raise RetryPolicyError(
                    f"path {path!r} cannot be imported: {_type_and_message(exc)} (importing {registered}, "
                    f"registered in {FUNCTIONS_ENV})",
                    field="path",
                    value=path,
                ) from None
    module = sys.modules.get(module_name)
    if module is None:
        raise RetryPolicyError(
            f"path {path!r}: {module_name} is not imported by its registered module, and a policy never imports "
            f"one: register {module_name} itself in {FUNCTIONS_ENV}",
            field="path",
            value=path,
        )
    target = vars(module).get(attr)  # the module's own namespace: no module __getattr__
    if target is None:
        raise RetryPolicyError(
            f"path {path!r} cannot be imported: no {attr!r} in {module_name}", field="path", value=path
        )
    if not inspect.isfunction(target) or not _registered(getattr(target, "__module__", None) or ""):
        raise RetryPolicyError(
            f"path {path!r} is not a function defined in a registered module ({_describe(target)}): "
            f"a function policy names a plain function defined in a module of {FUNCTIONS_ENV}",
            field="path",
            value=path,
        )
    return target


def _type_and_message(exc: BaseException) -> str:
    """``Type: message`` on one line, cut short."""
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


def _seconds(name: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or math.isnan(value)
        or not 0 <= value <= MAX_DELAY_SECONDS
    ):
        raise RetryPolicyError(
            f"{name} must be a number of seconds from 0 to {MAX_DELAY_SECONDS} (30 days), got {value!r}",
            field=name,
            value=value,
        )
    return float(value)


def _max_attempts(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS:
        raise RetryPolicyError(
            f"{name} must be an integer from 1 to {MAX_ATTEMPTS} (or null for unlimited), got {value!r}",
            field=name,
            value=value,
        )
    return value


def _names(values: Any) -> tuple[str, ...]:
    if (
        isinstance(values, str)
        or not isinstance(values, list | tuple)
        or not all(isinstance(v, str) and v for v in values)
    ):
        raise RetryPolicyError(
            f"nonRetryable must be a list of error type names, got {values!r}", field="nonRetryable", value=values
        )
    return tuple(values)


def _num(value: float | None) -> str:
    return "-" if value is None else (f"{value:g}")


def _attempts(max_attempts: int | None) -> str:
    return "unlimited attempts" if max_attempts is None else f"{max_attempts} attempts"
