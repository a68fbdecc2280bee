"""Test harness: one moto server per test process (xdist worker), reset and redeployed per test.

- ``moto_endpoint`` (session): a real moto server over HTTP on 127.0.0.1 and a free port, so that
  runs executing in subprocesses (``dagster job execute``, the multiprocess executor) reach it too.
- ``aws`` (function): resets moto (``POST /moto-api/reset``), deploys ``infra/template.yaml`` and
  exports the contract's environment variables; ``aws.client("sqs")`` builds clients. For tests
  that need an empty platform (queue depths, table scans, metrics).
- ``aws_shared`` (function): the same stack without a reset: it deploys only when the stack is not
  there (the first test of a worker, or after a test that reset moto). For logic tests that keep to
  names of their own (a receiver, an agenda, a job id of their own), so they need no redeploy.
- ``atomic_aws`` (function): a moto server of the test's own whose DynamoDB writes are isolated as
  DynamoDB's are, the template deployed: for tests of concurrent writers.
- ``dynamodb_local_endpoint`` (session): Amazon's DynamoDB Local (``infra/dynamodb_local.py``), for
  what moto cannot serve faithfully (PartiQL conditions). Its tests share one xdist group.
- A guard fails any AWS call whose endpoint is not on 127.0.0.1.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import boto3
import botocore.client
import pytest
from botocore.exceptions import ClientError

from infra.deploy import DeployError, deploy, free_port, stack_env, wait_for_endpoint
from infra.local import stop

ROOT = Path(__file__).resolve().parent.parent

# How long a test waits for something to happen (a server to answer, a process to exit, a run to finish)
# before it calls it hung: long, because the suite must pass on a loaded 2-core machine. A wait ends as
# soon as its condition holds, so this costs nothing when things work.
PATIENCE = 600

# tiers, prerequisites, the xdist grouping guard and Dagster's process-wide state
pytest_plugins = ["pytester", "tests.suite_plugin"]

# Never let a test find real credentials or a real default endpoint.
for _name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_DEFAULT_PROFILE"):
    os.environ.pop(_name, None)
os.environ.pop("GROUNDSKEEPER_DEMO", None)  # the local deployment at its default demo cadence (quiet)
os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "DAGSTER_DEPLOYMENT": "local",
        # Until a test asks for `aws`, calls go to a closed loopback port and fail fast.
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        # Tests that build every resource (resources_for) need a value; progressor tests pass their own.
        "PROGRESSOR_DSN": "postgresql://postgres@127.0.0.1:9/progressor",
        # The deployment registers the modules whose functions a retry policy may name.
        "GROUNDSKEEPER_RETRY_FUNCTIONS": "tests.retry_delay_functions",
        # The batching tests use fixed days of 2026; without this the day partitions start 30 to 61
        # days before today (tests/test_batching_backfill.py tests that rule).
        "BATCH_PARTITIONS_START_DATE": "2026-01-01",
    }
)


class NonLocalAWSEndpoint(AssertionError):
    """A test tried to call AWS somewhere other than 127.0.0.1."""


_original_make_api_call = botocore.client.BaseClient._make_api_call


def _guarded_make_api_call(self, operation_name, api_params):
    host = urlparse(self.meta.endpoint_url).hostname
    if host != "127.0.0.1":
        raise NonLocalAWSEndpoint(
            f"{self.meta.service_model.service_name}.{operation_name} would call {self.meta.endpoint_url}: "
            "tests may only call the moto server on 127.0.0.1"
        )
    return _original_make_api_call(self, operation_name, api_params)


botocore.client.BaseClient._make_api_call = _guarded_make_api_call


# moto's server applies concurrent DynamoDB requests without isolation: two conditional writes or
# transactions on one item, arriving at once, can both pass their conditions. DynamoDB serializes
# conditional writes on an item (a transaction is all-or-nothing and isolated). This server takes
# one lock around moto's DynamoDB writes, which gives it DynamoDB's guarantee; everything else is
# moto's (SQS included, whose concurrent deletes may be lost: redeliveries the drains must handle).
ATOMIC_DYNAMODB_SERVER = """
import sys, threading
import moto.dynamodb.models as models
lock = threading.RLock()
for name in ("transact_write_items", "update_item", "put_item", "delete_item"):
    def locked(self, *args, _original=getattr(models.DynamoDBBackend, name), **kwargs):
        with lock:
            return _original(self, *args, **kwargs)
    setattr(models.DynamoDBBackend, name, locked)
