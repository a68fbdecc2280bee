"""The template's IAM policies match the AWS calls the code makes: every call is allowed, nothing more.

moto checks IAM actions but not the resource ARNs of most services, nor Conditions (see
``test_iam_enforced``), so this test checks them statically, with IAM's own matching rules:

- ``code_calls()`` finds every boto3 call under ``pipelines/``, ``resources/`` and ``sensors/``
  (botocore's operation names of each service the code builds a client for);
- ``calls(stack)`` below maps each of them to the IAM requests it makes: action, resource ARN
  (built from the template's resource names and the code's own constants) and the condition keys
  the call sets (tag keys, metric namespace, the managed tag of the instances it touches);
- each request must be allowed by a statement of the template's managed policies, and each
  statement, each of its actions and each of its resources must be needed by some request.

A new call without an entry here fails; so does a grant that no call needs.
"""

from __future__ import annotations

import pytest

from infra.deploy import OUTPUT_ENV
from pipelines.fleet.messages import RUNNER_PREFIX
from pipelines.fleet.pool_audit.audit import PREFIX as POOL_AUDIT_PREFIX
from pipelines.fleet.tasks.orphaned_instances import MANAGED_TAG, SUSPECT_TAG
from pipelines.fleet.termination import ROUNDS_PREFIX
from resources import IO_PREFIX
from resources.settings import FleetSettings
from tests.iam_support import (
    ACCOUNT,
    PARTITION,
    REGION,
    Request,
    Stack,
    allowed_by,
    code_calls,
    iam_match,
    load_template,
    request,
)

# ``.<op>(`` matches that are not AWS calls: path -> the service operations it matched.
NOT_AWS_CALLS = {  # store.list_keys: an S3 listing helper; put_metrics asks a metrics sink for not_published
    "pipelines/batching/batcher.py": {("kms", "ListKeys")},
    "pipelines/batching/reportstream_settings.py": {("kms", "ListKeys")},
    "pipelines/common/aws_batches.py": {("cloudwatch", "getattr")},
}

KEY_ARN = f"arn:{PARTITION}:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
# reclaim_agendas on tables outside the stack (ReclaimTableArns): another AgendaProgress, an OperationProgress.
OTHER_TABLE = f"arn:{PARTITION}:dynamodb:{REGION}:{ACCOUNT}:table/OperationProgress-dev"
PARAMS = {"IdentityPasswordKeyArn": KEY_ARN, "ReclaimTableArns": f"{OTHER_TABLE},{OTHER_TABLE}/index/*"}
INSTANCE = f"arn:{PARTITION}:ec2:{REGION}:{ACCOUNT}:instance/i-0123456789abcdef0"
MANAGED = {f"aws:ResourceTag/{MANAGED_TAG}": "true"}  # every instance the fleet touches is filtered on it


