"""POP's agenda reclaimer: evaluation, scan and index paths, resume, races, dry run, job wiring."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import dagster as dg
import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from pipelines.common import to_item
from pipelines.common.targets import Target
from pipelines.reclaim.defs import build_defs, execution_for, older_run_on_same_table, schedule_for
from pipelines.reclaim.engine import LOOK_READS, KeyValueCursor, SegmentPlan, look, reclaim_pass
from pipelines.reclaim.params import ParamsError, check_max_runtime, parse_params
from pipelines.reclaim.source import CONTRACT_INDEX, TableError, inspect_table, parse_time
from pipelines.reclaim.targets import load_targets
from pipelines.reclaim.writers import DynamoWriter, OperationProgressWriter
from resources import resources_for
from tests.conftest import ATOMIC_DYNAMODB_SERVER, PATIENCE, LogLines, moto_server
from tests.reclaim_support import (
    DAY_MS,
    PROGRESS_TABLE,
    MemoryCursor,
    agenda,
    client,
    create_plain_table,
    heartbeat,
    items_by_id,
    plain_table_with_stale,
    race_reclaims_and_an_executor,
    reexecute_reclaim,
    seed_mixed,
)

BASE = {"tableName": PROGRESS_TABLE, "idFieldName": "id", "timeFieldName": "updatedTime", "reclaimAgeMinutes": 60}


def _params(**overrides):
    return parse_params({**BASE, **overrides})


def _pass(ddb, params, *, writer="dynamo", deadline=None, **kwargs):
    info = inspect_table(ddb, params)
    if writer == "dynamo":
        writer = DynamoWriter(ddb, params)
    return reclaim_pass(ddb, SegmentPlan(params, 0, deadline or time.time() + PATIENCE, info), writer, **kwargs)


# ------------------------------------------------------------------ parameters


def test_params_defaults_are_pops():
    p = parse_params({"tableName": "t-1", "idFieldName": "id", "timeFieldName": "updatedTime"})
    assert (p.maximumExecutionSeconds, p.reclaimAgeMinutes, p.scanDelayMillis) == (60, 0, 0)
    assert (p.targetBatchSize, p.objectScanLimit, p.logReclaimOnly, p.reclaimAction) == (50, 50, False, "fail")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"bogusKey": 1}, "unknown parameter"),
        ({"targetBatchSize": 0}, "targetBatchSize must be at least 1"),
        ({"objectScanLimit": 0}, "objectScanLimit must be at least 1"),
        ({"reclaimAction": "explode"}, "reclaimAction"),
        ({"tableName": "bad name!"}, "tableName"),
        ({"agendaProgressEndpointURL": "ftp://x"}, "http"),
        ({"reclaimAgeMinutes": "5"}, "reclaimAgeMinutes must be a whole number"),
    ],
)
def test_bad_params_are_errors_that_name_the_field(change, message):
    with pytest.raises(ParamsError, match=message):
        parse_params({**BASE, **change})


def test_max_execution_at_or_above_max_runtime_is_refused():
    with pytest.raises(ParamsError, match="dagster/max_runtime"):
        check_max_runtime(_params(maximumExecutionSeconds=120), "120")
    check_max_runtime(_params(maximumExecutionSeconds=119), "120")


def test_time_parsing():
    assert parse_time({"N": "1700000000000"}) == (1700000000000, None)
    assert parse_time({"S": "2023-11-14T22:13:20Z"}) == (1700000000000, None)
    assert parse_time({"S": "2023-11-14T22:13:20.000+00:00"}) == (1700000000000, None)
    assert parse_time(None)[1] == "time field missing"
    assert "neither" in parse_time({"S": "yesterday"})[1]
    assert "BOOL" in parse_time({"BOOL": True})[1]


# ------------------------------------------------------------------ evaluation and paths


def test_index_path_reads_only_stale_items(aws):
    ddb = aws.client("dynamodb")
    ids = seed_mixed(ddb)
    params = _params()
    assert inspect_table(ddb, params).index == "processingState-updatedTime-index"
    counts = _pass(ddb, params)
    assert (counts.scanned, counts.matched, counts.reclaimed, counts.raced) == (7, 7, 7, 0)
    items = items_by_id(ddb)
    failed = {i for i, v in items.items() if v.get("processingStateMessage") == "failed"}
    assert failed == set(ids["stale"])


def test_an_index_path_pass_that_reads_its_query_to_the_end_is_a_completed_pass(aws):
    ddb = aws.client("dynamodb")
    seed_mixed(ddb)
    stopped = _pass(ddb, _params(objectScanLimit=2), writer=None, deadline=time.time() - 1)  # one page of 2
    completed = _pass(ddb, _params())
    assert stopped.completed_pass is False
    assert completed.completed_pass is True


def test_scan_path_handles_bad_and_iso_times_without_crashing(aws):
    ddb = aws.client("dynamodb")
    create_plain_table(ddb, "plain-agendas")
    now = int(time.time() * 1000)
    rows = [
        agenda("num-stale", "EXECUTING", 2 * DAY_MS, now=now),
        {**agenda("iso-stale", "EXECUTING", 0, now=now), "updatedTime": "2020-01-01T00:00:00Z"},
        {**agenda("iso-fresh", "EXECUTING", 0, now=now), "updatedTime": "2999-01-01T00:00:00Z"},
        {**agenda("text-time", "EXECUTING", 0, now=now), "updatedTime": "yesterday"},
        {**agenda("bool-time", "EXECUTING", 0, now=now), "updatedTime": True},
        {**agenda("no-time", "EXECUTING", 0, now=now), "updatedTime": None},
        agenda("fresh", "EXECUTING", 1000, now=now),
        agenda("old-waiting", "WAITING", 2 * DAY_MS, now=now, message="pending"),
    ]
    for row in rows:
        ddb.put_item(TableName="plain-agendas", Item=to_item(row))
    params = _params(tableName="plain-agendas", objectScanLimit=3)
    assert inspect_table(ddb, params).index is None
    counts = _pass(ddb, params)
    assert counts.scanned == len(rows)
    assert (counts.reclaimed, counts.skipped) == (2, 3)
    assert sorted(counts.skipped_ids) == ["bool-time", "no-time", "text-time"]
    items = items_by_id(ddb, "plain-agendas")
    assert {k for k, v in items.items() if v["processingState"] == "COMPLETE"} == {"num-stale", "iso-stale"}
    assert items["old-waiting"]["processingState"] == "WAITING"

    # includeWaiting: a stale WAITING item (de-queued but never started) counts too
    counts = _pass(ddb, _params(tableName="plain-agendas", includeWaiting=True))
    assert counts.reclaimed == 1
    assert items_by_id(ddb, "plain-agendas")["old-waiting"]["processingStateMessage"] == "failed"


def test_resume_walks_the_table_to_the_end_then_starts_over(aws):
    ddb = aws.client("dynamodb")
    plain_table_with_stale(ddb, "big-agendas", 12, "i", age_ms=1000)
    params = _params(tableName="big-agendas", objectScanLimit=5)
    cursor = MemoryCursor()
    seen = []
    for _ in range(4):  # an expired budget: each run reads exactly one page
        counts = _pass(ddb, params, deadline=time.time() - 1, cursor=cursor)
        assert counts.api_calls == 1
        assert counts.stopped_by_budget != counts.completed_pass
        seen.append((counts.scanned, counts.completed_pass))
    assert seen == [(5, False), (5, False), (2, True), (5, False)]


@pytest.mark.parametrize(
    "other",
    [
        {"includeWaiting": True},
        {"reclaimAction": "retry"},
        {"reclaimAction": "retry", "retryFailed": True},
        {"reclaimAgeMinutes": 120},
    ],
)
def test_a_config_reading_other_items_of_the_table_keeps_its_own_scan_position(aws, other):
    ddb = aws.client("dynamodb")
    plain_table_with_stale(ddb, "shared-agendas", 12, "s", age_ms=1000)
    storage = dg.DagsterInstance.ephemeral().run_storage
    params = _params(tableName="shared-agendas", objectScanLimit=5)
    _pass(ddb, params, deadline=time.time() - 1, cursor=KeyValueCursor(storage, params, 0))  # one page, then stops
    saved = KeyValueCursor(storage, params, 0).load()
    assert list(saved) == ["id"]  # the key of the first page's last item
    assert KeyValueCursor(storage, replace(params, objectScanLimit=7, scanDelayMillis=5), 0).load() == saved
    assert KeyValueCursor(storage, replace(params, **other), 0).load() is None  # starts at the table's start


def test_batches_and_budget_finish_the_batch_in_hand(aws):
    ddb = aws.client("dynamodb")
    plain_table_with_stale(ddb, "batch-agendas", 10, "b")
    params = _params(tableName="batch-agendas", objectScanLimit=4, targetBatchSize=3)
    counts = _pass(ddb, params, deadline=time.time() - 1)  # budget gone after the first page
    assert (counts.api_calls, counts.scanned, counts.reclaimed) == (1, 4, 4)


# ------------------------------------------------------------------ races


class ExecutorFirst:
    """A writer wrapper: for chosen ids the executor heartbeats between the read and the write."""

    def __init__(self, ddb, inner, ids):
        self.ddb, self.inner, self.ids = ddb, inner, set(ids)

    def apply_many(self, pairs, *, now, cutoff):
        for c, _ in pairs:
            if c.id in self.ids:
                heartbeat(self.ddb, c.id)
        return self.inner.apply_many(pairs, now=now, cutoff=cutoff)


def test_an_executor_writing_between_read_and_write_always_wins(aws):
    ddb = aws.client("dynamodb")
    ids = seed_mixed(ddb)
    params = _params()
    inner = DynamoWriter(ddb, params)
    revived = ids["stale"][::2]
    counts = _pass(ddb, params, writer=ExecutorFirst(ddb, inner, revived))
    assert counts.raced == len(revived)
    assert counts.reclaimed == len(ids["stale"]) - len(revived)
    items = items_by_id(ddb)
    for item_id in revived:
        assert items[item_id]["processingState"] == "EXECUTING"
        assert items[item_id]["heartbeat"] is True


@pytest.mark.slow
def test_concurrent_executor_and_two_overlapping_reclaims_never_double_count(tmp_path):
    # DynamoDB applies a conditional write atomically per item. The threaded moto server does not (two
    # requests can both pass a condition), so this test runs on a moto server whose DynamoDB writes
    # are serialized, which restores DynamoDB's guarantee without changing anything else.
    with moto_server(tmp_path / "moto.log", ATOMIC_DYNAMODB_SERVER) as endpoint:
        stale = plain_table_with_stale(client(endpoint, "dynamodb"), "race-agendas", 60, "r")
        params = _params(tableName="race-agendas", objectScanLimit=7, targetBatchSize=5)
        race_reclaims_and_an_executor(lambda: client(endpoint, "dynamodb"), "race-agendas", stale,
                                      lambda ddb: _pass(ddb, params))  # fmt: skip


EARLIER_EVENTS = [{"message": "earlier failure: disk full"}]  # a list: DynamoDB type L, not the contract's S


def _operation_table(ddb) -> None:
    ddb.create_table(
        TableName="POP-OperationProgress-test",
        KeySchema=[
            {"AttributeName": "agendaProgressId", "KeyType": "HASH"},
            {"AttributeName": "operationId", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "agendaProgressId", "AttributeType": "S"},
            {"AttributeName": "operationId", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )


def test_operation_progress_items_are_failed_with_the_agenda(aws):
    ddb = aws.client("dynamodb")
    _operation_table(ddb)
    ids = seed_mixed(ddb)
    for state, op in (("EXECUTING", "op-1"), ("COMPLETE", "op-2")):
        row = {"agendaProgressId": ids["stale"][0], "operationId": op, "processingState": state}
        ddb.put_item(TableName="POP-OperationProgress-test", Item=to_item(row))
    garbled = {"agendaProgressId": ids["stale"][0], "operationId": "op-3", "processingState": "EXECUTING"}
    ddb.put_item(TableName="POP-OperationProgress-test", Item=to_item({**garbled, "diagnosticEvents": "[{not json"}))
    as_list = {**garbled, "operationId": "op-4", "diagnosticEvents": EARLIER_EVENTS}
    ddb.put_item(TableName="POP-OperationProgress-test", Item=to_item(as_list))
    params = _params(operationProgressTableName="POP-OperationProgress-test")
    counts = _pass(ddb, params, operations=OperationProgressWriter(ddb, "POP-OperationProgress-test"))
    assert counts.operations_failed == 3
    ops = {i["operationId"]["S"]: i for i in ddb.scan(TableName="POP-OperationProgress-test")["Items"]}
    assert ops["op-1"]["processingStateMessage"]["S"] == "failed"
    assert "AgendaProgress timed out." in ops["op-1"]["diagnosticEvents"]["S"]
    assert ops["op-2"]["processingState"]["S"] == "COMPLETE"
    assert "processingStateMessage" not in ops["op-2"]
    kept = json.loads(ops["op-3"]["diagnosticEvents"]["S"])[0]  # events that are not JSON are kept as text
    assert kept["payload"] == "[{not json"
    kept = json.loads(ops["op-4"]["diagnosticEvents"]["S"])[0]  # events of another type are kept as read
    assert kept["payload"] == to_item({"d": EARLIER_EVENTS})["d"]
    with pytest.raises(TableError, match="agendaProgressId"):
        OperationProgressWriter(ddb, PROGRESS_TABLE)


def test_an_operation_progress_update_dynamodb_refuses_is_one_error_and_the_pass_goes_on(aws):
    ddb = aws.client("dynamodb")
    _operation_table(ddb)
    now = int(time.time() * 1000)
    for n, item_id in enumerate(("big", "next-1", "next-2")):  # the oldest first
        ddb.put_item(
            TableName=PROGRESS_TABLE, Item=to_item(agenda(item_id, "EXECUTING", 4 * DAY_MS - n * 1000, now=now))
        )
        row = {"agendaProgressId": item_id, "operationId": "op-1", "processingState": "EXECUTING"}
        ddb.put_item(TableName="POP-OperationProgress-test", Item=to_item(row))
    near_the_limit = json.dumps([{"message": "x" * 404_500}])  # moto refuses items over 405,000 bytes: the update does
    big = {"agendaProgressId": "big", "operationId": "op-1", "processingState": "EXECUTING"}
    ddb.put_item(TableName="POP-OperationProgress-test", Item=to_item({**big, "diagnosticEvents": near_the_limit}))
    log = LogLines()
    counts = _pass_failing_operations(ddb, log)
    assert (counts.reclaimed, counts.errors, counts.operations_failed) == (3, 1, 2)
    (line,) = [m for m in log.messages if "OperationProgress" in m]
    assert "'agendaProgressId': 'big', 'operationId': 'op-1'" in line


def _failing_operation_calls(ddb, operation: str, agenda_id: str, times: int, error: Exception) -> None:
    """The first ``times`` OperationProgress calls of ``operation`` for ``agenda_id`` raise ``error`` unsent."""
    calls = []

    def hook(params, **_):
        about = params.get("Key", {}).get("agendaProgressId") or params["ExpressionAttributeValues"].get(":id")
        if params["TableName"] == "POP-OperationProgress-test" and about == {"S": agenda_id}:
            calls.append(operation)
            if len(calls) <= times:
                raise error

    ddb.meta.events.register(f"provide-client-params.dynamodb.{operation}", hook)


THROTTLED_QUERY = ClientError({"Error": {"Code": "ProvisionedThroughputExceededException"}}, "Query")


def _agendas_with_operations(ddb) -> list[str]:
    _operation_table(ddb)
    now = int(time.time() * 1000)
    for n, item_id in enumerate(("a-0", "a-1", "a-2")):
        ddb.put_item(TableName=PROGRESS_TABLE, Item=to_item(agenda(item_id, "EXECUTING", 4 * DAY_MS - n, now=now)))
        row = {"agendaProgressId": item_id, "operationId": "op-1", "processingState": "EXECUTING"}
        ddb.put_item(TableName="POP-OperationProgress-test", Item=to_item(row))
    return ["a-0", "a-1", "a-2"]


def _pass_failing_operations(ddb, log=None):
    """A pass failing stale agendas one a batch, and their EXECUTING operations in POP-OperationProgress-test."""
    params = _params(operationProgressTableName="POP-OperationProgress-test", targetBatchSize=1)
    operations = OperationProgressWriter(ddb, "POP-OperationProgress-test")
    return _pass(ddb, params, operations=operations, log=log)


def _operation_states(ddb) -> dict[str, str]:
    items = ddb.scan(TableName="POP-OperationProgress-test")["Items"]
    return {i["agendaProgressId"]["S"]: i["processingState"]["S"] for i in items}


def test_an_operation_progress_query_throttled_once_is_retried_and_the_operations_are_failed(aws):
    ddb = aws.client("dynamodb")
    ids = _agendas_with_operations(ddb)
    _failing_operation_calls(ddb, "Query", "a-1", 1, THROTTLED_QUERY)
    counts = _pass_failing_operations(ddb)
    assert counts.reclaimed == 3
    assert counts.operations_failed == 3
    assert counts.errors == 0
    assert _operation_states(ddb) == dict.fromkeys(ids, "COMPLETE")


def test_an_operation_progress_query_that_keeps_failing_is_that_agendas_error_and_the_pass_goes_on(aws):
    ddb = aws.client("dynamodb")
    _agendas_with_operations(ddb)
    _failing_operation_calls(ddb, "Query", "a-1", 100, THROTTLED_QUERY)
    log = LogLines()
    counts = _pass_failing_operations(ddb, log)
    assert counts.reclaimed == 3
    assert counts.operations_failed == 2
    assert counts.errors == 1
    (line,) = [m for m in log.messages if "OperationProgress" in m]
    assert line.startswith("could not fail an OperationProgress item of a-1: a POP-OperationProgress-test Query failed")
    assert _operation_states(ddb) == {"a-0": "COMPLETE", "a-1": "EXECUTING", "a-2": "COMPLETE"}


def test_an_operation_progress_page_that_keeps_failing_keeps_what_the_pages_before_it_failed(aws):
    ddb = aws.client("dynamodb")
    _agendas_with_operations(ddb)
    row = {"agendaProgressId": "a-1", "operationId": "op-2", "processingState": "EXECUTING"}
    ddb.put_item(TableName="POP-OperationProgress-test", Item=to_item(row))

    def one_item_a_page(params, **_):  # a-1's second page never answers
        if params["TableName"] == "POP-OperationProgress-test":
            params["Limit"] = 1
            if "ExclusiveStartKey" in params and params["ExpressionAttributeValues"][":id"] == {"S": "a-1"}:
                raise THROTTLED_QUERY

    ddb.meta.events.register("provide-client-params.dynamodb.Query", one_item_a_page)
    counts = _pass_failing_operations(ddb)
    assert counts.operations_failed == 3  # a-0's, a-2's and the one on a-1's first page
    assert counts.errors == 1


def test_an_operation_progress_update_that_times_out_is_that_items_error_and_the_pass_goes_on(aws):
    ddb = aws.client("dynamodb")
    _agendas_with_operations(ddb)
    _failing_operation_calls(ddb, "UpdateItem", "a-1", 100, ReadTimeoutError(endpoint_url="http://dynamodb"))
    log = LogLines()
    counts = _pass_failing_operations(ddb, log)
    assert counts.reclaimed == 3
    assert counts.operations_failed == 2
    assert counts.errors == 1
    (line,) = [m for m in log.messages if "OperationProgress" in m]
    assert "'agendaProgressId': 'a-1', 'operationId': 'op-1'" in line


def test_missing_table_error_names_it(aws):
    with pytest.raises(TableError, match="'no-such-table'"):
        inspect_table(aws.client("dynamodb"), _params(tableName="no-such-table"))


# ------------------------------------------------------------------ the Dagster job


def _job():
    from pipelines.definitions import build_definitions

    return build_definitions("local").resolve_job_def("reclaim_agendas")


def _run_job(config: dict, instance=None, tags=None):
    return _job().execute_in_process(
        run_config=config, instance=instance or dg.DagsterInstance.ephemeral(), raise_on_error=False, tags=tags
    )


def _logs(instance, run_id) -> list[str]:
    return [e.user_message for e in instance.all_logs(run_id) if e.user_message]


@pytest.mark.slow
def test_dry_run_changes_nothing_and_logs_every_candidate(aws):
    ddb = aws.client("dynamodb")
    ids = seed_mixed(ddb)
    before = items_by_id(ddb)
    instance = dg.DagsterInstance.ephemeral()
    result = _run_job({**BASE, "logReclaimOnly": True}, instance)
    assert result.success
    assert items_by_id(ddb) == before
    logs = _logs(instance, result.run_id)
    for item_id in ids["stale"]:
        assert any(m.startswith(f"dry run: would fail {item_id} ") for m in logs), item_id
    assert not any(any(i in m for i in ids["fresh"] + ids["waiting"] + ids["complete"]) for m in logs)
    summary = result.output_for_node("report_reclaim")
    assert (summary["would_act"], summary["reclaimed"], summary["dry_run"]) == (7, 0, True)


@pytest.mark.slow
def test_job_reports_counts_metadata_and_metrics(aws):
    ddb = aws.client("dynamodb")
    seed_mixed(ddb)
    result = _run_job(BASE)
    assert result.success
    summary = result.output_for_node("report_reclaim")
    assert (summary["matched"], summary["reclaimed"], summary["raced"], summary["skipped"]) == (7, 7, 0, 0)
    (materialization,) = [
        e for e in result.all_node_events if e.node_name == "report_reclaim" and e.event_type_value == "STEP_OUTPUT"
    ]
    metadata = materialization.event_specific_data.metadata
    assert metadata["reclaimed"].value == 7
    assert metadata["table"].value == PROGRESS_TABLE
    cw = aws.client("cloudwatch")
    metrics = {m["MetricName"] for m in cw.list_metrics(Namespace="RunsFleet")["Metrics"]}
    assert {"AgendaReclaimFailed", "AgendaReclaimRaced", "AgendaReclaimSkipped"} <= metrics


@pytest.mark.slow
def test_budget_limited_runs_resume_from_the_instance_cursor(aws):
    ddb = aws.client("dynamodb")
    ids = plain_table_with_stale(ddb, "resume-agendas", 6, "r")
    instance = dg.DagsterInstance.ephemeral()
    config = {**BASE, "tableName": "resume-agendas", "objectScanLimit": 2, "scanDelayMillis": 1100}
    config["maximumExecutionSeconds"] = 1  # one page, a 1.1 s pause, and the budget is gone
    first = _run_job(config, instance)
    second = _run_job(config, instance)
    assert first.output_for_node("report_reclaim")["reclaimed"] == 2
    assert second.output_for_node("report_reclaim")["reclaimed"] == 2
    assert any(m.startswith("scan segment 1/1: resuming at") for m in _logs(instance, second.run_id))
    failed = {k for k, v in items_by_id(ddb, "resume-agendas").items() if v["processingState"] == "COMPLETE"}
    assert len(failed) == 4
    assert failed < set(ids)


@pytest.mark.slow
def test_parallel_segments_fan_out_as_separate_ops(aws):
    ddb = aws.client("dynamodb")
    plain_table_with_stale(ddb, "seg-agendas", 20, "s")
    result = _run_job({**BASE, "tableName": "seg-agendas", "segments": 3, "objectScanLimit": 4})
    assert result.success
    segment_steps = {e.step_key for e in result.all_node_events if e.step_key.startswith("reclaim_segment[")}
    assert segment_steps == {f"reclaim_segment[segment_{n}]" for n in range(3)}
    assert result.output_for_node("report_reclaim")["reclaimed"] == 20


@pytest.mark.slow
def test_job_refuses_budget_at_or_above_max_runtime_and_missing_table(aws):
    result = _run_job({**BASE, "maximumExecutionSeconds": 120}, tags={"dagster/max_runtime": "120"})
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "dagster/max_runtime" in failure.event_specific_data.error.message
    result = _run_job({**BASE, "tableName": "missing-table"})
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "'missing-table' does not exist" in failure.event_specific_data.error.message


def _failure_description(result) -> str:
    """The description of the step's ``dg.Failure``: the one line the run shows."""
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    return failure.event_specific_data.user_failure_data.description


