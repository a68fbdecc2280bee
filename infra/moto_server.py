"""The local AWS: moto's server, plus the CloudFormation resource types the template uses that moto
does not deploy on its own.

moto 5 deploys a resource type it has no CloudFormation model for as nothing (it warns and skips
it), so those resources would exist in production only. Each model here makes moto's CloudFormation
create the resource through moto's own API of that service, so that ``make dev`` and the tests
deploy the same template as production and can describe what it made:

- ``AWS::CloudWatch::Alarm`` (:class:`MetricAlarm`): ``put_metric_alarm``, with actions, dimensions
  and ``TreatMissingData``;
- ``AWS::SecretsManager::Secret`` (:class:`GeneratedSecret`): ``create_secret``, its value made as
  ``GenerateSecretString`` says (moto's ``get_random_password``). moto does not resolve a
  ``{{resolve:secretsmanager:...}}`` dynamic reference: a property holding one reaches moto as that text;
- ``AWS::ServiceDiscovery::PrivateDnsNamespace`` and ``AWS::ServiceDiscovery::Service``
  (:class:`PrivateDnsNamespace`, :class:`DiscoveryService`): Cloud Map's ``create_private_dns_namespace``
  and ``create_service``.

One model of moto's own is mended: ``AWS::KMS::Key`` keeps its ``KeyPolicy`` as the template's
mapping, where moto's KMS API expects the policy's JSON text (every call naming the key failed with
an internal error): :func:`_key_policy_as_text` hands moto the text.

Run as ``python -m infra.moto_server -H 127.0.0.1 -p <port>`` (moto's server arguments).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from moto.cloudwatch.models import cloudwatch_backends
from moto.core.common_models import CloudFormationModel
from moto.kms.models import Key
from moto.secretsmanager.models import secretsmanager_backends
from moto.servicediscovery.models import servicediscovery_backends


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


class GeneratedSecret(CloudFormationModel):
    """``AWS::SecretsManager::Secret`` in moto's CloudFormation: ``create_secret``; ``Ref`` is its ARN."""

    __module__ = "moto.secretsmanager.models"

    def __init__(self, arn: str, name: str) -> None:
        self.arn = arn
        self.name = name

    @property
    def physical_resource_id(self) -> str:
        return self.arn

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::SecretsManager::Secret"

    @staticmethod
    def cloudformation_name_type() -> str:
        return "Name"

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr == "Id"

    def get_cfn_attribute(self, attribute_name: str) -> str:
        if attribute_name == "Id":
            return self.arn
        raise NotImplementedError(f"{{0}} has no attribute {attribute_name} here")

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[misc]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kwargs: Any
    ) -> GeneratedSecret:
        p = cloudformation_json["Properties"]
        backend = secretsmanager_backends[account_id][region_name]
        value = p.get("SecretString")
        generate = p.get("GenerateSecretString")
        if generate is not None:
            password = backend.get_random_password(
                password_length=int(generate.get("PasswordLength", 32)),
                exclude_characters=generate.get("ExcludeCharacters", ""),
                exclude_numbers=bool(generate.get("ExcludeNumbers", False)),
                exclude_punctuation=bool(generate.get("ExcludePunctuation", False)),
                exclude_uppercase=bool(generate.get("ExcludeUppercase", False)),
                exclude_lowercase=bool(generate.get("ExcludeLowercase", False)),
                include_space=bool(generate.get("IncludeSpace", False)),
                require_each_included_type=bool(generate.get("RequireEachIncludedType", True)),
            )
            password = json.loads(password)["RandomPassword"]  # the API's response body
            if "SecretStringTemplate" in generate:
                document = json.loads(generate["SecretStringTemplate"])
                document[generate["GenerateStringKey"]] = password
                value = json.dumps(document)
            else:
                value = password
        name = p.get("Name") or resource_name
        backend.create_secret(
            name=name,
            secret_string=value,
            secret_binary=None,
            description=p.get("Description"),
            tags=p.get("Tags"),
            kms_key_id=p.get("KmsKeyId"),
            client_request_token=None,
            replica_regions=[],
            force_overwrite=False,
        )
        return cls(backend.describe_secret(name).arn, name)

    @classmethod
    def delete_from_cloudformation_json(  # type: ignore[misc]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        backend = secretsmanager_backends[account_id][region_name]
        backend.delete_secret(resource_name, recovery_window_in_days=None, force_delete_without_recovery=True)


class PrivateDnsNamespace(CloudFormationModel):
    """``AWS::ServiceDiscovery::PrivateDnsNamespace`` in moto's CloudFormation: Cloud Map's
    ``create_private_dns_namespace``; ``Ref`` and ``Id`` are its id."""

    __module__ = "moto.servicediscovery.models"

    def __init__(self, namespace: Any) -> None:
        self.namespace = namespace

    @property
    def physical_resource_id(self) -> str:
        return self.namespace.id

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::ServiceDiscovery::PrivateDnsNamespace"

    @staticmethod
    def cloudformation_name_type() -> str:
        return "Name"

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr in ("Id", "Arn", "HostedZoneId")

    def get_cfn_attribute(self, attribute_name: str) -> str:
        if attribute_name == "Id":
            return self.namespace.id
        if attribute_name == "Arn":
            return self.namespace.arn
        if attribute_name == "HostedZoneId":
            return self.namespace.dns_properties["HostedZoneId"]
        raise NotImplementedError(f"{{0}} has no attribute {attribute_name} here")

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[misc]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kwargs: Any
    ) -> PrivateDnsNamespace:
        p = cloudformation_json["Properties"]
        backend = servicediscovery_backends[account_id][region_name]
        name = p.get("Name") or resource_name
        backend.create_private_dns_namespace(
            name=name,
            creator_request_id=kwargs.get("LogicalId", resource_name),
            description=p.get("Description", ""),
            vpc=p["Vpc"],
            tags=p.get("Tags", []),
            properties=p.get("Properties", {}),
        )
        (namespace,) = [ns for ns in backend.list_namespaces() if ns.name == name and ns.vpc == p["Vpc"]]
        return cls(namespace)

    @classmethod
    def delete_from_cloudformation_json(  # type: ignore[misc]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        servicediscovery_backends[account_id][region_name].delete_namespace(resource_name)


class DiscoveryService(CloudFormationModel):
    """``AWS::ServiceDiscovery::Service`` in moto's CloudFormation: Cloud Map's ``create_service``;
    ``Ref`` and ``Id`` are its id."""

    __module__ = "moto.servicediscovery.models"

    def __init__(self, service: Any) -> None:
        self.service = service

    @property
    def physical_resource_id(self) -> str:
        return self.service.id

    @staticmethod
    def cloudformation_type() -> str:
        return "AWS::ServiceDiscovery::Service"

    @staticmethod
    def cloudformation_name_type() -> str:
        return "Name"

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr in ("Id", "Arn", "Name")

    def get_cfn_attribute(self, attribute_name: str) -> str:
        if attribute_name in ("Id", "Arn", "Name"):
            return getattr(self.service, attribute_name.lower())
        raise NotImplementedError(f"{{0}} has no attribute {attribute_name} here")

    @classmethod
    def create_from_cloudformation_json(  # type: ignore[misc]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kwargs: Any
    ) -> DiscoveryService:
        p = cloudformation_json["Properties"]
        backend = servicediscovery_backends[account_id][region_name]
        service = backend.create_service(
            name=p.get("Name") or resource_name,
            namespace_id=p["NamespaceId"],
            creator_request_id=kwargs.get("LogicalId", resource_name),
            description=p.get("Description", ""),
            dns_config=p.get("DnsConfig"),
            health_check_config=p.get("HealthCheckConfig"),
            health_check_custom_config=p.get("HealthCheckCustomConfig"),
            tags=p.get("Tags", []),
            service_type=p.get("Type"),
        )
        return cls(service)

    @classmethod
    def delete_from_cloudformation_json(  # type: ignore[misc]
        cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str
    ) -> None:
        servicediscovery_backends[account_id][region_name].delete_service(resource_name)


_create_key = Key.create_from_cloudformation_json.__func__


def _key_policy_as_text(
    cls, resource_name: str, cloudformation_json: dict[str, Any], account_id: str, region_name: str, **kwargs: Any
) -> Key:
    """moto's ``Key.create_from_cloudformation_json``, given the key policy as JSON text."""
    props = cloudformation_json["Properties"]
    if isinstance(props.get("KeyPolicy"), dict):
        cloudformation_json = {
            **cloudformation_json,
            "Properties": {**props, "KeyPolicy": json.dumps(props["KeyPolicy"])},
        }
    return _create_key(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)


Key.create_from_cloudformation_json = classmethod(_key_policy_as_text)  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    from moto.server import main as moto_main

    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
