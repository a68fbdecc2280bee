"""Private to the package: importing it exits, as its ``__main__`` does."""


def delay(n: int) -> float:
    return 1.0


raise SystemExit("a private module ran")