def calls(s: Stack) -> dict[tuple[str, str], list[Request]]:
    """(service, Operation) -> the IAM requests it makes, on every resource the code calls it for."""
    agenda, ready = s.arn("AgendaProgressTable"), s.arn("ReadyAgendaTable")
    jobs, pools = s.arn("JobsTable"), s.arn("PoolsTable")
    receivers, records = s.arn("ReceiversTable"), s.arn("BatchRecordsTable")
    archive, outbox = s.arn("ArchiveBucket"), s.arn("BatchOutboxBucket")
    queues = [s.arn(q) for q in ("TerminationQueue", "HousekeepingQueue")]
    dlqs = [s.arn(q) for q in ("TerminationDeadLetterQueue", "HousekeepingDeadLetterQueue")]
    ssm = f"arn:{PARTITION}:ssm:{REGION}:{ACCOUNT}:parameter"
    namespace = {"cloudwatch:namespace": FleetSettings.model_fields["metrics_namespace"].default}

    def ddb(action: str, *arns: str) -> list[Request]:
        return [request(f"dynamodb:{action}", arn) for arn in arns]

    def on(action: str, arns: list[str]) -> list[Request]:
        return [request(action, arn) for arn in arns]

    return {
        # fleet, pool audit, reclaim and progressor metrics, all in RUNS_FLEET_METRICS_NAMESPACE
        ("cloudwatch", "PutMetricData"): [request("cloudwatch:PutMetricData", "*", namespace)],
        # reclaim: inspect_table (AgendaProgress tables), OperationProgressWriter
        ("dynamodb", "DescribeTable"): ddb("DescribeTable", agenda, OTHER_TABLE),
        # batching: the receiver item
        ("dynamodb", "GetItem"): ddb("GetItem", receivers),
        # reclaim over HTTP: the ReadyAgenda item
        ("dynamodb", "PutItem"): ddb("PutItem", ready),
        ("dynamodb", "Query"): ddb(
            "Query",
            f"{records}/index/pending-index",  # batching
            f"{jobs}/index/instance_id-index",  # orphaned_instances
            f"{jobs}/index/completed_at-index",  # old_jobs
            f"{jobs}/index/status-instance_id-index",  # pool audit
            OTHER_TABLE,  # OperationProgress by its hash key
            f"{OTHER_TABLE}/index/agendaProgressId-index",  # or by its GSI
        ),
        ("dynamodb", "Scan"): ddb(
            "Scan",
            receivers,  # batching: receivers, receivers_sync
            records,  # batching check: malformed pending records
            f"{records}/index/pending-index",  # batching check: pending by receiver
            pools,  # pool audit
            jobs,  # pool audit without its index
        ),
        # Transactions are authorised per item, by the item's own action.
        ("dynamodb", "TransactWriteItems"): [
            *ddb("UpdateItem", records, jobs, agenda, OTHER_TABLE),  # batching, termination, reclaim
            *ddb("ConditionCheckItem", receivers, jobs),  # batching: the lease fence; termination: a late flush
            *ddb("PutItem", ready),  # reclaim: queue a retry
            *ddb("DeleteItem", jobs),  # old_jobs: delete archived jobs
        ],
        # reclaim's grouped writes: a BatchExecuteStatement is authorised per statement (PartiQL UPDATE)
        ("dynamodb", "BatchExecuteStatement"): ddb("PartiQLUpdate", agenda, OTHER_TABLE),
        # batching: the lease; reclaim: AgendaProgress, OperationProgress
        ("dynamodb", "UpdateItem"): ddb("UpdateItem", receivers, agenda, OTHER_TABLE),
        # reclaim's engine: each page of its plan through getattr(dynamodb, "scan" | "query")
        ("dynamodb", "getattr"): ddb("Scan", agenda, OTHER_TABLE)
        + ddb("Query", f"{agenda}/index/processingState-updatedTime-index", f"{OTHER_TABLE}/index/state-index"),
        ("ec2", "CreateTags"): [request("ec2:CreateTags", INSTANCE, {**MANAGED, "aws:TagKeys": [SUSPECT_TAG]})],
        ("ec2", "DeleteTags"): [request("ec2:DeleteTags", INSTANCE, {**MANAGED, "aws:TagKeys": [SUSPECT_TAG]})],
        ("ec2", "DescribeInstances"): [request("ec2:DescribeInstances", "*")],
        ("ec2", "TerminateInstances"): [request("ec2:TerminateInstances", INSTANCE, MANAGED)],
        # the alerts sensor: each incident's state changes, to the stack's alerts topic only, which is
        # encrypted: SNS uses the topic's key as the publisher
        ("sns", "Publish"): [
            request("sns:Publish", s.arn("AlertsTopic")),
            request("kms:GenerateDataKey", s.arn("AlertsTopicKey")),
            request("kms:Decrypt", s.arn("AlertsTopicKey")),
        ],
        # reclaim over HTTP: IDM_ENCRYPTED_PASS
        ("kms", "Decrypt"): [request("kms:Decrypt", KEY_ARN)],
        ("s3", "GetObject"): on(
            "s3:GetObject",
            [
                f"{archive}/dead-letters/termination/redriven/0f.json",
                f"{archive}/dead-letters/termination/oversized/0f.json",  # a redrive opens an s3 envelope
                f"{archive}/{POOL_AUDIT_PREFIX}/snapshots/x",
                f"{archive}/{ROUNDS_PREFIX}/termination/r",  # a copy's round marker: the jobs it lists
            ],
        ),
        ("s3", "HeadObject"): on("s3:GetObject", [f"{outbox}/ledger/acme/x.json"]),
        ("s3", "ListObjectsV2"): on("s3:ListBucket", [outbox, archive]),
        ("s3", "PutObject"): on(
            "s3:PutObject",
            [
                f"{outbox}/batches/acme/x/0.jsonl",
                f"{outbox}/ledger/acme/x.json",
                f"{archive}/raw/termination/x.jsonl",
                f"{archive}/jobs/succeeded/x.jsonl",
                f"{archive}/dead-letters/termination/quarantine/0f.json",
                f"{archive}/{ROUNDS_PREFIX}/termination/r",
                f"{archive}/{POOL_AUDIT_PREFIX}/report.csv",
            ],
        ),
        # redrive_dead_letters hides what it keeps for later
        ("sqs", "ChangeMessageVisibilityBatch"): on("sqs:ChangeMessageVisibility", dlqs),
        ("sqs", "DeleteMessageBatch"): on("sqs:DeleteMessage", queues + dlqs),
        ("sqs", "GetQueueAttributes"): on("sqs:GetQueueAttributes", queues + dlqs),
        ("sqs", "ReceiveMessage"): on("sqs:ReceiveMessage", queues + dlqs),
        # dead letters go to the DLQs, redriven ones back to their queues
        ("sqs", "SendMessageBatch"): on("sqs:SendMessage", queues + dlqs),
        ("ssm", "DeleteParameters"): [request("ssm:DeleteParameters", f"{ssm}{RUNNER_PREFIX}i-0abc/config")],
        # authorised against the path itself (SSM): parameter/runs-fleet/runners, no trailing /*
        ("ssm", "GetParametersByPath"): [request("ssm:GetParametersByPath", f"{ssm}{RUNNER_PREFIX.rstrip('/')}")],
    }