from infra.moto_server import main
main(["-H", "127.0.0.1", "-p", sys.argv[1]])
"""


# The benchmarks' patches that change how long moto takes and never what an API answers
# (benchmarks/moto_server.py, checked by tests/test_benchmark_moto.py): a ReceiveMessage that does
# not compute every queue attribute for each message it returns, SQS's clock read without datetime
# objects, moto's module list read once instead of from disk at every request, DynamoDB update
# expressions parsed once per text and their trees walked with class tests looked up by class, and
# each EC2 resource's own tags read directly. Not its other patches: they change what moto does (its
# transaction rollback, its concurrent SQS deletes), which the tests meet as they are.
FAST_SERVER = """
import sys
sys.path.insert(0, "benchmarks")
import moto_server as bench
bench.patch_sqs_retention()
bench.patch_hot_paths()
bench.patch_ec2_tags()
"""
SERVER = (
    FAST_SERVER
    + """
from infra.moto_server import main
main(["-H", "127.0.0.1", "-p", sys.argv[1]])
"""
)


@contextmanager
def moto_server(log_path: Path, script: str | None = None) -> Iterator[str]:
    """A moto server on a free loopback port for the duration of the block; yields its endpoint.
    ``script``: Python source of a patched server, given the port as its argument (default: moto's
    server with the performance patches of ``FAST_SERVER``). A server that exits before it answers (its
    port taken by another process since ``free_port`` found it free) starts again on another port."""
    for attempt in range(3):
        port = free_port()
        # infra.moto_server: moto's server with the template's alarms deployable (see that module)
        cmd = ["-c", script or SERVER, str(port)]
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, *cmd], stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
            )
        endpoint = f"http://127.0.0.1:{port}"
        try:
            wait_for_endpoint(endpoint, timeout_seconds=PATIENCE, proc=proc)
            break
        except DeployError:
            exited = proc.poll() is not None
            stop(proc)
            if not exited or attempt == 2:
                raise
    try:
        yield endpoint
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as endpoint:
        yield endpoint


@pytest.fixture
def atomic_aws(monkeypatch, tmp_path) -> Iterator[LocalAWS]:
    """A moto server of this test's own whose DynamoDB writes are atomic with respect to each other,
    as DynamoDB's are, with the template deployed: for tests of concurrent writers."""
    with moto_server(tmp_path / "moto-atomic.log", FAST_SERVER + ATOMIC_DYNAMODB_SERVER) as endpoint:
        yield _use_stack(endpoint, monkeypatch, deploy(_cloudformation(endpoint)))


@pytest.fixture(scope="session")
def dynamodb_local_endpoint():
    from infra.dynamodb_local import running

    with running() as endpoint:
        yield endpoint


@dataclass
class LocalAWS:
    endpoint: str
    env: dict[str, str]
    _clients: dict = field(default_factory=dict)

    def client(self, service: str):
        if service not in self._clients:
            self._clients[service] = boto3.client(service, endpoint_url=self.endpoint, region_name="us-east-1")
        return self._clients[service]

    def subprocess_env(self) -> dict[str, str]:
        """The environment for a CLI subprocess (``dagster job execute``...) that must reach moto."""
        return {**os.environ, **self.env}


def reset_moto(endpoint: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=PATIENCE).read()


def _use_stack(moto_endpoint: str, monkeypatch, stack_env: dict[str, str]) -> LocalAWS:
    env = {"AWS_ENDPOINT_URL": moto_endpoint, **stack_env}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return LocalAWS(endpoint=moto_endpoint, env=env)


def _cloudformation(moto_endpoint: str):
    return boto3.client("cloudformation", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.fixture
def aws(moto_endpoint, monkeypatch) -> LocalAWS:
    """An empty platform: moto reset and the template deployed afresh."""
    reset_moto(moto_endpoint)
    return _use_stack(moto_endpoint, monkeypatch, deploy(_cloudformation(moto_endpoint)))


def shared_stack(moto_endpoint: str) -> dict[str, str]:
    """The deployed stack's variables; deploys it only when it is not there."""
    cfn = _cloudformation(moto_endpoint)
    try:
        return stack_env(cfn)
    except (ClientError, DeployError):
        return deploy(cfn)


@pytest.fixture
def aws_shared(moto_endpoint, monkeypatch) -> LocalAWS:
    """The deployed platform as earlier tests left it (deployed once if it is not there)."""
    return _use_stack(moto_endpoint, monkeypatch, shared_stack(moto_endpoint))


class LogLines:
    """A log that keeps each message, at any level."""

    def __init__(self):
        self.messages = []

    def __getattr__(self, level):
        return self.messages.append
