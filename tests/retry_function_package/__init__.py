"""A registered package of delay functions with a command line (``python -m``), for the
``function`` policy tests: its ``__main__`` runs the command line when imported (as many packages'
do), and so do ``_private`` and ``tool``, which the package itself never imports."""


def delay(n: int) -> float:
    """5 s per attempt made."""
    return 5.0 * n
