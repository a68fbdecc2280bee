"""The batched-write toolkit (``pipelines.common.aws_batches``) and the targets-file reader,
against the moto server: conditional cancellation, fences, refused items, conflicts, throttling,
unprocessed items, metrics in calls of 1000."""

import datetime as dt
import json
import uuid
from collections import Counter
from contextlib import contextmanager

import pytest
from botocore.exceptions import ClientError

from infra.seed import Unprocessed, batch_write
from pipelines.common import from_item, to_item
from pipelines.common.aws_batches import (
    FenceFailed,
    chunks,
    error_code,
    put_metrics,
    transact_conditional,
)
from pipelines.common.params import ParamsError
from pipelines.common.targets import read_targets
from pipelines.retry import fixed

NO_WAIT = fixed(0, max_attempts=4)


def _table(aws) -> str:
    name = f"toolkit-{uuid.uuid4().hex[:12]}"
    ddb = aws.client("dynamodb")
    ddb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name


def _items(aws, table: str) -> dict[str, dict]:
    pages = aws.client("dynamodb").get_paginator("scan").paginate(TableName=table)
    return {i["id"]: i for page in pages for i in map(from_item, page["Items"])}


def _put_new(table: str):
    def action(key: str) -> dict:
        return {
            "Put": {
                "TableName": table,
                "Item": to_item({"id": key, "v": "new"}),
                "ConditionExpression": "attribute_not_exists(id)",
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    return action


@contextmanager
def failing(client, operation: str, error: dict, times: int, extra: dict | None = None):
    """The first ``times`` calls of ``operation`` fail with ``error`` before they are sent; counts calls."""
    calls = Counter()

    def hook(params, **kwargs):
        calls["all"] += 1
        if calls["all"] <= times:
            raise ClientError({"Error": error, **(extra or {})}, operation)

    event = f"provide-client-params.{client.meta.service_model.service_name}.{operation}"
    client.meta.events.register(event, hook)
    try:
        yield calls
    finally:
        client.meta.events.unregister(event, hook)


THROTTLED = {"Code": "ThrottlingException", "Message": "Rate exceeded"}


def counted(client, operation: str):
    """Counts the calls of ``operation``; none fails."""
    return failing(client, operation, THROTTLED, times=0)


def _lease_fence(table: str) -> dict:
    """A ``ConditionCheck`` that item ``lease`` is still owned by ``me``."""
    return {
        "ConditionCheck": {
            "TableName": table,
            "Key": {"id": {"S": "lease"}},
            "ConditionExpression": "#o = :me",
            "ExpressionAttributeNames": {"#o": "owner"},
            "ExpressionAttributeValues": {":me": {"S": "me"}},
        }
    }


# ------------------------------------------------------------------ transact_conditional


def test_failed_conditions_leave_the_transaction_and_the_rest_is_written(aws_shared):
    table, ddb = _table(aws_shared), aws_shared.client("dynamodb")
    ddb.put_item(TableName=table, Item=to_item({"id": "k1", "v": "old"}))
    ddb.put_item(TableName=table, Item=to_item({"id": "k3", "v": "old"}))
    with counted(ddb, "TransactWriteItems") as calls:
        result = transact_conditional(ddb, [f"k{n}" for n in range(5)], _put_new(table), policy=NO_WAIT)
    assert sorted(result.applied) == ["k0", "k2", "k4"]
    assert sorted(result.conditional, key=lambda c: c[0]) == [
        ("k1", {"id": "k1", "v": "old"}),
        ("k3", {"id": "k3", "v": "old"}),
    ]
    assert result.refused == []
    assert result.failed == []
    assert calls["all"] == 2  # the cancelled one, then the rest at once
    assert {k: v["v"] for k, v in _items(aws_shared, table).items()} == {
        "k0": "new",
        "k1": "old",
        "k2": "new",
        "k3": "old",
        "k4": "new",
    }


def test_items_go_in_transactions_of_100_or_99_beside_a_fence(aws_shared):
    table, ddb = _table(aws_shared), aws_shared.client("dynamodb")
    ddb.put_item(TableName=table, Item=to_item({"id": "lease", "owner": "me"}))
    fence = _lease_fence(table)
    keys = [f"k{n:03d}" for n in range(198)]
    with counted(ddb, "TransactWriteItems") as calls:
        result = transact_conditional(ddb, keys, _put_new(table), fence=fence, policy=NO_WAIT)
    assert calls["all"] == 2
    assert sorted(result.applied) == keys

    with counted(ddb, "TransactWriteItems") as calls:
        again = transact_conditional(ddb, keys[:100], _put_new(table), policy=NO_WAIT)
    assert sorted(item for item, _ in again.conditional) == keys[:100]  # each one there: a failed condition
    assert calls["all"] == 1


def test_a_failed_fence_writes_nothing_and_raises(aws_shared):
    table, ddb = _table(aws_shared), aws_shared.client("dynamodb")
    ddb.put_item(TableName=table, Item=to_item({"id": "lease", "owner": "someone else"}))
    fence = _lease_fence(table)
    with pytest.raises(FenceFailed):
        transact_conditional(ddb, ["a", "b"], _put_new(table), fence=fence, policy=NO_WAIT)
    assert set(_items(aws_shared, table)) == {"lease"}


def test_an_item_the_whole_call_refuses_is_found_by_halving_and_the_others_are_written(aws_shared):
    table, ddb = _table(aws_shared), aws_shared.client("dynamodb")
    keys = [f"k{n}" for n in range(7)]

    def refuse_k5(params, **kwargs):
        if any(a["Put"]["Item"]["id"]["S"] == "k5" for a in params["TransactItems"]):
            raise ClientError({"Error": {"Code": "ValidationException", "Message": "bad k5"}}, "TransactWriteItems")

    event = "provide-client-params.dynamodb.TransactWriteItems"
    ddb.meta.events.register(event, refuse_k5)
    try:
        result = transact_conditional(ddb, keys, _put_new(table), policy=NO_WAIT)
    finally:
        ddb.meta.events.unregister(event, refuse_k5)
    assert [item for item, _ in result.refused] == ["k5"]
    assert "ValidationException" in result.refused[0][1]
    assert "\n" not in result.refused[0][1]
    assert sorted(result.applied) == [k for k in keys if k != "k5"]
    assert set(_items(aws_shared, table)) == set(keys) - {"k5"}


def test_an_item_refused_inside_a_cancelled_transaction_is_reported_with_its_reason(aws_shared):
    table, ddb = _table(aws_shared), aws_shared.client("dynamodb")
    reasons = {"CancellationReasons": [{"Code": "None"}, {"Code": "ValidationError", "Message": "too big"}]}
    cancelled = {"Code": "TransactionCanceledException", "Message": "cancelled"}
    with failing(ddb, "TransactWriteItems", cancelled, times=1, extra=reasons):
        result = transact_conditional(ddb, ["a", "b"], _put_new(table), policy=NO_WAIT)
    assert result.refused == [("b", "ValidationError: too big")]
    assert result.applied == ["a"]


def test_conflicts_and_throttling_are_retried_by_the_policy(aws_shared):
    table, ddb = _table(aws_shared), aws_shared.client("dynamodb")
    conflict = {"CancellationReasons": [{"Code": "None"}, {"Code": "TransactionConflict"}]}
    cancelled = {"Code": "TransactionCanceledException", "Message": "cancelled"}
    with failing(ddb, "TransactWriteItems", cancelled, times=2, extra=conflict) as calls:
        result = transact_conditional(ddb, ["a", "b"], _put_new(table), policy=NO_WAIT)
    assert calls["all"] == 3
    assert sorted(result.applied) == ["a", "b"]

    with failing(ddb, "TransactWriteItems", THROTTLED, times=2) as calls:
        result = transact_conditional(ddb, ["c"], _put_new(table), policy=NO_WAIT)
    assert calls["all"] == 3
    assert result.applied == ["c"]


def test_items_still_failing_after_the_policy_are_reported_not_raised(aws_shared):
    table, ddb = _table(aws_shared), aws_shared.client("dynamodb")
    with failing(ddb, "TransactWriteItems", THROTTLED, times=99) as calls:
        result = transact_conditional(ddb, ["a", "b"], _put_new(table), policy=NO_WAIT)
    assert calls["all"] == NO_WAIT.max_attempts
    assert result.failed == ["a", "b"]
    assert result.applied == []
    assert error_code(result.error) == "ThrottlingException"
    assert _items(aws_shared, table) == {}


def test_other_errors_are_raised(aws_shared):
    table, ddb = _table(aws_shared), aws_shared.client("dynamodb")
    with failing(ddb, "TransactWriteItems", {"Code": "AccessDeniedException", "Message": "no"}, times=99) as calls:
        with pytest.raises(ClientError):
            transact_conditional(ddb, ["a"], _put_new(table), policy=NO_WAIT)
    assert calls["all"] == 1


# ------------------------------------------------------------------ batch_write


@contextmanager
def unprocessed(client, table: str, times: int):
    """The first ``times`` BatchWriteItem answers say the call's first request was not processed."""
    calls, first = Counter(), []

    def remember(params, **kwargs):
        first[:] = params["RequestItems"][table][:1]
        calls["sent"] += len(params["RequestItems"][table])

    def answer(http_response, parsed, **kwargs):
        calls["all"] += 1
        if calls["all"] <= times:
            parsed["UnprocessedItems"] = {table: list(first)}

    client.meta.events.register("provide-client-params.dynamodb.BatchWriteItem", remember)
    client.meta.events.register("after-call.dynamodb.BatchWriteItem", answer)
    try:
        yield calls
    finally:
        client.meta.events.unregister("after-call.dynamodb.BatchWriteItem", answer)
        client.meta.events.unregister("provide-client-params.dynamodb.BatchWriteItem", remember)


def test_batch_write_sends_25_a_call_and_resends_unprocessed_items(aws_shared):
    table, ddb = _table(aws_shared), aws_shared.client("dynamodb")
    puts = [{"PutRequest": {"Item": to_item({"id": f"k{n}"})}} for n in range(60)]
    with unprocessed(ddb, table, times=2) as calls:
        assert batch_write(ddb, table, puts, policy=NO_WAIT) == 5
    assert calls["sent"] == 60 + 1 + 1  # 25, 25, 10, and twice the one request left unprocessed
    assert len(_items(aws_shared, table)) == 60


def test_batch_write_gives_up_when_items_stay_unprocessed(aws_shared):
    table, ddb = _table(aws_shared), aws_shared.client("dynamodb")
    puts = [{"PutRequest": {"Item": to_item({"id": "k"})}}]
    with unprocessed(ddb, table, times=10) as calls:
        with pytest.raises(Unprocessed):
            batch_write(ddb, table, puts, policy=NO_WAIT)
    assert calls["all"] == NO_WAIT.max_attempts


# ------------------------------------------------------------------ put_metrics, error_code, chunks


def test_put_metrics_sends_1000_a_call_and_retries_a_throttled_call(aws_shared):
    cw = aws_shared.client("cloudwatch")
    namespace = f"Toolkit{uuid.uuid4().hex[:8]}"
    datums = [{"MetricName": "M", "Value": 1.0, "Unit": "Count"} for _ in range(2001)]
    with failing(cw, "PutMetricData", {"Code": "Throttling", "Message": "Rate exceeded"}, times=1) as calls:
        assert put_metrics(cw, namespace, datums, policy=NO_WAIT) == 3
    assert calls["all"] == 4
    now = dt.datetime.now(dt.UTC)
    points = cw.get_metric_statistics(
        Namespace=namespace,
        MetricName="M",
        StartTime=now - dt.timedelta(hours=1),
        EndTime=now + dt.timedelta(hours=1),
        Period=7200,
        Statistics=["Sum"],
    )["Datapoints"]
    assert sum(p["Sum"] for p in points) == 2001


def test_error_code_reads_unparsed_xml_and_names_other_errors():
    raw = ClientError(
        {"Error": {"Code": "400", "Message": "<Error><Code>InvalidParameterValue</Code><Message>x</Message></Error>"}},
        "PutMetricData",
    )
    assert error_code(raw) == "InvalidParameterValue"
    assert error_code(ClientError({"Error": {"Code": "NoSuchKey"}}, "GetObject")) == "NoSuchKey"
    assert error_code(ValueError("x")) == "ValueError"


def test_chunks():
    assert [list(c) for c in chunks(list(range(7)), 3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(chunks([], 3)) == []


# ------------------------------------------------------------------ targets files


def _parse(config):
    if not isinstance(config.get("n"), int):
        raise ParamsError(f"n must be an integer, got {config.get('n')!r}")
    return config["n"]


def test_read_targets_names_the_entry_of_a_bad_config_and_of_a_duplicate_name(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"cron": "* * * * *", "n": 1, "label": "x"}, {"n": 2}]))
    targets = read_targets(path, "test targets file", _parse, lambda e, n: f"t{n}", default_cron="0 * * * *")
    assert [(t.name, t.cron, t.config, t.params) for t in targets] == [
        ("t1", "* * * * *", {"n": 1, "label": "x"}, 1),
        ("t2", "0 * * * *", {"n": 2}, 2),
    ]
    assert read_targets(None, "test targets file", _parse, lambda e, n: "x") == []

    path.write_text(json.dumps([{"cron": "* * * * *", "n": 1}, {"cron": "* * * * *", "n": "two"}]))
    with pytest.raises(ParamsError, match=r"t\.json, entry 1: n must be an integer"):
        read_targets(path, "test targets file", _parse, lambda e, n: f"t{n}")

    path.write_text(json.dumps([{"n": 1, "name": "a"}, {"n": 2, "name": "a"}]))
    with pytest.raises(ParamsError, match=r"entry 1: duplicate target name 'a'"):
        read_targets(path, "test targets file", _parse, lambda e, n: e["name"], default_cron="* * * * *")
    with pytest.raises(ParamsError, match=r"entry 0: cron must be a 5-field cron string"):
        read_targets(path, "test targets file", _parse, lambda e, n: e["name"])


# ------------------------------------------------------------------ the writers that use the toolkit


def _seed_demo_records(aws, ddb) -> None:
    import random

    from infra.demo.batching import RecordTraffic, receiver_traffic

    receiver_traffic(
        ddb,
        receivers_table=aws.env["RECEIVERS_TABLE"],
        records_table=aws.env["BATCH_RECORDS_TABLE"],
        traffic=RecordTraffic(records=30),
        rng=random.Random(7),
        now=dt.datetime.now(dt.UTC),
    )


def _seed_cluster_table(aws, ddb) -> None:
    from infra.cluster import seed_scan_table

    seed_scan_table(ddb, aws.env["SEED_TABLE"], 30)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [_seed_demo_records, _seed_cluster_table], ids=["demo records", "cluster seed"])