def sensor_calls(s: Stack) -> dict[tuple[str, str], list[Request]]:
    """The calls sensors and schedules make (in the code server): the reads of their looks, the queue
    sensors' depths, the alerts sensor's dead-letter depths, heartbeat and publishing. Each is one of
    ``calls()``; ``test_iam_enforced`` evaluates every sensor and schedule and checks that they make
    no call outside this table."""
    jobs, agenda = s.arn("JobsTable"), s.arn("AgendaProgressTable")
    table = calls(s)
    reads = {
        ("dynamodb", "Query"): [
            f"{jobs}/index/instance_id-index",  # orphaned_instances' look: a suspect's running job
            f"{jobs}/index/completed_at-index",  # old_jobs' look
            f"{jobs}/index/status-instance_id-index",  # the pool audit's look: running jobs
        ],
        ("dynamodb", "Scan"): [
            s.arn("ReceiversTable"),  # receivers_sync, batch_decider, the batching checks' look
            f"{s.arn('BatchRecordsTable')}/index/pending-index",  # the batching checks' look
            s.arn("PoolsTable"),  # the pool audit's look
            jobs,  # the pool audit's look without its index
        ],
        ("dynamodb", "DescribeTable"): [agenda],  # the reclaim schedules' looks: inspect_table
        # and the reclaim engine's reads (its look on the scan path, or on the index)
        ("dynamodb", "getattr"): [agenda, f"{agenda}/index/processingState-updatedTime-index"],
    }
    out = {key: [req for req in table[key] if req.resource in resources] for key, resources in reads.items()}
    assert all(len(out[key]) == len(resources) for key, resources in reads.items()), out
    for key in (
        ("cloudwatch", "PutMetricData"),  # the alerts heartbeat
        ("ec2", "DescribeInstances"),  # orphaned_instances', stale_ssm's and the pool audit's looks
        ("sns", "Publish"),  # the alerts sensor
        ("sqs", "GetQueueAttributes"),  # the queue sensors, the dead-letter checks' look, the alerts sensor
        ("ssm", "GetParametersByPath"),  # stale_ssm's look
    ):
        out[key] = table[key]
    # the alerts sensor's check of its SNS topic's account, once per process: STS answers every
    # identity whatever its policies say, so the call needs (and has) no grant
    out[("sts", "GetCallerIdentity")] = []
    return out


