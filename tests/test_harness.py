"""The harness itself: the loopback guard and the per-test reset."""

import boto3
import pytest

from tests.conftest import PATIENCE, NonLocalAWSEndpoint


def test_guard_refuses_a_non_loopback_endpoint():
    client = boto3.client("sqs", endpoint_url="https://sqs.us-east-1.amazonaws.com", region_name="us-east-1")
    with pytest.raises(NonLocalAWSEndpoint, match="127.0.0.1"):
        client.list_queues()


def test_guard_refuses_the_default_aws_endpoint(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    with pytest.raises(NonLocalAWSEndpoint):
        boto3.client("dynamodb", region_name="us-east-1").list_tables()


def test_each_test_starts_from_the_template_alone(aws):
    ddb = aws.client("dynamodb")
    ddb.put_item(TableName=aws.env["RUNS_FLEET_POOLS_TABLE"], Item={"pool_name": {"S": "leftover"}})
    from infra.deploy import deploy
    from tests.conftest import reset_moto

    reset_moto(aws.endpoint)
    deploy(aws.client("cloudformation"))
    assert ddb.scan(TableName=aws.env["RUNS_FLEET_POOLS_TABLE"])["Count"] == 0


def _lines_of_a_process(script: str) -> list[str]:
    """What ``script`` prints, run in a Python process of its own from the repository's root (what
    earlier tests of this worker left in Dagster's process-wide state does not reach it)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=PATIENCE)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


GC_LEAK = """
import gc

import dagster as dg

from tests.suite_plugin import clear_dangling_defs_state_storage

with dg.instance_for_test():
    leftover = dg.build_init_resource_context()  # enters an ephemeral instance; exits in __del__
del leftover
gc.collect()
try:
    dg.Definitions(assets=[]).resolve_all_job_defs()
    print("resolved with the storage left behind")
except dg.DagsterInvariantViolationError as exc:
    print("left behind:", " ".join(str(exc).split()))
print("dropped:", clear_dangling_defs_state_storage())
dg.Definitions(assets=[]).resolve_all_job_defs()
print("dropped again:", clear_dangling_defs_state_storage())
"""


@pytest.mark.slow
def test_a_dagster_defs_state_storage_left_behind_by_gc_is_dropped_between_tests():
    """The leak tests/suite_plugin.py handles, reproduced: without the guard, every later
    Definitions resolution in the process fails. In a process of its own, as the test below."""
    lines = _lines_of_a_process(GC_LEAK)
    assert lines[0].startswith("left behind:"), lines
    assert "undefined DagsterInstance weakref" in lines[0]
    assert lines[1:] == ["dropped: True", "dropped again: False"]


LEAK = """
import gc

import dagster as dg

from tests.suite_plugin import clear_dangling_defs_state_storage

with dg.instance_for_test() as instance:
    leftover = dg.build_init_resource_context()  # enters an ephemeral instance; exits in __del__
del leftover
gc.collect()
try:
    dg.Definitions(assets=[]).resolve_all_job_defs()
    print("resolved with the storage put back")
except Exception as exc:
    print("put back:", " ".join(str(exc).split()))
print("dropped:", clear_dangling_defs_state_storage())
dg.Definitions(assets=[]).resolve_all_job_defs()
print("dropped again:", clear_dangling_defs_state_storage())
"""


@pytest.mark.slow
def test_a_storage_put_back_for_an_ended_test_instance_is_dropped_between_tests():
    """The same leak, with the storage's instance still alive but its directory removed: a context
    entered inside ``instance_for_test`` and exited (by ``__del__``) after it puts back that
    instance's storage, and every later resolution fails to open its database. In a process of its
    own: what earlier tests of a worker left in Dagster's process-wide state must not decide it."""
    lines = _lines_of_a_process(LEAK)
    assert lines[0].startswith("put back:"), lines
    assert "unable to open database file" in lines[0]
    assert lines[1:] == ["dropped: True", "dropped again: False"]


def test_the_shared_stack_is_deployed_once_and_keeps_what_earlier_tests_wrote(moto_endpoint):
    from tests.conftest import reset_moto, shared_stack

    reset_moto(moto_endpoint)
    first = shared_stack(moto_endpoint)  # nothing is deployed: it deploys
    dynamodb = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    dynamodb.put_item(TableName=first["RECEIVERS_TABLE"], Item={"receiver": {"S": "kept"}})
    again = shared_stack(moto_endpoint)
    assert again == first, "the second use finds the same stack"
    item = dynamodb.get_item(TableName=first["RECEIVERS_TABLE"], Key={"receiver": {"S": "kept"}})
    assert "Item" in item, "the second use did not redeploy or reset: what the first wrote is there"
