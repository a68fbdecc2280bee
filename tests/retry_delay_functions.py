"""User delay functions for the ``function`` policy tests (named by dotted path)."""


def linear(n: int) -> float | bool:
    """10 s per attempt made; no retry after 3 attempts."""
    return 10 * n if n < 3 else False


def broken(n: int) -> float:
    if n >= 2:
        raise ZeroDivisionError("division by zero")
    return 1.0


def negative(n: int) -> float:
    return -5


NOT_CALLABLE = 42