def library_calls(s: Stack) -> dict[tuple[str, str], list[Request]]:
    """Calls that a library the deployment configures makes on Groundskeeper's behalf: the
    ``cluster`` profile's ``S3PickleIOManager`` (dagster-aws) keeps step outputs under
    ``dagster-io/`` in the archive bucket, and replaces an output it finds already written (a step
    run again after its worker died) with ``DeleteObject`` first."""
    output = f"{s.arn('ArchiveBucket')}/{IO_PREFIX}/storage/<run>/<step>/result"
    return {
        ("s3", "ListObjects"): [request("s3:ListBucket", s.arn("ArchiveBucket"))],
        ("s3", "GetObject"): [request("s3:GetObject", output)],
        ("s3", "PutObject"): [request("s3:PutObject", output)],
        ("s3", "DeleteObject"): [request("s3:DeleteObject", output)],
    }


def all_requests(s: Stack) -> list[Request]:
    return [req for table in (calls(s), library_calls(s)) for reqs in table.values() for req in reqs]


@pytest.fixture(scope="module")
def stack() -> Stack:
    return Stack(load_template(), PARAMS)


@pytest.fixture(scope="module")
def found() -> dict[tuple[str, str], list[str]]:
    """The calls of code deployed to prod."""
    out = {}
    for key, sites in code_calls().items():
        sites = [site for site in sites if key not in NOT_AWS_CALLS.get(site.split(":")[0], set())]
        if sites:
            out[key] = sites
    return out


def _statements(stack: Stack) -> list[tuple[str, dict]]:
    return [
        (f"{policy}/{st.get('Sid', i)}", st) for policy, sts in stack.policies().items() for i, st in enumerate(sts)
    ]


@pytest.mark.slow
def test_every_call_in_the_code_has_an_iam_mapping(stack, found):
    table = calls(stack)
    missing = {key: sites for key, sites in found.items() if key not in table}
    assert not missing, f"calls without an entry in calls(): {missing}"
    stale = sorted(set(table) - set(found))
    assert not stale, f"entries for calls the code no longer makes: {stale}"


def test_every_call_is_allowed_by_the_template(stack):
    statements = _statements(stack)
    made = [(f"{svc}.{op}", reqs) for (svc, op), reqs in calls(stack).items()]
    made += [(f"{svc}.{op} (dagster-aws, cluster)", reqs) for (svc, op), reqs in library_calls(stack).items()]
    denied = [
        f"{call}: {req}" for call, reqs in made for req in reqs if not any(allowed_by(st, req) for _, st in statements)
    ]
    assert not denied, "\n".join(denied)


def test_every_statement_action_and_resource_is_needed(stack):
    requests = all_requests(stack)
    unneeded = []
    for name, st in _statements(stack):
        used = [req for req in requests if allowed_by(st, req)]
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        unneeded += [f"{name}: {a}" for a in actions if not any(iam_match(a, r.action, case=False) for r in used)]
        unneeded += [f"{name}: {res}" for res in resources if not any(iam_match(res, r.resource) for r in used)]
    assert not unneeded, "grants no call needs:\n" + "\n".join(unneeded)


