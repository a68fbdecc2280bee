"""User delay functions for the ``function`` policy tests (named by dotted path).

Like many real modules, this one imports ``os``, ``sys`` and ``time`` and a function of another
module: a policy may name none of them (``tests.retry_delay_functions:sys.exit``,
``...:time.sleep``, ``...:imported_helper``), only the functions defined here.
"""

import os
import sys  # noqa: F401 - a registered module's imports are not delay functions
import time
from json import dumps as imported_helper  # noqa: F401

close = os.close  # a builtin bound to a public name of this module
sleep = time.sleep


def linear(n: int) -> float | bool:
    """10 s per attempt made; no retry after 3 attempts."""
    return 10 * n if n < 3 else False


def broken(n: int) -> float:
    if n >= 2:
        raise ZeroDivisionError("division by zero")
    return 1.0


def negative(n: int) -> float:
    return -5


def endless(n: int) -> float:
    return float("inf")


class Escape(BaseException):
    """Neither an ``Exception`` nor ``SystemExit``/``KeyboardInterrupt``."""


def exits(n: int) -> float:
    raise SystemExit(n)


def interrupted(n: int) -> float:
    raise KeyboardInterrupt


def escapes(n: int) -> float:
    raise Escape(f"escaped at n={n}")


NOT_CALLABLE = 42
