"""Deleting the runners' SSM parameters (the ``stale_ssm`` and termination clean-up): ``DeleteParameters``
in tens, retried by runs-fleet's policy. (Run config parameters are ``pipelines.common.params``.)"""

from __future__ import annotations

from collections.abc import Sequence

from pipelines.common.aws_batches import chunks
from pipelines.fleet.calls import aws_call


def delete_parameters(ssm, names: Sequence[str]) -> dict[str, int]:
    """``DeleteParameters`` in tens. A parameter that is already gone counts as ``missing``, not an error."""
    counts = {"deleted": 0, "missing": 0}
    for batch in chunks(sorted(set(names)), 10):
        response = aws_call(lambda batch=batch: ssm.delete_parameters(Names=list(batch)), what="DeleteParameters")
        counts["deleted"] += len(response.get("DeletedParameters", []))
        counts["missing"] += len(response.get("InvalidParameters", []))
    return counts