def test_a_bad_value_fails_the_run_with_one_line(aws):
    result = _run_job({**BASE, "targetBatchSize": 0})
    assert _failure_description(result) == "invalid run config: targetBatchSize must be at least 1, got 0"


def test_a_bad_segments_value_fails_in_the_op_not_in_the_config_mapping(aws):
    result = _run_job({**BASE, "segments": 0})
    assert _failure_description(result) == "invalid run config: segments must be at least 1, got 0"


def test_segments_above_one_run_on_the_multiprocess_executor():
    assert execution_for({"segments": 12}) == {"multiprocess": {"max_concurrent": 8}}


def test_one_segment_runs_in_process():
    assert execution_for({"segments": 1}) == {"in_process": {}}


def test_unknown_config_key_is_refused():
    with pytest.raises(dg.DagsterInvalidConfigError, match="bogus"):
        _job().execute_in_process(run_config={**BASE, "bogus": 1})


@pytest.mark.parametrize("status", [dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING])  # runs until it stops
def test_a_second_run_on_the_same_table_does_nothing(aws, status):
    ddb = aws.client("dynamodb")
    seed_mixed(ddb)
    instance = dg.DagsterInstance.ephemeral()
    older = instance.create_run_for_job(_job(), run_config=BASE, status=status)
    other_table = instance.create_run_for_job(
        _job(), run_config={**BASE, "tableName": "other"}, status=dg.DagsterRunStatus.STARTED
    )
    assert older_run_on_same_table(instance, "not-a-run", "other") == other_table.run_id
    result = _run_job(BASE, instance)
    assert result.success
    summary = result.output_for_node("report_reclaim")
    assert summary["overlapping_run"] == older.run_id
    assert summary["reclaimed"] == 0
    assert not any(v.get("processingStateMessage") == "failed" for v in items_by_id(ddb).values())


