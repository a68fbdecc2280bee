"""IAM helpers for the tests: the template's policies as deployed, IAM matching, and the code's AWS calls.

- ``template_policies(params)``: every ``AWS::IAM::ManagedPolicy`` of ``infra/template.yaml`` whose
  Condition holds, with its intrinsic functions resolved for an account, region and parameters
  (``Ref``, ``Fn::Sub``, ``Fn::GetAtt ... Arn``, ``Fn::Join``, ``Fn::Equals``, ``Fn::Not``,
  ``Fn::And``, ``Fn::Or``, ``Fn::If``), so
  ARNs come from the template's own resource names.
- ``allowed_by(statement, request)``: IAM's matching of one Allow statement: action (case-insensitive)
  and resource (case-sensitive) with the ``*`` and ``?`` wildcards, and the condition operators the
  template uses, evaluated on the request's context values. Anything else raises, so a new operator
  is a test failure, not a silent pass.
- ``code_calls()``: every boto3 client call under ``pipelines/``, ``resources/`` and ``sensors/``:
  for each service the code builds a client for, botocore's operation names in snake case, found as
  ``.<op>(`` or ``get_paginator("<op>")``, plus the calls made through ``getattr(<client>, ...)``.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore
import botocore.session

from infra.deploy import TEMPLATE_PATH

ROOT = Path(__file__).resolve().parent.parent
ACCOUNT = "123456789012"  # moto's default account
REGION = "us-east-1"
PARTITION = "aws"
SCANNED = ("pipelines", "resources", "sensors")


# ------------------------------------------------------------------------------------ template


def load_template(text: str | None = None) -> dict[str, Any]:
    from cfnlint.decode import decode_str

    template, errors = decode_str(text if text is not None else TEMPLATE_PATH.read_text())
    assert not errors, errors
    return template


@dataclass
class Stack:
    """The template resolved for one account, region and set of parameters."""

    template: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        values: dict[str, Any] = {}
        for name, spec in self.template.get("Parameters", {}).items():
            raw = self.params.get(name, spec.get("Default"))
            assert raw is not None, f"template parameter {name} has no default: give it"
            values[name] = str(raw).split(",") if spec["Type"] == "CommaDelimitedList" else str(raw)
        values.update({"AWS::AccountId": ACCOUNT, "AWS::Region": REGION, "AWS::Partition": PARTITION})
        values["AWS::NoValue"] = None
        self.values = values

    def resource(self, logical_id: str) -> dict[str, Any]:
        return self.template["Resources"][logical_id]

    def name(self, logical_id: str) -> str:
        """The physical name (``Ref`` of a table, bucket or policy; the queue name of a queue)."""
        res = self.resource(logical_id)
        key = {
            "AWS::DynamoDB::Table": "TableName",
            "AWS::SQS::Queue": "QueueName",
            "AWS::S3::Bucket": "BucketName",
            "AWS::IAM::ManagedPolicy": "ManagedPolicyName",
            "AWS::SNS::Topic": "TopicName",
            "AWS::IAM::Role": "RoleName",
            "AWS::ECS::Cluster": "ClusterName",
            "AWS::SecretsManager::Secret": "Name",
        }[res["Type"]]
        return self.resolve(res["Properties"][key])

    def arn(self, logical_id: str) -> str:
        kind = self.resource(logical_id)["Type"]
        if kind == "AWS::KMS::Key":  # named by the id KMS gives it: the logical id stands for it here
            return f"arn:{PARTITION}:kms:{REGION}:{ACCOUNT}:key/{logical_id}"
        name = self.name(logical_id)
        return {
            "AWS::DynamoDB::Table": f"arn:{PARTITION}:dynamodb:{REGION}:{ACCOUNT}:table/{name}",
            "AWS::SQS::Queue": f"arn:{PARTITION}:sqs:{REGION}:{ACCOUNT}:{name}",
            "AWS::S3::Bucket": f"arn:{PARTITION}:s3:::{name}",
            "AWS::SNS::Topic": f"arn:{PARTITION}:sns:{REGION}:{ACCOUNT}:{name}",
            "AWS::IAM::Role": f"arn:{PARTITION}:iam::{ACCOUNT}:role/{name}",
            "AWS::ECS::Cluster": f"arn:{PARTITION}:ecs:{REGION}:{ACCOUNT}:cluster/{name}",
            # Secrets Manager appends six random characters to a secret's name in its ARN.
            "AWS::SecretsManager::Secret": f"arn:{PARTITION}:secretsmanager:{REGION}:{ACCOUNT}:secret:{name}-AbCdEf",
        }[kind]

    def condition(self, name: str) -> bool:
        return bool(self.resolve(self.template["Conditions"][name]))

    def exists(self, logical_id: str) -> bool:
        """The resource is created with these parameters (no Condition, or a true one)."""
        condition = self.resource(logical_id).get("Condition")
        return condition is None or self.condition(condition)

    def resolve(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.resolve(n) for n in node]
        if not isinstance(node, dict):
            return node
        if len(node) != 1 or not next(iter(node)).startswith(("Ref", "Fn::", "Condition")):
            return {k: self.resolve(v) for k, v in node.items()}
        ((fn, arg),) = node.items()
        if fn == "Ref":
            if arg in self.values:
                return self.values[arg]
            # Ref of a topic or secret is its ARN; of a table, bucket, policy, queue, role or cluster, its
            # name (as resolved here)
            by_arn = ("AWS::SNS::Topic", "AWS::SecretsManager::Secret")
            return self.arn(arg) if self.resource(arg)["Type"] in by_arn else self.name(arg)
        if fn == "Fn::GetAtt":
            logical_id, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
            assert attribute == "Arn", f"Fn::GetAtt {logical_id}.{attribute} is not resolved here"
            return self.arn(logical_id)
        if fn == "Fn::Sub":
            text, extra = (arg, {}) if isinstance(arg, str) else (arg[0], self.resolve(arg[1]))

            def sub(match: re.Match) -> str:
                ref = match[1]
                if ref in extra:
                    return str(extra[ref])
                if ref.endswith(".Arn"):
                    return self.arn(ref[: -len(".Arn")])
                return str(self.resolve({"Ref": ref}))

            return re.sub(r"\$\{([^}!]+)\}", sub, text)
        if fn == "Fn::Join":
            return arg[0].join(str(x) for x in self.resolve(arg[1]))
        if fn == "Fn::Equals":
            left, right = self.resolve(arg)
            return left == right
        if fn == "Fn::Not":
            return not self.resolve(arg[0])
        if fn == "Fn::And":
            return all(self.resolve(a) for a in arg)
        if fn == "Fn::Or":
            return any(self.resolve(a) for a in arg)
        if fn == "Condition":
            return self.condition(arg)
        if fn == "Fn::If":
            name, then, otherwise = arg
            return self.resolve(then if self.condition(name) else otherwise)
        raise AssertionError(f"intrinsic function {fn} is not resolved here")

    def role_policies(self, role: str) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
        """What a role of the template may do: ``({policy: statements}, [AWS managed policy ARNs])``,
        the policies being the stack's managed policies that name the role in ``Roles`` and the
        role's own inline ``Policies`` (as ``<role>/<PolicyName>``)."""
        assert self.exists(role), f"{role} is not created with these parameters"
        role_name = self.name(role)
        own: dict[str, list[dict[str, Any]]] = {}
        for logical_id, res in self.template["Resources"].items():
            if res["Type"] == "AWS::IAM::ManagedPolicy" and self.exists(logical_id):
                roles = self.resolve(res["Properties"].get("Roles"))
                if isinstance(roles, list) and role_name in roles:
                    own[logical_id] = self.policies()[logical_id]
        props = self.resource(role)["Properties"]
        for inline in props.get("Policies", []):
            statements = self.resolve(inline["PolicyDocument"])["Statement"]
            own[f"{role}/{inline['PolicyName']}"] = statements if isinstance(statements, list) else [statements]
        return own, [self.resolve(arn) for arn in props.get("ManagedPolicyArns", [])]

    def policies(self) -> dict[str, list[dict[str, Any]]]:
        """Logical id -> statements of every managed policy this stack creates."""
        out = {}
        for logical_id, res in self.template["Resources"].items():
            if res["Type"] != "AWS::IAM::ManagedPolicy":
                continue
            if "Condition" in res and not self.condition(res["Condition"]):
                continue
            document = self.resolve(res["Properties"]["PolicyDocument"])
            statements = document["Statement"]
            out[logical_id] = statements if isinstance(statements, list) else [statements]
        return out


