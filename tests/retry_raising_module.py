"""A registered module whose import raises what ``RETRY_TEST_IMPORT_RAISES`` names (``SystemExit``,
``KeyboardInterrupt`` or ``Escape``, a ``BaseException`` that is neither), for the ``function``
policy tests: resolving a function of it must be a policy error, never an exit."""

import os

from tests.retry_delay_functions import Escape


def delay(n: int) -> float:
    return 1.0


_RAISED = {"SystemExit": SystemExit(2), "KeyboardInterrupt": KeyboardInterrupt(), "Escape": Escape("at import")}
raise _RAISED[os.environ.get("RETRY_TEST_IMPORT_RAISES", "SystemExit")]