@pytest.mark.slow
def test_a_re_execution_that_finds_the_older_run_still_going_is_a_dry_run_too(aws):
    seed_mixed(aws.client("dynamodb"))
    with dg.instance_for_test() as instance:
        instance.create_run_for_job(_job(), run_config=BASE, status=dg.DagsterRunStatus.STARTED)
        parent = _job().execute_in_process(run_config=BASE, instance=instance)  # steps aside: a dry run
        child = reexecute_reclaim(instance, parent.run_id)  # steps aside too
        assert instance.get_run_by_id(child.run_id).tags["groundskeeper/dry_run"] == "true"


def _put(ddb, item_id: str, state: str, age_minutes: float, table: str = PROGRESS_TABLE, **extra) -> None:
    now = int(time.time() * 1000)
    ddb.put_item(TableName=table, Item=to_item(agenda(item_id, state, int(age_minutes * 60_000), now=now, **extra)))


def _tick(schedule: dg.ScheduleDefinition, instance=None) -> dg.ScheduleExecutionData:
    with dg.build_schedule_context(instance=instance, resources=resources_for("local")) as context:
        return schedule.evaluate_tick(context)


def test_targets_file_generates_one_schedule_per_table(aws, tmp_path, monkeypatch):
    _put(aws.client("dynamodb"), "stale", "EXECUTING", 90)
    path = tmp_path / "targets.json"
    path.write_text(json.dumps([{**BASE, "cron": "*/5 * * * *"}, {**BASE, "tableName": "t-two", "cron": "0 * * * *"}]))
    targets = load_targets(path)
    assert [t.name for t in targets] == ["POP_ProgressAgenda_dev", "t_two"]
    schedule = schedule_for(targets[0])
    (request,) = _tick(schedule, dg.DagsterInstance.ephemeral()).run_requests
    assert request.run_config == {**BASE}
    assert request.tags["groundskeeper/table"] == PROGRESS_TABLE
    path.write_text(json.dumps([{**BASE, "cron": "*/5 * * * *", "targetBatchSize": 0}]))
    with pytest.raises(ParamsError, match="entry 0: targetBatchSize"):
        load_targets(path)
    monkeypatch.setenv("RECLAIM_TARGETS_FILE", str(tmp_path / "none.json"))
    from pipelines.definitions import build_definitions

    with pytest.raises(ParamsError, match="none.json"):
        build_definitions("prod")


