"""Metrics after a committed change: a failed publish is a warning and ``metrics_published: false``."""

from typing import Any

from pipelines.retry.classify import classify_aws_error
from resources.clients import explain_aws_error


class CommittedChangeMetrics:
    """The CloudWatch client that plain code gets, for ``put_metrics``: a retried op would redo the
    committed work, so a failure is only a warning. Calls go to ``METRICS_SINK`` (or none)."""

    def __init__(self, context: Any, cloudwatch: Any, what: str) -> None:
        self._log = context.log
        self._what = what
        self._client = cloudwatch.get_client() if cloudwatch.metrics_sink == "cloudwatch" else None
        self.failures = 0

    def put_metric_data(self, **request: Any) -> dict[str, Any]:
        """One ``PutMetricData`` to the sink (none: no call); an error goes to ``put_metrics``' retry."""
        return {} if self._client is None else self._client.put_metric_data(**request)

    def not_published(self, exc: BaseException) -> None:
        """A call still failing after ``put_metrics``' retries: one warning (the first), then counted."""
        self.failures += 1
        if self.failures == 1:
            reason = explain_aws_error(exc) or classify_aws_error(exc).reason
            self._log.warning(
                f"{self._what}: metrics not published to CloudWatch ({reason}); what the run changed is "
                "committed, the run goes on (metadata metrics_published: false)"
            )

    @property
    def published(self) -> bool:
        return self._client is not None and self.failures == 0
