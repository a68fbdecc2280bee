"""Metrics published after a committed change: :class:`CommittedChangeMetrics`, the one rule.

They go to the deployment's metrics sink (CloudWatch or none), and a failed publish is a warning
in the run log plus the metadata flag ``metrics_published: false``, never a failed run.
"""

from __future__ import annotations

from typing import Any

from pipelines.retry.classify import classify_aws_error
from resources.errors import explain_aws_error


class CommittedChangeMetrics:
    """The metrics client a capability's plain-Python code gets instead of the CloudWatch client.

    Metrics come after the change they count has committed (a collection, a reclaim, terminated
    instances), so a metrics failure must not fail the run: a retried op would redo that work, and a
    deployment without AWS would never succeed. ``put_metric_data`` goes to the deployment's metrics
    sink (the ``cloudwatch`` resource's ``metrics_sink``, ``METRICS_SINK``): CloudWatch, or none (no
    call at all). It is used through the toolkit's ``put_metrics``, whose policy is the one retry of
    each call; a call still failing after it is :meth:`not_published`: one warning in the run log (the
    first; later ones are counted) and the run goes on. :attr:`published` is the
    ``metrics_published`` metadata flag."""

    def __init__(self, context: Any, cloudwatch: Any, what: str) -> None:
        self._log = context.log
        self._what = what
        self.sink = cloudwatch.metrics_sink
        self._client = cloudwatch.get_client() if self.sink == "cloudwatch" else None
        self.calls = 0
        self.failures = 0

    def put_metric_data(self, **request: Any) -> dict[str, Any]:
        """One ``PutMetricData`` to the sink (none: no call); an error goes to ``put_metrics``' retry."""
        if self._client is None:
            return {}
        response = self._client.put_metric_data(**request)
        self.calls += 1
        return response

    def not_published(self, exc: BaseException) -> None:
        """A call still failing after ``put_metrics``' retries: the change is committed, the metrics
        are not worth a failed run."""
        self.failures += 1
        if self.failures == 1:
            reason = explain_aws_error(exc) or classify_aws_error(exc).reason
            self._log.warning(
                f"{self._what}: metrics not published to CloudWatch ({reason}); what the run changed is "
                "committed, the run goes on (metadata metrics_published: false)"
            )

    @property
    def published(self) -> bool:
        """Every call went through (False when the sink is none or a call failed)."""
        return self._client is not None and self.failures == 0