def test_make_dev_reclaims_the_demo_table_every_five_minutes(aws, monkeypatch):
    _put(aws.client("dynamodb"), "stale", "EXECUTING", 180)  # over the demo target's 120 minutes
    monkeypatch.delenv("RECLAIM_TARGETS_FILE", raising=False)
    monkeypatch.setenv("GROUNDSKEEPER_DEMO", "busy")  # the targets file's cadence (quiet: test_demo_cadence)
    from infra.demo.definitions import build_local_definitions

    defs = build_local_definitions()
    schedule = defs.resolve_schedule_def("reclaim_demo_agendas")
    assert schedule.cron_schedule == "*/5 * * * *"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    (request,) = _tick(schedule, dg.DagsterInstance.ephemeral()).run_requests
    assert request.run_config["reclaimAgeMinutes"] == 120  # younger ones: docs/examples/reclaim_demo.yaml
    assert request.run_config["tableName"] == PROGRESS_TABLE
    assert not build_defs().schedules


# ------------------------------------------------------------------ the schedules' look


def _looked(**config) -> dg.ScheduleExecutionData:
    """A tick of the schedule of a target with ``config`` (over BASE: the deployed table, 60 minutes)."""
    config = {**BASE, **config}
    return _tick(schedule_for(Target("looked", "*/5 * * * *", config, parse_params(config))))