def test_the_checker_rejects_the_runner_path_grant_that_real_aws_denies(stack):
    """GetParametersByPath on /runs-fleet/runners is authorised against parameter/runs-fleet/runners:
    a grant of parameter/runs-fleet/runners/* alone (the template before) does not allow it."""
    (req,) = calls(stack)[("ssm", "GetParametersByPath")]
    only_children = {
        "Effect": "Allow",
        "Action": ["ssm:GetParametersByPath", "ssm:DeleteParameters"],
        "Resource": f"arn:{PARTITION}:ssm:{REGION}:{ACCOUNT}:parameter{RUNNER_PREFIX}*",
    }
    assert not allowed_by(only_children, req)


def test_tags_and_namespaces_outside_the_code_are_denied(stack):
    statements = [st for _, st in _statements(stack)]
    other_tag = request("ec2:CreateTags", INSTANCE, {**MANAGED, "aws:TagKeys": [SUSPECT_TAG, "Name"]})
    unmanaged = request("ec2:TerminateInstances", INSTANCE, {f"aws:ResourceTag/{MANAGED_TAG}": "false"})
    other_namespace = request("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "AWS/EC2"})
    # A DeleteTags without Tags deletes every tag (runs-fleet:managed too) and sends no aws:TagKeys,
    # which ForAllValues alone lets through.
    every_tag = [request(f"ec2:{action}", INSTANCE, MANAGED) for action in ("DeleteTags", "CreateTags")]
    for req in (other_tag, unmanaged, other_namespace, *every_tag):
        assert not any(allowed_by(st, req) for st in statements), req


def test_the_metrics_namespace_is_a_parameter_that_the_deployment_exports():
    """The namespace condition follows the MetricsNamespace parameter, and deploy exports it as
    RUNS_FLEET_METRICS_NAMESPACE, so the code writes where the policy allows."""
    custom = Stack(load_template(), {**PARAMS, "MetricsNamespace": "Fleet/Staging"})
    metrics = [name for name, st in _statements(custom) if "cloudwatch:PutMetricData" in st["Action"]]
    assert metrics == ["SensorsPolicy/Metrics", "DeploymentPolicy/Metrics"]  # the code server's, the runs'
    conditions = [st["Condition"] for _, st in _statements(custom) if "cloudwatch:PutMetricData" in st["Action"]]
    assert conditions == [{"StringEquals": {"cloudwatch:namespace": "Fleet/Staging"}}] * 2
    assert custom.resolve(custom.template["Outputs"]["MetricsNamespace"]["Value"]) == "Fleet/Staging"
    assert OUTPUT_ENV["MetricsNamespace"] == "RUNS_FLEET_METRICS_NAMESPACE"


def test_kms_and_outside_tables_are_granted_only_when_named():
    """IdentityPasswordKeyArn and ReclaimTableArns default to no grant at all (the one KMS grant is
    the alerts topic's own key, to publish)."""
    default = Stack(load_template())
    assert set(default.policies()) == {"DeploymentPolicy", "SensorsPolicy", "AlertsPolicy"}
    kms = [
        (name, st["Resource"]) for name, st in _statements(default) if any(a.startswith("kms:") for a in st["Action"])
    ]
    assert kms == [("AlertsPolicy/AlertsTopicKey", default.arn("AlertsTopicKey"))]


def test_alerts_may_publish_to_the_stacks_topic_only(stack):
    """sns:Publish is granted on AlertsTopic alone, by AlertsPolicy alone (for the role that evaluates
    sensors; the run tasks' role does not carry it): another topic of the account is denied."""
    statements = [st for _, st in _statements(stack)]
    other = request("sns:Publish", f"arn:{PARTITION}:sns:{REGION}:{ACCOUNT}:someone-elses-topic")
    assert not any(allowed_by(st, other) for st in statements)
    (own, *topic_key) = calls(stack)[("sns", "Publish")]
    assert {req.resource for req in topic_key} == {stack.arn("AlertsTopicKey")}
    assert own.resource == stack.resolve({"Ref": "AlertsTopic"})
    assert own.resource.endswith(":groundskeeper-alerts-dev")
    assert [st for st in statements if "sns:Publish" in st["Action"]] == [
        st for st in statements if any(a.startswith("sns:") for a in st["Action"])
    ]
    assert OUTPUT_ENV["AlertsTopicArn"] == "ALERTS_SNS_TOPIC_ARN"
    publishing = [name for name, st in _statements(stack) if "sns:Publish" in st["Action"]]
    assert publishing == ["AlertsPolicy/Alerts"]
    # On ECS it is the code server's alone (the run tasks' role does not carry it); otherwise no role's.
    roles = stack.resource("AlertsPolicy")["Properties"]["Roles"]
    assert roles == {"Fn::If": ["EcsEnabled", [{"Ref": "CodeServerTaskRole"}], {"Ref": "AWS::NoValue"}]}


def test_demo_traffic_is_not_in_prod():
    """The demo's calls (RunInstances, PutParameter, SendMessage...: moto seeding) are never granted:
    its code is outside the scanned product (``infra/demo``) and its jobs are not in prod."""
    from pipelines.definitions import build_definitions

    jobs = {job.name for job in build_definitions("prod").resolve_all_job_defs()}
    assert not {"demo_traffic", "progressor_demo_traffic"} & jobs


# ------------------------------------------------------------------------------------ the ECS roles

ECS_ENV = "prod"
DB_SECRET = f"arn:{PARTITION}:secretsmanager:{REGION}:{ACCOUNT}:secret:groundskeeper/prod/dagster-pg-AbCdEf"
DSN_SECRET = f"arn:{PARTITION}:secretsmanager:{REGION}:{ACCOUNT}:secret:groundskeeper/prod/progressor-dsn-AbCdEf"
ECS_PARAMS = {
    **PARAMS,
    "Env": ECS_ENV,
    "EnableEcs": "true",
    "EcsImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/groundskeeper:1",
    "EcsVpcId": "vpc-0123456789abcdef0",
    "EcsSubnets": "subnet-0a1b2c3d,subnet-0e4f5a6b",
    "WebserverAccessCidr": "10.0.0.0/8",
    "ProgressorDsnSecretArn": DSN_SECRET,
}
# AWS's own policy for what ECS does to start a task (pull the image, write its logs), on every execution role.
TASK_EXECUTION_POLICY = f"arn:{PARTITION}:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
EXECUTION_ROLES = ("EcsExecutionRole", "CodeServerExecutionRole", "DaemonExecutionRole", "WebserverExecutionRole")


@pytest.fixture(scope="module", params=["stack database", "existing database"])
def ecs_stack(request) -> Stack:
    """The template with EnableEcs=true: creating its database, or given an existing one's secret."""
    params = dict(ECS_PARAMS)
    if request.param == "existing database":
        params |= {"DagsterPgHost": "dagster-db.internal", "DagsterPgPasswordSecretArn": DB_SECRET}
    return Stack(load_template(), params)


def ecs_role_requests(s: Stack) -> dict[str, list[Request]]:
    """Role -> the IAM requests its process makes (the task roles) or ECS makes for it (the execution
    roles). The daemon's are EcsRunLauncher's (dagster-aws): DescribeTaskDefinition when it is built,
    RunTask (tagging the task, passing the run task's two roles), DescribeTasks for run monitoring,
    StopTask, and GetLogEvents for a failed task's last lines. The webserver only builds the launcher
    and stops tasks (the queued run coordinator leaves launching to the daemon)."""
    cluster = s.arn("EcsCluster")
    task = f"arn:{PARTITION}:ecs:{REGION}:{ACCOUNT}:task/{s.name('EcsCluster')}/0123456789abcdef"
    run_definition = f"arn:{PARTITION}:ecs:{REGION}:{ACCOUNT}:task-definition/groundskeeper-run-{ECS_ENV}:3"
    to_ecs = {"iam:PassedToService": "ecs-tasks.amazonaws.com"}
    log_stream = f"arn:{PARTITION}:logs:{REGION}:{ACCOUNT}:log-group:/groundskeeper/{ECS_ENV}:log-stream:run/x/y"
    password = s.resolve(s.template["Outputs"]["DagsterPgPasswordSecretArn"]["Value"])
    stop = [
        request("ecs:DescribeTaskDefinition", "*"),
        request("ecs:DescribeTasks", task),
        request("ecs:StopTask", task),
    ]
    return {
        # Sensors and schedules: reads and metrics (SensorsPolicy), publishing alerts (AlertsPolicy).
        "CodeServerTaskRole": [req for reqs in sensor_calls(s).values() for req in reqs],
        "DaemonTaskRole": [
            *stop,
            request("ecs:RunTask", run_definition, {"ecs:cluster": cluster}),
            request("ecs:TagResource", task, {"ecs:CreateAction": "RunTask"}),
            request("iam:PassRole", s.arn("EcsTaskRole"), to_ecs),
            request("iam:PassRole", s.arn("EcsExecutionRole"), to_ecs),
            request("logs:GetLogEvents", log_stream),
        ],
        "WebserverTaskRole": stop,
        # The run tasks get the password and PROGRESSOR_DSN; the services the password only.
        "EcsExecutionRole": [request("secretsmanager:GetSecretValue", arn) for arn in (password, DSN_SECRET)],
        "CodeServerExecutionRole": [request("secretsmanager:GetSecretValue", password)],
        "DaemonExecutionRole": [request("secretsmanager:GetSecretValue", password)],
        "WebserverExecutionRole": [request("secretsmanager:GetSecretValue", password)],
    }


def test_each_ecs_role_is_allowed_what_its_process_calls_and_nothing_more(ecs_stack):
    s = ecs_stack
    for role, requests in ecs_role_requests(s).items():
        policies, aws_managed = s.role_policies(role)
        statements = [
            (f"{policy}/{st.get('Sid', i)}", st) for policy, sts in policies.items() for i, st in enumerate(sts)
        ]
        denied = [str(req) for req in requests if not any(allowed_by(st, req) for _, st in statements)]
        assert not denied, f"{role}: {denied}"
        unneeded = []
        for name, st in statements:
            used = [req for req in requests if allowed_by(st, req)]
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            unneeded += [f"{name}: {a}" for a in actions if not any(iam_match(a, r.action, case=False) for r in used)]
            unneeded += [f"{name}: {res}" for res in resources if not any(iam_match(res, r.resource) for r in used)]
        assert not unneeded, f"{role} has grants its process does not need:\n" + "\n".join(unneeded)
        assert aws_managed == ([TASK_EXECUTION_POLICY] if role in EXECUTION_ROLES else []), role


def test_the_task_roles_carry_the_code_locations_policies_where_its_code_runs(ecs_stack):
    """The run tasks run jobs (every call of the code: DeploymentPolicy and the optional grants); the
    code server evaluates sensors and schedules (SensorsPolicy: reads and metrics, and, alone,
    AlertsPolicy); the daemon and webserver run no Groundskeeper code (the daemon asks the code server
    to evaluate sensors and schedules, over gRPC) and carry none of them."""
    s = ecs_stack
    carried = {role: set(s.role_policies(role)[0]) for role in ("EcsTaskRole", "CodeServerTaskRole")}
    assert carried["EcsTaskRole"] == {"DeploymentPolicy", "ReclaimTablesPolicy", "IdentityPasswordPolicy"}
    assert carried["CodeServerTaskRole"] == {"SensorsPolicy", "AlertsPolicy"}
    assert set(s.role_policies("DaemonTaskRole")[0]) == {"EcsLauncherPolicy"}
    assert set(s.role_policies("WebserverTaskRole")[0]) == {"WebserverPolicy"}
    # The alerts sensor's calls, from the code server's role.
    statements = [st for sts in s.role_policies("CodeServerTaskRole")[0].values() for st in sts]
    for key in (("sns", "Publish"), ("sqs", "GetQueueAttributes"), ("cloudwatch", "PutMetricData")):
        assert all(any(allowed_by(st, req) for st in statements) for req in calls(s)[key]), key
    for role in ("EcsTaskRole", "CodeServerTaskRole", "DaemonTaskRole", "WebserverTaskRole"):
        assert "Policies" not in s.resource(role)["Properties"]
        assert "ManagedPolicyArns" not in s.resource(role)["Properties"]
        (trust,) = s.resource(role)["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert trust["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}, role


def test_ecs_roles_are_denied_what_another_role_does(ecs_stack):
    s = ecs_stack
    cluster = s.arn("EcsCluster")
    run_definition = f"arn:{PARTITION}:ecs:{REGION}:{ACCOUNT}:task-definition/groundskeeper-run-{ECS_ENV}:3"
    other_definition = f"arn:{PARTITION}:ecs:{REGION}:{ACCOUNT}:task-definition/groundskeeper-daemon-{ECS_ENV}:3"
    to_ecs = {"iam:PassedToService": "ecs-tasks.amazonaws.com"}

    def allowed(role: str, req: Request) -> bool:
        return any(allowed_by(st, req) for sts in s.role_policies(role)[0].values() for st in sts)

    launch = request("ecs:RunTask", run_definition, {"ecs:cluster": cluster})
    assert allowed("DaemonTaskRole", launch)
    assert not allowed("WebserverTaskRole", launch)
    assert not allowed("DaemonTaskRole", request("ecs:RunTask", other_definition, {"ecs:cluster": cluster}))
    assert not allowed("DaemonTaskRole", request("ecs:RunTask", run_definition, {"ecs:cluster": cluster + "x"}))
    for role in ("CodeServerTaskRole", "DaemonTaskRole", "WebserverTaskRole"):
        # No task role may hand its own role (or any role but the run task's two) to ECS.
        assert not allowed("DaemonTaskRole", request("iam:PassRole", s.arn(role), to_ecs)), role
    other_secret = f"arn:{PARTITION}:secretsmanager:{REGION}:{ACCOUNT}:secret:someone-elses-AbCdEf"
    for role in EXECUTION_ROLES:
        assert not allowed(role, request("secretsmanager:GetSecretValue", other_secret)), role
    assert not allowed("CodeServerExecutionRole", request("secretsmanager:GetSecretValue", DSN_SECRET))


def test_the_code_server_role_is_denied_every_call_of_the_runs_that_sensors_do_not_make(ecs_stack):
    """Sensors and schedules only read and publish: from the code server's role, every other request
    of the code (terminating and tagging instances, deleting runner parameters, writing tables, queues
    and buckets, and the runs' own reads) is denied."""
    s = ecs_stack
    statements = [st for sts in s.role_policies("CodeServerTaskRole")[0].values() for st in sts]
    sensors = {req for reqs in sensor_calls(s).values() for req in reqs}
    others = [req for reqs in calls(s).values() for req in reqs if req not in sensors]
    writes = {"ec2:TerminateInstances", "ec2:CreateTags", "ssm:DeleteParameters", "dynamodb:PutItem"}
    writes |= {"dynamodb:UpdateItem", "dynamodb:DeleteItem", "sqs:SendMessage", "sqs:DeleteMessage"}
    assert writes | {"s3:PutObject"} <= {req.action for req in others}
    allowed = [str(req) for req in others if any(allowed_by(st, req) for st in statements)]
    assert not allowed, "the code server may:\n" + "\n".join(allowed)
