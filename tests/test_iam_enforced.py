"""Every prod job runs as an IAM user that holds only the template's managed policies (moto enforcing IAM).

moto's enforcement (``POST /moto-api/reset-auth`` with ``0``: every later request is authenticated
and authorised) differs from AWS in three ways, handled here and covered by ``test_iam_static``:

- it denies any statement with a Condition (it cannot evaluate them), so the user holds a copy of
  the policies with the Conditions removed; ``test_iam_static`` checks the Conditions (tag keys,
  managed instances, metric namespace) against what the code sends;
- it checks resource ARNs only for SQS, S3 and IAM; for the other services it asks whether the
  statement's Resource matches the literal ``*``, so the copy's statements for those services name
  ``*``. Their ARNs (tables, indexes, runner parameters, the KMS key) are checked statically;
- it authorises the operation name, signed with the client's signing name (``monitoring:`` for
  CloudWatch, ``sqs:DeleteMessageBatch``, ``dynamodb:TransactWriteItems``), where AWS authorises
  the IAM action (``cloudwatch:PutMetricData``, ``sqs:DeleteMessage``, each item's own action). The
  copy adds to a statement the operation names of exactly the calls that ``test_iam_static``'s
  table says the statement allows on AWS.

Auth is switched back off in a ``finally``, so the other tests of this moto server (this xdist
worker) run unauthenticated as before.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import urllib.request
from contextlib import contextmanager

import boto3
import botocore.client
import botocore.session
import dagster as dg
import pytest
from botocore.exceptions import ClientError

from infra.demo.traffic import DemoConfig, DemoTargets, run_demo_traffic
from tests.conftest import PATIENCE
from tests.iam_support import Stack, allowed_by, load_template
from tests.test_iam_static import ECS_PARAMS, calls, sensor_calls

MOTO_CHECKS_ARNS = {"sqs", "s3", "iam"}
DENIED = ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation")


def _reset_auth(endpoint: str, count: str) -> None:
    # text/plain: a form content type would make moto's Flask read the body as a form, and see none.
    headers = {"Content-Type": "text/plain"}
    req = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count.encode(), headers=headers, method="POST")
    urllib.request.urlopen(req, timeout=PATIENCE).read()


@functools.cache  # each lookup loads the service's model: once per service, not once per action
def _signing_name(service: str) -> str:
    model = botocore.session.get_session().get_service_model(service)
    return model.signing_name or model.endpoint_prefix


def moto_dialect(statements: list[dict], table: dict) -> list[dict]:
    """The statements as moto can check them: no Conditions, the operation names it authorises, and
    ``*`` as the resource of services whose ARNs it does not check."""
    out = []
    for st in statements:
        actions = set(st["Action"] if isinstance(st["Action"], list) else [st["Action"]])
        for action in list(actions):
            service, name = action.split(":")
            actions.add(f"{_signing_name(service)}:{name}")
        for (service, operation), requests in table.items():
            for req in requests:
                if allowed_by(st, req):
                    op = req.action.split(":")[1] if operation == "getattr" else operation
                    actions.add(f"{_signing_name(service)}:{op}")
        copy = {k: v for k, v in st.items() if k != "Condition"} | {"Action": sorted(actions)}
        if not any(a.split(":")[0] in MOTO_CHECKS_ARNS for a in actions):
            copy["Resource"] = "*"
        out.append(copy)
    return out


def _policy_user(aws, monkeypatch, table, names: set[str] | None = None) -> None:
    """A user holding the moto copies of the stack's managed policies (those in ``names`` only, when
    given); the env gets its keys."""
    iam = aws.client("iam")
    iam.create_user(UserName="groundskeeper-run")
    for policy in iam.list_policies(Scope="Local")["Policies"]:
        if not policy["PolicyName"].startswith("groundskeeper-"):
            continue
        if names is not None and policy["PolicyName"] not in names:
            continue
        version = iam.get_policy(PolicyArn=policy["Arn"])["Policy"]["DefaultVersionId"]
        document = iam.get_policy_version(PolicyArn=policy["Arn"], VersionId=version)["PolicyVersion"]["Document"]
        document = json.loads(document) if isinstance(document, str) else document
        copy = {**document, "Statement": moto_dialect(document["Statement"], table)}
        arn = iam.create_policy(PolicyName=f"moto-{policy['PolicyName']}", PolicyDocument=json.dumps(copy))
        iam.attach_user_policy(UserName="groundskeeper-run", PolicyArn=arn["Policy"]["Arn"])
    key = iam.create_access_key(UserName="groundskeeper-run")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])


@contextmanager
def enforced(endpoint: str):
    """moto authenticates and authorises every request inside, and none after (also on failure)."""
    _reset_auth(endpoint, "0")
    try:
        yield
    finally:
        _reset_auth(endpoint, "inf")


@pytest.fixture
def table():
    return calls(Stack(load_template()))


def _seed(aws) -> list[str]:
    """Demo data for every job (as the local demo makes it); returns the receivers."""
    clients = {name: aws.client(name) for name in ("dynamodb", "ec2", "ssm", "sqs")}
    cfg = DemoConfig.from_flat(
        {
            "new_agendas": 2,
            "stuck_agendas": 3,
            "jobs_started": 4,
            "jobs_finished": 2,
            "malformed_messages": 1,
            "records": 6,
            "duplicate_messages": 1,
            "old_jobs": 2,
            "orphan_instances": 1,
            "pool_audit_messages": 1,
            "seed": 13,
        }
    )
    run_demo_traffic(targets=DemoTargets.from_env(aws.env), cfg=cfg, **clients)
    return [i["receiver"]["S"] for i in aws.client("dynamodb").scan(TableName=aws.env["RECEIVERS_TABLE"])["Items"]]


def _record_calls(monkeypatch) -> list[tuple[str, str, dict]]:
    recorded: list[tuple[str, str, dict]] = []
    make_api_call = botocore.client.BaseClient._make_api_call

    def recording(client, operation, params):
        recorded.append((client.meta.service_model.service_name, operation, params))
        return make_api_call(client, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recording)
    return recorded


@pytest.mark.slow
def test_every_prod_job_succeeds_with_only_the_templates_policies(aws, monkeypatch, table):
    from pipelines.definitions import build_definitions

    receivers = _seed(aws)
    _policy_user(aws, monkeypatch, table)
    # moto ignores PartiQL WHERE conditions: reclaim writes one UpdateItem at a time here. Its grouped
    # writes (BatchExecuteStatement, authorised as dynamodb:PartiQLUpdate) are checked by
    # test_iam_static, and run against DynamoDB Local in test_reclaim_grouped.
    monkeypatch.setenv("DYNAMODB_GROUPED_WRITES", "false")
    recorded = _record_calls(monkeypatch)
    defs = build_definitions("prod")
    today = dt.datetime.now(dt.UTC).date().isoformat()
    runs = [
        ("process_termination_queue", {"wait_seconds": 0}, None),
        ("process_housekeeping_queue", {"wait_seconds": 0}, None),  # the demo's stale_ssm and pool_audit
        ("housekeeping", {"task_type": "orphaned_instances", "params": {"confirm_after_minutes": 0}}, None),
        ("housekeeping", {"task_type": "old_jobs"}, None),
        ("redrive_dead_letters", {"queue": "termination"}, None),
        (
            "reclaim_agendas",
            {
                "tableName": aws.env["AGENDA_PROGRESS_TABLE"],
                "idFieldName": "id",
                "timeFieldName": "updatedTime",
                "reclaimAgeMinutes": 1,
            },
            None,
        ),
        ("pool_audit_job", None, None),
        ("pool_cost_report_job", None, today),
        ("batching_checks_job", None, None),
        ("fleet_dead_letter_checks", None, None),
        ("receiver_batches_job", None, f"{today}|{receivers[0]}"),
    ]
    failed = []
    with dg.instance_for_test() as instance, enforced(aws.endpoint):
        instance.add_dynamic_partitions("receivers", receivers)
        for name, config, partition in runs:
            result = defs.resolve_job_def(name).execute_in_process(
                run_config=config, instance=instance, partition_key=partition, raise_on_error=False
            )
            if not result.success:
                errors = [e.step_failure_data.error.message for e in result.all_events if e.is_step_failure]
                failed.append(f"{name} {config}: {errors}")
    assert not failed, "\n".join(failed)
    made = {(svc, op) for svc, op, _ in recorded}
    assert made <= set(table), made - set(table)  # test_iam_static's table has them
    assert ("ssm", "GetParametersByPath") in made  # stale_ssm ran its path query


def _client(aws, service: str):
    """A client with the env's credentials now (boto3's default session keeps the first ones it found)."""
    return boto3.session.Session().client(service, endpoint_url=aws.endpoint, region_name="us-east-1")


OUTSIDE = {
    "DeleteTable": ("dynamodb", lambda c, env: c.delete_table(TableName=env["RUNS_FLEET_JOBS_TABLE"])),
    "PurgeQueue": ("sqs", lambda c, env: c.purge_queue(QueueUrl=env["RUNS_FLEET_TERMINATION_QUEUE_URL"])),
    "PutParameter outside the prefix": (
        "ssm",
        lambda c, env: c.put_parameter(Name="/other/x", Value="1", Type="String"),
    ),
    "PutParameter under the prefix": (
        "ssm",
        lambda c, env: c.put_parameter(Name="/runs-fleet/runners/i-0abc/config", Value="1", Type="String"),
    ),
    "RunInstances": ("ec2", lambda c, env: c.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1)),
}


@pytest.mark.slow
def test_actions_outside_the_policy_are_denied(aws, monkeypatch, table):
    _policy_user(aws, monkeypatch, table)
    allowed = []
    with enforced(aws.endpoint):
        for name, (service, call) in OUTSIDE.items():
            try:
                call(_client(aws, service), aws.env)
                allowed.append(name)
            except ClientError as exc:
                error = exc.response["Error"]
                assert "AccessDenied" in str(error) or error["Code"] in DENIED, (name, error)
    assert not allowed


# ------------------------------------------------------------------------------ the code server


def _code_server_policies() -> set[str]:
    """The names (in the default stack) of the managed policies the template gives the code server's
    role, where sensors and schedules run."""
    on_ecs = Stack(load_template(), ECS_PARAMS)
    default = Stack(load_template())
    return {default.name(logical_id) for logical_id in on_ecs.role_policies("CodeServerTaskRole")[0]}


def _record_denials(monkeypatch) -> list[str]:
    """Every call that moto refused (a look catches its error and launches its run anyway)."""
    denied: list[str] = []
    make_api_call = botocore.client.BaseClient._make_api_call

    def noting(client, operation, params):
        try:
            return make_api_call(client, operation, params)
        except ClientError as exc:
            error = exc.response["Error"]
            if "AccessDenied" in str(error) or error["Code"] in DENIED:
                denied.append(f"{client.meta.service_model.service_name}.{operation}: {error.get('Message')}")
            raise

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", noting)
    return denied


@pytest.mark.slow
def test_every_sensor_and_schedule_tick_is_allowed_by_the_code_servers_policies_alone(aws, monkeypatch, table):
    """Each sensor and schedule of the prod definitions evaluated once over the demo's data (and a
    failed run, so that the alerts sensor publishes), as the code server's role: no call is denied,
    and every call is one of test_iam_static's sensor_calls()."""
    from infra.demo.definitions import TARGETS_DIR
    from pipelines.alerts import defs as alerts_defs
    from pipelines.definitions import build_definitions
    from resources import resources_for

    _seed(aws)
    monkeypatch.setenv("RECLAIM_TARGETS_FILE", str(TARGETS_DIR / "reclaim.json"))  # the stack's AgendaProgress
    _policy_user(aws, monkeypatch, table, _code_server_policies())
    # the account check is once per process: forget what an earlier test of this worker learnt
    monkeypatch.setattr(alerts_defs, "_ACCOUNTS", {})
    recorded = _record_calls(monkeypatch)
    denied = _record_denials(monkeypatch)
    repository = build_definitions("prod").get_repository_def()
    resources = resources_for("prod")
    now = dt.datetime.now(dt.UTC)
    evaluated = []
    with dg.instance_for_test() as instance, enforced(aws.endpoint):
        failed = instance.create_run_for_job(repository.get_job("pool_audit_job"), status=dg.DagsterRunStatus.STARTED)
        instance.report_run_failed(failed)
        for schedule in repository.schedule_defs:
            context = dg.build_schedule_context(
                instance=instance, resources=resources, scheduled_execution_time=now, repository_def=repository
            )
            schedule.evaluate_tick(context)
            evaluated.append(schedule.name)
        for sensor in repository.sensor_defs:
            with dg.build_sensor_context(
                instance=instance, resources=resources, repository_def=repository, sensor_name=sensor.name
            ) as context:
                sensor.evaluate_tick(context)
            evaluated.append(sensor.name)
    assert {"alerts", "termination_queue_sensor", "pool_audit_schedule", "reclaim_demo_agendas"} <= set(evaluated)
    assert not denied, "\n".join(denied)
    made = {(svc, op) for svc, op, _ in recorded}
    expected = set(sensor_calls(Stack(load_template())))
    assert made <= expected, made - expected
    assert {("sns", "Publish"), ("ssm", "GetParametersByPath"), ("cloudwatch", "PutMetricData")} <= made