def test_the_schedule_skips_an_empty_table_and_says_why(aws):
    tick = _looked()
    assert tick.run_requests == []
    assert tick.skip_message.startswith(f"{PROGRESS_TABLE}: nothing to reclaim (cutoff 60 min;")


def test_the_schedule_launches_the_run_for_one_stale_item(aws):
    ddb = aws.client("dynamodb")
    _put(ddb, "stale", "EXECUTING", 90)
    assert look(ddb, _params()).reason == f"{PROGRESS_TABLE}: an item to reclaim (query {CONTRACT_INDEX} EXECUTING)"
    (request,) = _looked().run_requests
    assert request.run_config == BASE


def test_the_schedule_skips_an_item_not_yet_stale_and_items_the_run_leaves_alone(aws):
    ddb = aws.client("dynamodb")
    _put(ddb, "young", "EXECUTING", 30)
    _put(ddb, "queued", "WAITING", 90, message="pending")
    _put(ddb, "done", "COMPLETE", 90, message="failed")
    tick = _looked()
    assert tick.run_requests == []
    assert "nothing to reclaim" in tick.skip_message


def test_the_schedule_takes_the_threshold_and_statuses_from_its_target(aws):
    ddb = aws.client("dynamodb")
    _put(ddb, "young", "EXECUTING", 30)
    _put(ddb, "queued", "WAITING", 90, message="pending")
    assert _looked(reclaimAgeMinutes=60).run_requests == []
    assert len(_looked(reclaimAgeMinutes=20).run_requests) == 1
    assert len(_looked(reclaimAgeMinutes=60, includeWaiting=True).run_requests) == 1


