"""The benchmarks' moto patches change how long moto takes, never what an API answers
(``benchmarks/moto_server.py``): checked here against a patched server."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import boto3
import botocore.exceptions
import pytest

from infra.deploy import wait_for_endpoint
from tests.conftest import PATIENCE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import moto_server  # noqa: E402


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    proc, url = moto_server.start(("transactions", "sqs-retention", "sqs-deletes", "hot-paths"))
    try:
        wait_for_endpoint(url, timeout_seconds=PATIENCE, proc=proc)
        yield url
    finally:
        moto_server.stop(proc)


def _client(service: str, endpoint: str):
    return boto3.client(
        service, endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )


def _hash_table(ddb, name: str) -> None:
    """A table keyed by the string ``k`` alone."""
    ddb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


def _update(table: str, key: dict, expression: str, values: dict, condition: str | None = None) -> dict:
    op = {"TableName": table, "Key": key, "UpdateExpression": expression, "ExpressionAttributeValues": values}
    if condition:
        op["ConditionExpression"] = condition
    return {"Update": op}


def test_a_cancelled_transaction_leaves_every_item_as_it_was_and_a_committed_one_writes_all(endpoint):
    ddb = _client("dynamodb", endpoint)
    _hash_table(ddb, "hash-only")
    ddb.create_table(
        TableName="with-range",
        KeySchema=[{"AttributeName": "h", "KeyType": "HASH"}, {"AttributeName": "s", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "h", "AttributeType": "S"},
            {"AttributeName": "s", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    for k in ("a0", "a1"):
        ddb.put_item(TableName="hash-only", Item={"k": {"S": k}, "v": {"N": "0"}})
    ddb.put_item(TableName="with-range", Item={"h": {"S": "x"}, "s": {"S": "1"}, "v": {"N": "0"}})
    one = {":one": {"N": "1"}}
    writes = [
        _update("hash-only", {"k": {"S": "a0"}}, "SET v = v + :one", one),
        {"Put": {"TableName": "hash-only", "Item": {"k": {"S": "new"}, "v": {"N": "9"}}}},
        _update("with-range", {"h": {"S": "x"}, "s": {"S": "1"}}, "SET v = :one", one),
        {"Put": {"TableName": "with-range", "Item": {"h": {"S": "x"}, "s": {"S": "2"}}}},
    ]
    failing = _update("hash-only", {"k": {"S": "a1"}}, "SET v = v + :one", one, "attribute_not_exists(k)")

    def state():
        flat = sorted((i["k"]["S"], i["v"]["N"]) for i in ddb.scan(TableName="hash-only")["Items"])
        ranged = sorted(
            (i["h"]["S"], i["s"]["S"], i.get("v", {}).get("N")) for i in ddb.scan(TableName="with-range")["Items"]
        )
        return flat, ranged

    with pytest.raises(botocore.exceptions.ClientError) as cancelled:
        ddb.transact_write_items(TransactItems=[*writes, failing])
    reasons = [r.get("Code") for r in cancelled.value.response["CancellationReasons"]]
    assert reasons == ["None", "None", "None", "None", "ConditionalCheckFailed"]
    assert state() == ([("a0", "0"), ("a1", "0")], [("x", "1", "0")])

    ddb.transact_write_items(TransactItems=writes)
    assert state() == ([("a0", "1"), ("a1", "0"), ("new", "9")], [("x", "1", "1"), ("x", "2", None)])


def test_two_consumers_deleting_at_once_leave_the_queue_empty(endpoint):
    sqs = _client("sqs", endpoint)
    url = sqs.create_queue(QueueName="two-consumers", Attributes={"VisibilityTimeout": "300"})["QueueUrl"]
    for start in range(0, 400, 10):
        sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": str(n), "MessageBody": f"m{start + n}"} for n in range(10)]
        )
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert counts["ApproximateNumberOfMessages"] == "400"  # the sends skipped counting, the counts are right
    received: list[str] = []
    lock = threading.Lock()

    def consume() -> None:
        client = _client("sqs", endpoint)
        while True:
            got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
            if not got:
                return
            with lock:
                received.extend(m["Body"] for m in got)
            entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(got)]
            assert not client.delete_message_batch(QueueUrl=url, Entries=entries).get("Failed")

    threads = [threading.Thread(target=consume) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(received) == {f"m{n}" for n in range(400)}
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "0"
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "0"  # no deleted message left in flight


def test_a_received_message_stays_hidden_for_its_visibility_timeout_and_a_delayed_one_until_its_delay(endpoint):
    sqs = _client("sqs", endpoint)
    url = sqs.create_queue(QueueName="visibility")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="now")
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=900)
    (first,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=900)["Messages"]
    assert first["Body"] == "now"
    assert sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []) == []
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
    (again,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert again["Body"] == "now"


UPDATES = [
    # (update expression, condition, values): applied in order to one item, each answer compared
    ("SET #a = :s, #b = :n, #c = if_not_exists(#c, :n)", None, {":s": {"S": "x"}, ":n": {"N": "1"}}),
    (
        "SET #b = #b + :n, #l = list_append(if_not_exists(#l, :empty), :list)",
        "#a = :s",
        {":n": {"N": "2"}, ":s": {"S": "x"}, ":empty": {"L": []}, ":list": {"L": [{"S": "y"}]}},
    ),
    (
        "SET #m = :map",
        "attribute_exists(#a) AND (attribute_not_exists(#z) OR #z = :s)",
        {":map": {"M": {"inner": {"N": "5"}}}, ":s": {"S": "x"}},
    ),
    ("SET #m.#inner = #m.#inner - :n REMOVE #c ADD #set :set", None, {":n": {"N": "1"}, ":set": {"SS": ["p", "q"]}}),
    ("SET #a = :s", "#b = :wrong", {":s": {"S": "z"}, ":wrong": {"N": "99"}}),  # the condition fails
    ("SET #k = :s", None, {":s": {"S": "other"}}),  # a key attribute: refused
    ("SET #a = :s SET #b = :s", None, {":s": {"S": "z"}}),  # two SET clauses: refused
    ("SET #a = :missing", None, {":s": {"S": "z"}}),  # an undefined value: refused
    ("SET #b = #a + :n", None, {":n": {"N": "1"}}),  # a string plus a number: refused
    ("SET #a = #nothere", None, {}),  # a path that does not exist: refused
]
NAMES = {"#" + n: n for n in ("a", "b", "c", "l", "m", "z", "inner", "set", "k", "nothere")}


def _answers(endpoint: str) -> list:
    ddb = _client("dynamodb", endpoint)
    _hash_table(ddb, "expressions")
    answers = []
    for expression, condition, values in UPDATES:
        used = {name: attr for name, attr in NAMES.items() if name in expression or name in (condition or "")}
        call = {
            "TableName": "expressions",
            "Key": {"k": {"S": "one"}},
            "UpdateExpression": expression,
            "ExpressionAttributeNames": used,
            "ReturnValues": "ALL_NEW",
        }
        if values:
            call["ExpressionAttributeValues"] = values
        if condition:
            call["ConditionExpression"] = condition
        try:
            answers.append(ddb.update_item(**call)["Attributes"])
        except botocore.exceptions.ClientError as exc:
            answers.append((exc.response["Error"]["Code"], exc.response["Error"]["Message"]))
        # the same update, one of 25 in a transaction
        transact = {k: v for k, v in call.items() if k != "ReturnValues"}
        items = [{"Update": {**transact, "Key": {"k": {"S": f"t{n}"}}}} for n in range(25)]
        try:
            ddb.transact_write_items(TransactItems=items)
            answers.append(ddb.get_item(TableName="expressions", Key={"k": {"S": "t17"}}).get("Item"))
        except botocore.exceptions.ClientError as exc:
            answers.append((exc.response["Error"]["Code"], exc.response["Error"]["Message"]))
    return answers


@pytest.mark.slow  # two moto servers of its own
def test_update_expressions_answer_as_unpatched_moto_answers():
    """The ``hot-paths`` patch of moto's walks of an update expression: every answer (the item after
    it, or the error) is the one unpatched moto gives, alone and in a transaction of 25."""
    answers = []
    for patches in ((), ("transactions", "hot-paths")):
        proc, url = moto_server.start(patches)
        try:
            wait_for_endpoint(url, timeout_seconds=PATIENCE, proc=proc)
            answers.append(_answers(url))
        finally:
            moto_server.stop(proc)
    plain, patched = answers
    assert patched == plain
    assert sum(isinstance(a, tuple) for a in plain) >= 10, plain  # the refusals are refused
    assert isinstance(plain[0], dict), plain[0]
    assert plain[0]["c"] == {"N": "1"}, plain[0]
