"""``make dev``'s AWS side (``infra.local.start_aws``): moto for every service but DynamoDB, DynamoDB
Local for DynamoDB, the template's tables in it as deployed.

moto serves concurrent DynamoDB writes to one table without isolation: its ``TransactWriteItems``
copies the table while a ``BatchWriteItem`` inserts into it, and answers HTTP 500 ("dictionary
changed size during iteration"); batching under steady traffic does both at once."""

from __future__ import annotations

import threading
import uuid

import boto3
import pytest
from botocore.exceptions import ClientError

from infra.deploy import free_port
from infra.local import start_aws

pytestmark = [pytest.mark.dynamodb_local, pytest.mark.slow]

WRITERS = 4  # of each kind
ROUNDS = 40  # calls of each writer


@pytest.fixture(scope="module")
def local_aws(tmp_path_factory):
    started = start_aws(tmp_path_factory.mktemp("local-aws"), free_port(), free_port())
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def local_env(local_aws, monkeypatch):
    """This process's environment as make dev sets every process's (``local_aws.env()``)."""
    for key, value in {**local_aws.env(), **local_aws.stack_env}.items():
        monkeypatch.setenv(key, value)
    return local_aws


def direct(url: str):
    return boto3.client("dynamodb", endpoint_url=url, region_name="us-east-1")


def describe(client, name: str) -> tuple:
    table = client.describe_table(TableName=name)["Table"]
    indexes = sorted(
        (i["IndexName"], repr(i["KeySchema"]), repr(i["Projection"])) for i in table.get("GlobalSecondaryIndexes", [])
    )
    return repr(table["KeySchema"]), repr(sorted(table["AttributeDefinitions"], key=repr)), indexes


def test_dynamodb_local_has_the_templates_tables_as_deployed(local_aws):
    moto, ddb_local = direct(local_aws.endpoint), direct(local_aws.dynamodb_endpoint)
    names = sorted(moto.list_tables()["TableNames"])
    assert sorted(ddb_local.list_tables()["TableNames"]) == names
    assert local_aws.stack_env["BATCH_RECORDS_TABLE"] in names
    assert [describe(ddb_local, n) for n in names] == [describe(moto, n) for n in names]


def test_dynamodb_calls_go_to_dynamodb_local_and_the_others_to_moto(local_env):
    table, item_id = local_env.stack_env["BATCH_RECORDS_TABLE"], f"rec-{uuid.uuid4().hex}"
    boto3.client("dynamodb").put_item(TableName=table, Item={"record_id": {"S": item_id}})  # as every process builds it
    key = {"record_id": {"S": item_id}}
    assert "Item" in direct(local_env.dynamodb_endpoint).get_item(TableName=table, Key=key)
    assert "Item" not in direct(local_env.endpoint).get_item(TableName=table, Key=key)
    assert boto3.client("sqs").meta.endpoint_url == local_env.endpoint


def test_concurrent_transactions_and_batch_writes_on_one_table_get_no_server_error(local_env):
    table = local_env.stack_env["BATCH_RECORDS_TABLE"]
    client = boto3.client("dynamodb")  # the environment's endpoints, as every process of make dev
    errors: list[str] = []
    start = threading.Barrier(2 * WRITERS)

    def batch_writer(n: int) -> None:
        start.wait()
        for r in range(ROUNDS):
            items = [{"PutRequest": {"Item": {"record_id": {"S": f"b{n}-{r}-{k}"}}}} for k in range(25)]
            try:
                client.batch_write_item(RequestItems={table: items})
            except ClientError as exc:
                errors.append(f"BatchWriteItem: {exc}")

    def transactor(n: int) -> None:
        start.wait()
        for r in range(ROUNDS):
            puts = [{"Put": {"TableName": table, "Item": {"record_id": {"S": f"t{n}-{r}-{k}"}}}} for k in range(10)]
            try:
                client.transact_write_items(TransactItems=puts)
            except ClientError as exc:
                errors.append(f"TransactWriteItems: {exc}")

    threads = [threading.Thread(target=f, args=(n,)) for n in range(WRITERS) for f in (batch_writer, transactor)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    written = sum(p["Count"] for p in client.get_paginator("scan").paginate(TableName=table, Select="COUNT"))
    assert written >= WRITERS * ROUNDS * (25 + 10)