def test_on_the_scan_path_the_schedule_skips_a_table_it_reads_to_the_end(aws):
    ddb = aws.client("dynamodb")
    create_plain_table(ddb, "plain-agendas")
    _put(ddb, "young", "EXECUTING", 30, table="plain-agendas")
    tick = _looked(tableName="plain-agendas")
    assert tick.run_requests == []
    assert "scan segment 1/1: 1 read(s)" in tick.skip_message
    _put(ddb, "stale", "EXECUTING", 90, table="plain-agendas")
    assert len(_looked(tableName="plain-agendas", segments=4).run_requests) == 1


def test_on_the_scan_path_the_schedule_runs_when_the_table_is_longer_than_the_look_reads(aws):
    ddb = aws.client("dynamodb")
    create_plain_table(ddb, "long-agendas")
    for n in range(LOOK_READS + 1):
        _put(ddb, f"young-{n}", "EXECUTING", 30, table="long-agendas")
    assert _looked(tableName="long-agendas", objectScanLimit=LOOK_READS + 1).run_requests == []
    said = look(ddb, _params(tableName="long-agendas", objectScanLimit=1)).reason
    assert said == f"long-agendas: scan segment 1/1 not read to its end in {LOOK_READS} page(s): the run reads on"
    (request,) = _looked(tableName="long-agendas", objectScanLimit=1).run_requests
    assert request.run_config["tableName"] == "long-agendas"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"scanDelayMillis": 60_000}, "scanDelayMillis must be at most 10000"),
        ({"maximumExecutionSeconds": 10**9}, "maximumExecutionSeconds must be at most"),
        ({"reclaimAgeMinutes": 10**12}, "reclaimAgeMinutes must be at most"),
        ({"targetBatchSize": 10**7}, "targetBatchSize must be at most"),
        ({"segments": 65}, "segments must be at most 64"),
    ],
)
def test_every_number_has_a_range(change, message):
    with pytest.raises(ParamsError, match=message) as info:
        parse_params({**BASE, **change})
    assert "\n" not in str(info.value)


