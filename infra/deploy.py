"""Deploy ``infra/template.yaml`` with CloudFormation and map its outputs to environment variables.

The same code deploys into real AWS (production) and into the local moto server (``make dev``
and the tests), so the local platform is exactly what the template describes.

    python -m infra.deploy --env dev            # deploy, print `export NAME=value` lines
    python -m infra.deploy --env dev --dotenv .groundskeeper/local.env
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import boto3
from botocore.exceptions import ClientError, WaiterError

TEMPLATE_PATH = Path(__file__).with_name("template.yaml")
DEFAULT_STACK_NAME = "groundskeeper"

# Stack output -> the environment variable of docs/contracts.md that carries it.
OUTPUT_ENV = {
    "AgendaProgressTableName": "AGENDA_PROGRESS_TABLE",
    "AgendaReadyTableName": "AGENDA_READY_TABLE",
    "JobsTableName": "RUNS_FLEET_JOBS_TABLE",
    "PoolsTableName": "RUNS_FLEET_POOLS_TABLE",
    "TerminationQueueUrl": "RUNS_FLEET_TERMINATION_QUEUE_URL",
    "TerminationDeadLetterQueueUrl": "RUNS_FLEET_TERMINATION_DLQ_URL",
    "HousekeepingQueueUrl": "RUNS_FLEET_HOUSEKEEPING_QUEUE_URL",
    "HousekeepingDeadLetterQueueUrl": "RUNS_FLEET_HOUSEKEEPING_DLQ_URL",
    "ArchiveBucketName": "RUNS_FLEET_ARCHIVE_BUCKET",
    "ReceiversTableName": "RECEIVERS_TABLE",
    "BatchRecordsTableName": "BATCH_RECORDS_TABLE",
    "BatchOutboxBucketName": "BATCH_OUTBOX_BUCKET",
    # The template's MetricsNamespace: the only namespace its policy lets PutMetricData write to.
    "MetricsNamespace": "RUNS_FLEET_METRICS_NAMESPACE",
    # The topic every alert goes to (the alerts sensor's SNS sink and the template's alarms).
    "AlertsTopicArn": "ALERTS_SNS_TOPIC_ARN",
    # The stack's Env: the alerts heartbeat's dimension, which the template's heartbeat alarm watches.
    "AlertsHeartbeatEnv": "ALERTS_HEARTBEAT_ENV",
}

# Outputs of the ECS resources (EnableEcs=true), which infra/dagster.ecs.yaml reads; exported when present.
ECS_OUTPUT_ENV = {
    "EcsClusterName": "DAGSTER_ECS_CLUSTER",
    "EcsRunTaskDefinitionArn": "DAGSTER_ECS_TASK_DEFINITION",
    "EcsRunTaskContainerName": "DAGSTER_ECS_CONTAINER_NAME",
    "EcsSubnets": "DAGSTER_ECS_SUBNETS",
    "EcsSecurityGroups": "DAGSTER_ECS_SECURITY_GROUPS",
}


class DeployError(RuntimeError):
    """The stack did not reach a complete state; the message carries CloudFormation's reason."""


def _failure_reasons(cfn, stack_name: str) -> str:
    reasons = []
    try:
        events = cfn.describe_stack_events(StackName=stack_name)["StackEvents"]
    except ClientError:
        return "(no stack events)"
    for event in events:
        if event.get("ResourceStatus", "").endswith("FAILED"):
            reasons.append(f"{event.get('LogicalResourceId')}: {event.get('ResourceStatusReason', 'no reason given')}")
    return "; ".join(reasons) or "(no failed resource reported)"


def deploy(
    cfn,
    *,
    stack_name: str = DEFAULT_STACK_NAME,
    env: str = "dev",
    template_body: str | None = None,
    parameters: dict[str, str] | None = None,
    timeout_seconds: float = 900,
) -> dict[str, str]:
    """Create or update the stack and return its outputs as ``{ENV_VAR: value}``.

    Raises :class:`DeployError` with CloudFormation's own reason when the stack fails.
    """
    body = template_body if template_body is not None else TEMPLATE_PATH.read_text()
    params = [{"ParameterKey": "Env", "ParameterValue": env}]
    params += [{"ParameterKey": k, "ParameterValue": v} for k, v in (parameters or {}).items()]
    kwargs = dict(
        StackName=stack_name,
        TemplateBody=body,
        Parameters=params,
        Capabilities=["CAPABILITY_NAMED_IAM"],
    )
    try:
        cfn.describe_stacks(StackName=stack_name)
        exists = True
    except ClientError:
        exists = False
    try:
        if exists:
            try:
                cfn.update_stack(**kwargs)
            except ClientError as exc:
                if "No updates are to be performed" not in str(exc):
                    raise
            waiter = cfn.get_waiter("stack_update_complete")
        else:
            cfn.create_stack(**kwargs)
            waiter = cfn.get_waiter("stack_create_complete")
        delay = 1 if "127.0.0.1" in cfn.meta.endpoint_url or "localhost" in cfn.meta.endpoint_url else 10
        waiter.wait(
            StackName=stack_name,
            WaiterConfig={"Delay": delay, "MaxAttempts": max(1, int(timeout_seconds / delay))},
        )
    except ClientError as exc:
        raise DeployError(f"stack {stack_name}: {exc.response['Error'].get('Message', exc)}") from None
    except WaiterError:
        raise DeployError(f"stack {stack_name} failed: {_failure_reasons(cfn, stack_name)}") from None
    return stack_env(cfn, stack_name)


def stack_env(cfn, stack_name: str = DEFAULT_STACK_NAME) -> dict[str, str]:
    """The deployed stack's outputs, keyed by the contract's environment variable names."""
    stack = cfn.describe_stacks(StackName=stack_name)["Stacks"][0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    missing = sorted(set(OUTPUT_ENV) - set(outputs))
    if missing:
        raise DeployError(f"stack {stack_name} has no output(s) {', '.join(missing)}")
    env = {env_name: outputs[key] for key, env_name in OUTPUT_ENV.items()}
    env.update({env_name: outputs[key] for key, env_name in ECS_OUTPUT_ENV.items() if key in outputs})
    return env


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_endpoint(url: str, timeout_seconds: float = 30, proc: subprocess.Popen | None = None) -> None:
    """Block until an HTTP endpoint answers (the moto server has started). ``proc``: the server's
    process; its exit ends the wait at once."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_seconds
    while True:
        if proc is not None and proc.poll() is not None:
            raise DeployError(f"the server for {url} exited at start with code {proc.returncode}")
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=2).read()
            return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            if time.monotonic() > deadline:
                raise DeployError(f"the AWS endpoint {url} did not answer within {timeout_seconds:.0f}s") from None
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="dev", help="the template's Env parameter (resource name suffix)")
    parser.add_argument("--stack-name", default=DEFAULT_STACK_NAME)
    parser.add_argument("--dotenv", help="also write NAME=value lines to this file")
    parser.add_argument("--parameter", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    parameters = dict(p.split("=", 1) for p in args.parameter)
    try:
        env = deploy(boto3.client("cloudformation"), stack_name=args.stack_name, env=args.env, parameters=parameters)
    except DeployError as exc:
        print(f"deploy failed: {exc}", file=sys.stderr)
        return 1
    lines = [f"{k}={v}" for k, v in env.items()]
    if args.dotenv:
        Path(args.dotenv).parent.mkdir(parents=True, exist_ok=True)
        Path(args.dotenv).write_text("\n".join(lines) + "\n")
    print("\n".join(f"export {line}" for line in lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
