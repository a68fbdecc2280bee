"""A public module the package never imports: importing it exits, as its ``__main__`` does."""


def delay(n: int) -> float:
    return 1.0


raise SystemExit("the tool ran")