def test_the_scan_delay_never_sleeps_past_the_budget(aws_shared):
    ddb = aws_shared.client("dynamodb")
    name = f"Reclaim-Delay-{time.time_ns()}"
    plain_table_with_stale(ddb, name, 6, "d")
    params = _params(tableName=name, scanDelayMillis=10_000, objectScanLimit=2, logReclaimOnly=True)
    now = [1000.0]
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    plan = SegmentPlan(params, 0, now[0] + 5, inspect_table(ddb, params))
    counts = reclaim_pass(ddb, plan, None, clock=lambda: now[0], sleep=sleep)
    assert counts.stopped_by_budget
    assert sum(slept) <= 5, slept


def test_every_numeric_parameter_of_reclaim_and_batching_declares_a_range():
    from pipelines.batching.params import ReceiverBatchesParams
    from pipelines.common.params import parse_params as parse_any
    from pipelines.common.params import specs
    from pipelines.reclaim.params import ReclaimParams

    unbounded = [
        f"{cls.__name__}.{spec.name}"
        for cls in (ReclaimParams, ReceiverBatchesParams)
        for spec in specs(cls)
        if spec.kind in (int, float) and (spec.minimum is None or spec.maximum is None)
    ]
    assert not unbounded
    for change, message in (({"lookback_days": 10**9}, "lookback_days must be at most"),
                            ({"lease_wait_seconds": -5}, "lease_wait_seconds must be at least 0")):  # fmt: skip
        with pytest.raises(ParamsError, match=message):
            parse_any(ReceiverBatchesParams, change)


