"""The local AWS: moto's server, plus the CloudFormation resource types the template uses that moto
does not deploy on its own.

moto 5 deploys ``AWS::CloudWatch::Alarm`` as nothing (it warns and skips it), so the template's
alarms would exist in production only. :class:`MetricAlarm` makes moto's CloudFormation create them
in moto's CloudWatch, with their actions, dimensions and ``TreatMissingData``, so that ``make dev``
and the tests deploy the same template as production, alarms included.

Run as ``python -m infra.moto_server -H 127.0.0.1 -p <port>`` (moto's server arguments).
"""

from __future__ import annotations

import sys
from typing import Any

from moto.cloudwatch.models import cloudwatch_backends
from moto.core.common_models import CloudFormationModel


class MetricAlarm(CloudFormationModel):
    """``AWS::CloudWatch::Alarm`` (a metric alarm) in moto's CloudFormation: ``put_metric_alarm``."""

    __module__ = "moto.cloudwatch.models"  # moto files each model under the service its module names

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def physical_resource_id(self) -> str:
        return self.name

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::CloudWatch::Alarm"

    @staticmethod
    def cloudformation_name_type() -> str:
        return "AlarmName"

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[misc]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kwargs: Any
    ) -> MetricAlarm:
        p = cloudformation_json["Properties"]
        name = p.get("AlarmName") or resource_name
        cloudwatch_backends[account_id][region_name].put_metric_alarm(
            name=name,
            namespace=p["Namespace"],
            metric_name=p["MetricName"],
            comparison_operator=p["ComparisonOperator"],
            evaluation_periods=int(p["EvaluationPeriods"]),
            period=int(p["Period"]),
            threshold=float(p["Threshold"]),
            statistic=p.get("Statistic"),
            description=p.get("AlarmDescription", ""),
            dimensions=list(p.get("Dimensions", [])),
            alarm_actions=list(p.get("AlarmActions", [])),
            ok_actions=list(p.get("OKActions", [])),
            treat_missing_data=p.get("TreatMissingData"),
        )
        return cls(name)

    @classmethod
    def update_from_cloudformation_json(  # type: ignore[misc]
        cls, original_resource: Any, new_resource_name: str, cloudformation_json: dict[str, Any], account_id: str,
        region_name: str,
    ) -> MetricAlarm:  # fmt: skip
        cls.delete_from_cloudformation_json(original_resource.name, cloudformation_json, account_id, region_name)
        return cls.create_from_cloudformation_json(new_resource_name, cloudformation_json, account_id, region_name)

    @classmethod
    def delete_from_cloudformation_json(  # type: ignore[misc]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        cloudwatch_backends[account_id][region_name].delete_alarms([resource_name])


def main(argv: list[str] | None = None) -> None:
    from moto.server import main as moto_main

    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
