"""Outside values that become a path, key or name are checked by full match: ``$`` also matches
before a final newline, so ``"i-0000000a\\n"`` passed the instance-id check and reached SSM."""

import ast
from pathlib import Path

import pytest

from pipelines.batching.schedule import HHMM, RECEIVER_NAME
from pipelines.fleet.messages import INSTANCE_ID_RE, RUNNER_PARAMETER_RE
from pipelines.reclaim.params import TABLE_NAME_RE
from pipelines.reclaim.targets import NAME_RE
from pipelines.retry.policy import _PATH

ROOT = Path(__file__).resolve().parent.parent
RE_CALLS = {"compile", "match", "search", "fullmatch"}


def _patterns(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in RE_CALLS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def test_no_pattern_in_pipelines_ends_with_a_dollar():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {pattern}"
        for path in sorted((ROOT / "pipelines").rglob("*.py"))
        for line, pattern in _patterns(path)
        if pattern.endswith("$") and not pattern.endswith("\\$")
    ]
    assert not found, "use re.fullmatch or \\Z: " + "; ".join(found)


def _full(pattern, text: str) -> bool:
    """What the code asks of the pattern (``fullmatch`` for the fleet's and reclaim's names and the
    retry function paths, ``match`` with ``\\Z`` for the others)."""
    return bool(
        pattern.fullmatch(text)
        if pattern in (INSTANCE_ID_RE, RUNNER_PARAMETER_RE, NAME_RE, _PATH)
        else pattern.match(text)
    )


@pytest.mark.parametrize(
    "pattern, good",
    [
        (INSTANCE_ID_RE, "i-0000000a"),
        (RUNNER_PARAMETER_RE, "/runs-fleet/runners/i-0000000a/config"),
        (RECEIVER_NAME, "receiver-1"),
        (HHMM, "09:30"),
        (TABLE_NAME_RE, "agenda_progress"),
        (NAME_RE, "agenda_1"),
        (_PATH, "tests.retry_delay_functions:linear"),
    ],
)
def test_a_trailing_newline_is_refused(pattern, good):
    assert _full(pattern, good)
    assert not _full(pattern, good + "\n")