# ------------------------------------------------------------------------------------ matching


@dataclass(frozen=True)
class Request:
    """What one call asks IAM for: an action on a resource, with the context keys the call sets."""

    action: str
    resource: str
    context: tuple[tuple[str, Any], ...] = ()

    def __str__(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in self.context)
        return f"{self.action} on {self.resource}{extra}"


def request(action: str, resource: str = "*", context: dict[str, Any] | None = None) -> Request:
    return Request(
        action, resource, tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in (context or {}).items()))
    )


def iam_match(pattern: str, value: str, *, case: bool = True) -> bool:
    """IAM's wildcard match: ``*`` any run of characters (also ``/`` and ``:``), ``?`` one character."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case else re.IGNORECASE) is not None


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _string_test(operator: str):
    if operator == "StringEquals":
        return lambda want, got: want == got
    if operator == "StringLike":
        return lambda want, got: fnmatch.fnmatchcase(got, want)
    raise AssertionError(f"condition operator {operator} is not evaluated here")


def conditions_hold(conditions: dict[str, Any], context: dict[str, Any]) -> bool:
    context = {k: list(v) if isinstance(v, tuple) else v for k, v in context.items()}
    for operator, tests in conditions.items():
        for key, wanted in tests.items():
            wanted = [str(w) for w in _as_list(wanted)]
            if operator == "Null":
                assert wanted in (["true"], ["false"]), wanted
                if (key not in context) != (wanted == ["true"]):
                    return False
                continue
            qualifier, _, base = operator.rpartition(":")
            test = _string_test(base)
            if qualifier == "ForAllValues":  # every value the request sends is allowed (none sent: true)
                if not all(any(test(w, v) for w in wanted) for v in _as_list(context.get(key, []))):
                    return False
            elif qualifier == "ForAnyValue":
                if not any(test(w, v) for w in wanted for v in _as_list(context.get(key, []))):
                    return False
            elif qualifier == "":
                if key not in context or not any(test(w, str(context[key])) for w in wanted):
                    return False
            else:
                raise AssertionError(f"condition qualifier {qualifier} is not evaluated here")
    return True


def allowed_by(statement: dict[str, Any], req: Request) -> bool:
    unsupported = {"NotAction", "NotResource", "Principal", "NotPrincipal"} & set(statement)
    assert not unsupported, f"statement not evaluated here: {statement}"
    assert statement["Effect"] == "Allow", f"statement not evaluated here: {statement}"
    if not any(iam_match(a, req.action, case=False) for a in _as_list(statement["Action"])):
        return False
    if not any(iam_match(r, req.resource) for r in _as_list(statement["Resource"])):
        return False
    return conditions_hold(statement.get("Condition", {}), dict(req.context))


# ------------------------------------------------------------------------------------ code scan

# The clients the code builds: resources/clients.py's service_name, plus the two dagster-aws resources.
DAGSTER_AWS_SERVICES = {"S3Resource": "s3", "SSMResource": "ssm"}
# boto3's own additions to the clients (not in botocore's models).
BOTO3_INJECTED = {"s3": ("upload_file", "upload_fileobj", "download_file", "download_fileobj", "copy_object")}


def _sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for top in SCANNED for p in sorted((ROOT / top).rglob("*.py"))}


def client_services(sources: dict[str, str] | None = None) -> set[str]:
    """Every service the code builds a client for."""
    sources = sources if sources is not None else _sources()
    found = set()
    for text in sources.values():
        found.update(re.findall(r"service_name: ClassVar\[str\] = \"([a-z0-9-]+)\"", text))
        found.update(re.findall(r"\.client\(\s*[\"']([a-z0-9-]+)[\"']", text))
        found.update(svc for cls, svc in DAGSTER_AWS_SERVICES.items() if re.search(rf"\b{cls}\b", text))
    return found


def code_calls(sources: dict[str, str] | None = None) -> dict[tuple[str, str], list[str]]:
    """(service, Operation) -> ["path:line", ...] for every call of a botocore operation in the code.

    A call through ``getattr(<client>, ...)`` is reported as ``(service, "getattr")``: the table of
    dynamic calls says which operations it makes.
    """
    sources = sources if sources is not None else _sources()
    session = botocore.session.get_session()
    calls: dict[tuple[str, str], list[str]] = {}

    def add(key: tuple[str, str], path: str, text: str, pos: int) -> None:
        calls.setdefault(key, []).append(f"{path}:{text.count(chr(10), 0, pos) + 1}")

    for service in sorted(client_services(sources)):
        operations = {botocore.xform_name(op): op for op in session.get_service_model(service).operation_names}
        operations.update({m: m for m in BOTO3_INJECTED.get(service, ())})
        names = "|".join(sorted(operations, key=len, reverse=True))
        pattern = re.compile(rf"\.({names})\(|get_paginator\(\s*[\"']({names})[\"']")
        dynamic = re.compile(rf"getattr\(\s*(?:self\.|ctx\.)?{service}\b")
        for path, text in sources.items():
            for match in pattern.finditer(text):
                add((service, operations[match[1] or match[2]]), path, text, match.start())
            for match in dynamic.finditer(text):
                add((service, "getattr"), path, text, match.start())
    return calls