CODE_SERVER_WRITES = {
    "TerminateInstances": ("ec2", lambda c, env, iid: c.terminate_instances(InstanceIds=[iid])),
    "DeleteParameters": (
        "ssm",
        lambda c, env, iid: c.delete_parameters(Names=[f"/runs-fleet/runners/{iid}/config"]),
    ),
    "PutItem": (
        "dynamodb",
        lambda c, env, iid: c.put_item(TableName=env["RUNS_FLEET_JOBS_TABLE"], Item={"job_id": {"S": "x"}}),
    ),
    "SendMessage": (
        "sqs",
        lambda c, env, iid: c.send_message(QueueUrl=env["RUNS_FLEET_TERMINATION_QUEUE_URL"], MessageBody="{}"),
    ),
    "PutObject": (
        "s3",
        lambda c, env, iid: c.put_object(Bucket=env["RUNS_FLEET_ARCHIVE_BUCKET"], Key="raw/x", Body=b"x"),
    ),
}


@pytest.mark.slow
def test_a_write_from_the_code_servers_role_is_denied(aws, monkeypatch, table):
    _seed(aws)
    instances = aws.client("ec2").describe_instances()["Reservations"]
    (iid, *_) = [i["InstanceId"] for r in instances for i in r["Instances"]]
    _policy_user(aws, monkeypatch, table, _code_server_policies())
    allowed = []
    with enforced(aws.endpoint):
        for name, (service, call) in CODE_SERVER_WRITES.items():
            try:
                call(_client(aws, service), aws.env, iid)
                allowed.append(name)
            except ClientError as exc:
                error = exc.response["Error"]
                assert "AccessDenied" in str(error) or error["Code"] in DENIED, (name, error)
    assert not allowed