def test_a_range_error_fails_the_run_with_one_line_not_a_config_mapping_traceback(aws_shared):
    from pipelines.definitions import build_definitions

    job = build_definitions("local").resolve_job_def("reclaim_agendas")
    config = {"tableName": "x-range", "idFieldName": "id", "timeFieldName": "t", "targetBatchSize": 0}
    result = job.execute_in_process(run_config=config, raise_on_error=False)  # the config mapping accepts it
    assert not result.success
    failure = result.get_step_failure_events()[0]
    assert failure.step_key == "plan_reclaim"
    description = failure.step_failure_data.user_failure_data.description
    assert description == "invalid run config: targetBatchSize must be at least 1, got 0"
    assert failure.step_failure_data.error.message.strip().splitlines()[-1].endswith(description)


DEEP = "[" * 50000 + "]" * 50000  # JSON nested deeper than the parser goes (100 KB: an item holds 400)


def _one_bad_among_stale(aws, bad: dict, action: str = "fail") -> tuple[dict, dict]:
    ddb = aws.client("dynamodb")
    create_plain_table(ddb, "plain-agendas")
    now = int(time.time() * 1000)
    rows = [agenda(f"good-{n}", "EXECUTING", 2 * DAY_MS, now=now) for n in range(3)]
    rows.insert(1, {**agenda("bad", "EXECUTING", 2 * DAY_MS, now=now), **bad})
    for row in rows:
        ddb.put_item(TableName="plain-agendas", Item=to_item(row))
    config = {"tableName": "plain-agendas", "idFieldName": "id", "timeFieldName": "updatedTime"}
    return ddb, parse_params({**config, "reclaimAgeMinutes": 60, "reclaimAction": action})


@pytest.mark.parametrize(
    ("bad", "action", "counter", "done"),
    [
        ({"diagnosticEvents": DEEP}, "fail", "reclaimed", 4),
        ({"agendaInsight": DEEP}, "retry", "retried", 3),  # no insightId to queue it under: failed, not retried
    ],
)
def test_an_item_with_json_nested_too_deep_for_the_parser_does_not_stop_the_pass(aws, bad, action, counter, done):
    ddb, params = _one_bad_among_stale(aws, bad, action)
    info = inspect_table(ddb, params)
    writer = DynamoWriter(ddb, params, ready_table=aws.env["AGENDA_READY_TABLE"])  # a retry writes its agenda
    counts = reclaim_pass(ddb, SegmentPlan(params, 0, time.time() + PATIENCE, info), writer)
    assert getattr(counts, counter) == done
    assert counts.errors == 0


def test_events_nested_deeper_than_a_write_could_dump_are_kept_as_text_and_every_item_is_failed(aws):
    ddb, params = _one_bad_among_stale(aws, {})
    depths, now = range(400, 1000, 4), int(time.time() * 1000)  # parsed, then dumped a few frames deeper: some fail
    for n in depths:
        row = agenda(f"deep-{n}", "EXECUTING", 2 * DAY_MS, now=now, diagnosticEvents="[" * n + "]" * n)
        ddb.put_item(TableName="plain-agendas", Item=to_item(row))
    counts = _pass(ddb, params)
    assert counts.reclaimed == 4 + len(depths)
    assert counts.errors == 0
    item = ddb.get_item(TableName="plain-agendas", Key={"id": {"S": "deep-400"}})["Item"]
    kept = json.loads(item["diagnosticEvents"]["S"])[0]
    assert kept == {"message": "unparseable diagnosticEvents kept as text", "payload": "[" * 400 + "]" * 400}


def test_diagnostic_events_that_are_not_json_text_are_kept_as_read_when_the_item_is_failed(aws):
    ddb, params = _one_bad_among_stale(aws, {"diagnosticEvents": EARLIER_EVENTS})
    assert _pass(ddb, params).reclaimed == 4
    item = ddb.get_item(TableName="plain-agendas", Key={"id": {"S": "bad"}})["Item"]
    kept, added = json.loads(item["diagnosticEvents"]["S"])
    assert kept == {
        "message": "diagnosticEvents of DynamoDB type L kept as read",
        "payload": to_item({"d": EARLIER_EVENTS})["d"],
    }
    assert added["message"] == "AgendaProgress timed out."


def test_a_dry_run_over_a_time_beyond_any_calendar_says_its_number(aws):
    ddb, params = _one_bad_among_stale(aws, {"updatedTime": -(10**37)})
    info = inspect_table(ddb, params)
    counts = reclaim_pass(ddb, SegmentPlan(params, 0, time.time() + PATIENCE, info), None)
    assert counts.matched == 4


@pytest.mark.parametrize("action", ["fail", "retry"])
def test_an_id_holding_a_newline_stays_on_its_line_of_the_log(aws, action):
    ddb, params = _one_bad_among_stale(aws, {"id": "bad\nforged line\u2028"}, action)
    lines = LogLines()
    _pass(ddb, params, writer=None, log=lines)
    assert "dry run: would " + ("fail" if action == "fail" else "retry") in "".join(lines.messages)
    assert [m for m in lines.messages if not m.isprintable()] == []