def test_seeders_resend_unprocessed_items_and_give_up_after_the_policy(aws_shared, monkeypatch, seed):
    """Demo traffic and the cluster's seed table write through ``batch_write``: unprocessed items are
    sent again, and a table that keeps refusing them fails the step instead of looping forever."""
    monkeypatch.setitem(aws_shared.env, "SEED_TABLE", f"seed-{uuid.uuid4().hex[:12]}")
    ddb = aws_shared.client("dynamodb")
    table = aws_shared.env["SEED_TABLE"] if seed is _seed_cluster_table else aws_shared.env["BATCH_RECORDS_TABLE"]
    with unprocessed(ddb, table, times=2) as calls:
        seed(aws_shared, ddb)
    assert calls["all"] == 4  # 25 (one left), that one (left again), that one, then the last 5
    with unprocessed(ddb, table, times=10) as calls:
        with pytest.raises(Unprocessed):
            seed(aws_shared, ddb)
    assert calls["all"] == 4  # runs-fleet's policy: 4 attempts


def test_reclaim_metrics_retry_a_throttled_call(aws_shared):
    from pipelines.reclaim.defs import ACTION_METRICS, put_reclaim_metrics

    cw = aws_shared.client("cloudwatch")
    namespace = f"Toolkit{uuid.uuid4().hex[:8]}"
    with failing(cw, "PutMetricData", {"Code": "Throttling", "Message": "Rate exceeded"}, times=1) as calls:
        assert put_reclaim_metrics(cw, namespace, "agendas", {"reclaimed": 3}) == len(ACTION_METRICS)
    assert calls["all"] == 2
    names = {m["MetricName"] for m in cw.list_metrics(Namespace=namespace)["Metrics"]}
    assert names == set(ACTION_METRICS.values())
