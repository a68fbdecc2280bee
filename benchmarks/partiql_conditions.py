"""Do ``BatchExecuteStatement``'s per-statement WHERE conditions hold? DynamoDB Local against moto.

Reclaim's writes are conditional (state, time, attempt fence, age). Grouping them 25 to a
``BatchExecuteStatement`` keeps one condition per statement only if the server evaluates each
statement's WHERE clause on its own: a failed condition must fail that statement alone
(``ConditionalCheckFailed`` in its response) and leave the others applied. This script asks two
servers the same questions, with reclaim's own condition shapes:

- DynamoDB Local (Amazon's own emulator, a Java jar), from the npm package
  ``amplify-dynamodb-simulator``, which ships the jar in its tarball (``emulator/DynamoDBLocal.jar``,
  no download at install or run time), fetched and started by ``infra/dynamodb_local.py``; needs
  npm once and Java (17 here);
- moto (``benchmarks/moto_server.py``, no patch).

    .venv/bin/python benchmarks/partiql_conditions.py

Each case prints what the server answered and whether it matches DynamoDB's documented behaviour.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import boto3  # noqa: E402
import moto_server  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

from infra import dynamodb_local  # noqa: E402
from infra.deploy import wait_for_endpoint  # noqa: E402

TABLE = "partiql-probe"
STATEMENT = (
    f'UPDATE "{TABLE}" SET processingState = ? SET updatedTime = ? REMOVE retryDecision '
    "WHERE id = ? AND processingState = ? AND updatedTime = ? AND updatedTime < ? AND attemptId = ?"
)


def probe(endpoint: str) -> list[tuple[str, str, str]]:
    """(case, expected, answered) for each item of one BatchExecuteStatement, then IS MISSING."""
    ddb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    try:
        ddb.delete_table(TableName=TABLE)
        ddb.get_waiter("table_not_exists").wait(TableName=TABLE)
    except ddb.exceptions.ResourceNotFoundException:
        pass
    ddb.create_table(TableName=TABLE, KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
                     AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
                     BillingMode="PAY_PER_REQUEST")  # fmt: skip
    ddb.get_waiter("table_exists").wait(TableName=TABLE)
    for i in range(4):
        ddb.put_item(TableName=TABLE, Item={"id": {"S": f"a{i}"}, "processingState": {"S": "EXECUTING"},
                     "updatedTime": {"N": "100"}, "attemptId": {"S": "x"}, "retryDecision": {"S": "old"}})  # fmt: skip
    # a1: an executor wrote since the scan (time moved on); a3: the attempt fence is gone; a4: no item
    ddb.update_item(TableName=TABLE, Key={"id": {"S": "a1"}}, UpdateExpression="SET updatedTime = :n",
                    ExpressionAttributeValues={":n": {"N": "200"}})  # fmt: skip
    ddb.update_item(TableName=TABLE, Key={"id": {"S": "a3"}}, UpdateExpression="REMOVE attemptId")
    cases = [("a0 unchanged", "applied"), ("a1 time moved on", "ConditionalCheckFailed"),
             ("a2 unchanged", "applied"), ("a3 attempt fence gone", "ConditionalCheckFailed"),
             ("a4 no such item", "ConditionalCheckFailed")]  # fmt: skip
    statements = [
        {"Statement": STATEMENT, "Parameters": [{"S": "COMPLETE"}, {"N": "300"}, {"S": f"a{i}"}, {"S": "EXECUTING"},
                                                 {"N": "100"}, {"N": "150"}, {"S": "x"}]}
        for i in range(5)
    ]  # fmt: skip
    out = []
    responses = ddb.batch_execute_statement(Statements=statements)["Responses"]
    for (case, expected), response in zip(cases, responses, strict=True):
        answered = response.get("Error", {}).get("Code") or "applied"
        out.append((f"batch of 5, {case}", expected, answered))
    for i in range(4):
        item = ddb.get_item(TableName=TABLE, Key={"id": {"S": f"a{i}"}}, ConsistentRead=True)["Item"]
        expected = "COMPLETE" if i in (0, 2) else "EXECUTING"
        out.append((f"a{i} afterwards", expected, item["processingState"]["S"]))
    responses = ddb.batch_execute_statement(
        Statements=[
            {"Statement": f'UPDATE "{TABLE}" SET note = ? WHERE id = ? AND attemptId IS MISSING',
             "Parameters": [{"S": "n"}, {"S": f"a{i}"}]}
            for i in (2, 3)
        ]
    )["Responses"]  # fmt: skip
    for i, expected, response in zip((2, 3), ("ConditionalCheckFailed", "applied"), responses, strict=True):
        out.append((f"IS MISSING on a{i}", expected, response.get("Error", {}).get("Code") or "applied"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "probe")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "probe")
    moto, moto_endpoint = moto_server.start()
    failures = 0
    try:
        with dynamodb_local.running() as local:
            wait_for_endpoint(moto_endpoint, timeout_seconds=120)
            for name, endpoint in ((f"DynamoDB Local {dynamodb_local.VERSION}", local), ("moto", moto_endpoint)):
                print(f"\n{name}:")
                print("| case | DynamoDB's behaviour | answered | |\n|---|---|---|---|")
                try:
                    answers = probe(endpoint)
                except ClientError as exc:  # moto: the whole batch fails (it rejects REMOVE in PartiQL)
                    answers = [("the batch of 5", "per-statement answers", f"error: {str(exc)[:90]}")]
                for case, expected, answered in answers:
                    same = answered == expected
                    failures += (not same) and name.startswith("DynamoDB Local")
                    print(f"| {case} | {expected} | {answered} | {'same' if same else 'DIFFERENT'} |")
    finally:
        moto_server.stop(moto)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
