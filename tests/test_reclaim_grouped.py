"""Reclaim's grouped writes (PartiQL ``BatchExecuteStatement``) against DynamoDB Local.

moto ignores the WHERE conditions of PartiQL statements, so a raced item would be overwritten
there and these tests would pass for the wrong reason. DynamoDB Local (Amazon's own emulator,
``infra/dynamodb_local.py``) evaluates each statement's conditions on its own, as DynamoDB does.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import dagster as dg
import pytest
from botocore.exceptions import ClientError

from pipelines.common import to_item
from pipelines.reclaim.decide import FAIL, Decision
from pipelines.reclaim.engine import SegmentPlan, reclaim_pass
from pipelines.reclaim.params import parse_params
from pipelines.reclaim.source import COMPLETE, Candidate, inspect_table
from pipelines.reclaim.writers import DONE, RACED, STATEMENTS_PER_CALL, DynamoWriter, ItemError, progress_update
from tests.conftest import PATIENCE
from tests.iam_support import Stack, load_template
from tests.reclaim_support import (
    DAY_MS,
    PROGRESS_TABLE,
    agenda,
    create_plain_table,
    heartbeat,
    items_by_id,
    plain_table_with_stale,
    race_reclaims_and_an_executor,
)
from tests.reclaim_support import client as support_client

pytestmark = pytest.mark.xdist_group("dynamodb_local")  # one DynamoDB Local (a JVM) for all of them

READY_TABLE = "POP-ReadyAgenda-dev"
BASE = {"tableName": "grouped-a", "idFieldName": "id", "timeFieldName": "updatedTime", "reclaimAgeMinutes": 60}


@pytest.fixture
def ddb(dynamodb_local_endpoint):
    """A DynamoDB Local client with no tables, and the calls it made (``ddb.calls``)."""
    client = support_client(dynamodb_local_endpoint, "dynamodb")
    for name in client.list_tables()["TableNames"]:
        client.delete_table(TableName=name)
    client.calls = Counter()
    client.meta.events.register("before-call.dynamodb", lambda model, **_: client.calls.update([model.name]))
    return client


def create_template_tables(ddb, *logical_ids: str) -> None:
    """Tables of ``infra/template.yaml`` (Env=dev), created as the template declares them."""
    stack = Stack(load_template())
    for logical_id in logical_ids:
        props = stack.resolve(stack.resource(logical_id)["Properties"])
        keep = ("TableName", "AttributeDefinitions", "KeySchema", "GlobalSecondaryIndexes", "BillingMode")
        ddb.create_table(**{k: v for k, v in props.items() if k in keep})


def seed(ddb, table: str, rows: list[dict]) -> None:
    for row in rows:
        ddb.put_item(TableName=table, Item=to_item(row))


def writer(ddb, table: str, *, grouped: bool, action: str = "fail", ready_table: str | None = None,
           **kw) -> DynamoWriter:  # fmt: skip
    params = parse_params({**BASE, "tableName": table, "reclaimAction": action})
    return DynamoWriter(ddb, params, ready_table=ready_table, grouped=grouped, **kw)


def run_pass(ddb, w, **overrides):
    params = parse_params({**BASE, **overrides})
    return reclaim_pass(ddb, SegmentPlan(params, 0, time.time() + PATIENCE, inspect_table(ddb, params)), w)


# ------------------------------------------------------------------ the statement


def test_the_statement_is_the_update_item_request_in_partiql():
    now = 1_700_000_000_000
    c = Candidate(id="a1", key={"id": {"S": "a1"}}, state="EXECUTING", kind="timeout",
                  time_attr={"N": str(now - DAY_MS)}, time_ms=now - DAY_MS, attempt_id="att-1")  # fmt: skip
    d = Decision(FAIL, 1, {"message": "AgendaProgress timed out."})
    u = progress_update(c, d, parse_params(BASE), now=now, cutoff=now - 3_600_000)
    request = u.request("POP-ProgressAgenda-dev", c.key)
    statement = u.partiql("POP-ProgressAgenda-dev", c.key)
    assert statement["Statement"] == (
        'UPDATE "POP-ProgressAgenda-dev" SET "processingState" = ? SET "processingStateMessage" = ? '
        'SET "updatedTime" = ? SET "completedTime" = ? SET "diagnosticEvents" = ? SET "attemptsCompleted" = ? '
        'WHERE "id" = ? AND "processingState" = ? AND "updatedTime" = ? AND "attemptId" = ? AND "updatedTime" < ?'
    )
    values = request["ExpressionAttributeValues"]
    assert statement["Parameters"] == [
        values[":complete"], values[":failed"], values[":now"], values[":now"], values[":diag"], values[":n"],
        {"S": "a1"}, values[":seen_state"], values[":seen_time"], values[":fence"], values[":cutoff"],
    ]  # fmt: skip
    assert request["ConditionExpression"] == (
        "#s = :seen_state AND #t = :seen_time AND #fence = :fence AND #t < :cutoff"
    )


def test_attribute_not_exists_and_remove_translate():
    c = Candidate(id="b", key={"id": {"S": "b"}}, state="EXECUTING", kind="timeout", time_attr={"N": "5"},
                  time_ms=5, attempt_id=None)  # fmt: skip
    d = Decision("hold", 1, {"message": "retry attempt 1"}, retry_at=99, attempt_id="att-2")
    params = parse_params({**BASE, "reclaimAction": "retry"})
    statement = progress_update(c, d, params, now=10, cutoff=8).partiql("t", c.key)
    assert ' REMOVE "completedTime" REMOVE "startedTime" REMOVE "retryDecision" WHERE ' in statement["Statement"]
    assert '"attemptId" IS MISSING' in statement["Statement"]
    assert '"attemptsCompleted" IS MISSING' in statement["Statement"]
    assert statement["Statement"].count("?") == len(statement["Parameters"])


# ------------------------------------------------------------------ against DynamoDB Local


class Both:
    """Applies every batch twice: grouped to table A, and one UpdateItem at a time to table B (a copy)."""

    def __init__(self, grouped: DynamoWriter, single: DynamoWriter, revive: set[str]) -> None:
        self.grouped, self.single, self.revive = grouped, single, revive
        self.outcomes: list[tuple[list, list]] = []

    def apply_many(self, pairs, *, now, cutoff):
        for c, _ in pairs:
            if c.id in self.revive:  # the executor writes between the scan and the write, in both tables
                heartbeat(self.grouped.dynamodb, c.id, self.grouped.table)
                heartbeat(self.single.dynamodb, c.id, self.single.table)
        single = self.single.apply_many(pairs, now=now, cutoff=cutoff)
        grouped = self.grouped.apply_many(pairs, now=now, cutoff=cutoff)
        self.outcomes.append((single, grouped))
        return grouped


def _rows(now: int) -> list[dict]:
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((now - DAY_MS) / 1000))
    return [
        *(agenda(f"t{n:02d}", "EXECUTING", DAY_MS + n, now=now, maximumAttempts=10) for n in range(30)),  # hold
        agenda("iso", "EXECUTING", 0, now=now, maximumAttempts=10, updatedTime=iso),  # hold, an ISO time seen
        agenda("fenced", "EXECUTING", DAY_MS, now=now, maximumAttempts=10, attemptId="att-0"),  # hold
        agenda("last", "EXECUTING", DAY_MS, now=now, attemptsCompleted=2),  # fail: exhausted
        agenda("never", "EXECUTING", DAY_MS, now=now, retryable=False),  # fail: not retryable
        agenda("failed-out", "COMPLETE", 1000, now=now, message="failed", attemptsCompleted=3),  # close
        agenda("succeeded", "COMPLETE", 1000, now=now, message="succeeded", attemptsCompleted=1),  # left alone
        agenda("fresh", "EXECUTING", 1000, now=now),  # left alone
    ]


def test_grouped_writes_leave_exactly_what_one_update_item_per_item_leaves(ddb):
    now = int(time.time() * 1000)
    for table in ("grouped-a", "single-b"):
        create_plain_table(ddb, table)
        seed(ddb, table, _rows(now))
    both = Both(writer(ddb, "grouped-a", grouped=True, action="retry"),
                writer(ddb, "single-b", grouped=False, action="retry"), revive={"t03", "t17", "never"})  # fmt: skip
    policy = {"kind": "fixed", "delay": 60, "maxAttempts": 10}
    ddb.calls.clear()
    counts = run_pass(ddb, both, reclaimAction="retry", retryPolicy=policy, retryFailed=True, targetBatchSize=50)
    assert (counts.matched, counts.held, counts.reclaimed, counts.exhausted, counts.raced, counts.errors) == (
        35, 30, 1, 1, 3, 0)  # fmt: skip
    for single, grouped in both.outcomes:
        assert grouped == single
    a, b = items_by_id(ddb, "grouped-a"), items_by_id(ddb, "single-b")
    for item_id in both.revive:  # the heartbeats' own times differ by a few ms between the tables
        assert a[item_id].pop("updatedTime") > now - 60_000
        assert b[item_id].pop("updatedTime") > now - 60_000
    assert a == b
    assert a["t00"]["processingState"] == "WAITING"
    assert a["t00"]["retryAt"] > now
    assert a["iso"]["processingState"] == "WAITING"
    assert a["fenced"]["attemptId"] != "att-0"
    assert a["last"]["processingState"] == COMPLETE
    assert a["last"]["retryDecision"] == "exhausted"
    assert a["failed-out"]["retryDecision"] == "exhausted"
    assert a["t03"]["processingState"] == "EXECUTING"
    assert a["t03"]["heartbeat"] is True
    # 35 matched: 25 + 10 statements for table A, where table B took 35 UpdateItem calls (+ 2 x 3 heartbeats)
    assert ddb.calls["BatchExecuteStatement"] == 2
    assert ddb.calls["UpdateItem"] == 35 + 6


def test_a_failed_condition_fails_its_statement_alone(ddb):
    now = int(time.time() * 1000)
    create_plain_table(ddb, "grouped-a")
    seed(ddb, "grouped-a", [agenda(f"a{n}", "EXECUTING", DAY_MS, now=now, attemptId="att-x") for n in range(5)])

    class Interfering:
        def __init__(self, inner):
            self.inner = inner

        def apply_many(self, pairs, *, now, cutoff):
            heartbeat(ddb, "a1", "grouped-a")  # the time moved on
            ddb.update_item(  # a retry took over: the fence moved
                TableName="grouped-a",
                Key={"id": {"S": "a3"}},
                UpdateExpression="SET attemptId = :n",
                ExpressionAttributeValues={":n": {"S": "att-y"}},
            )
            ddb.delete_item(TableName="grouped-a", Key={"id": {"S": "a4"}})  # gone
            return self.inner.apply_many(pairs, now=now, cutoff=cutoff)

    ddb.calls.clear()
    counts = run_pass(ddb, Interfering(writer(ddb, "grouped-a", grouped=True)))
    assert (counts.matched, counts.reclaimed, counts.raced, counts.errors) == (5, 2, 3, 0)
    items = items_by_id(ddb, "grouped-a")
    assert {k for k, v in items.items() if v["processingState"] == COMPLETE} == {"a0", "a2"}
    assert items["a3"]["processingState"] == "EXECUTING"
    assert "diagnosticEvents" in items["a3"]
    assert json.loads(items["a1"]["diagnosticEvents"]) == []
    assert "a4" not in items  # a statement on a missing item is a failed condition, never an insert
    assert ddb.calls["BatchExecuteStatement"] == 1


def test_retries_stay_transactions_beside_the_grouped_updates(ddb):
    now = int(time.time() * 1000)
    create_template_tables(ddb, "AgendaProgressTable", "ReadyAgendaTable")
    rows = [agenda(f"r{n}", "EXECUTING", DAY_MS, now=now) for n in range(4)]
    rows += [agenda(f"x{n}", "EXECUTING", DAY_MS, now=now, retryable=False) for n in range(30)]
    seed(ddb, PROGRESS_TABLE, rows)
    ddb.calls.clear()
    w = writer(ddb, PROGRESS_TABLE, grouped=True, action="retry", ready_table=READY_TABLE)
    policy = {"kind": "fixed", "delay": 0, "maxAttempts": 3}
    counts = run_pass(ddb, w, tableName=PROGRESS_TABLE, reclaimAction="retry", retryPolicy=policy,
                      targetBatchSize=50, objectScanLimit=100)  # fmt: skip
    assert (counts.retried, counts.reclaimed, counts.raced, counts.errors) == (4, 30, 0, 0)
    ready = ddb.scan(TableName=READY_TABLE)["Items"]
    assert sorted(i["agendaProgressId"]["S"] for i in ready) == [f"r{n}" for n in range(4)]
    assert ddb.calls["TransactWriteItems"] == 4
    assert ddb.calls["BatchExecuteStatement"] == 2
    assert ddb.calls["UpdateItem"] == 0
    again = run_pass(ddb, w, tableName=PROGRESS_TABLE, reclaimAction="retry", retryPolicy=policy)
    assert (again.matched, again.retried, again.reclaimed) == (0, 0, 0)


def test_two_overlapping_grouped_reclaims_and_an_executor_never_double_count(ddb, dynamodb_local_endpoint):
    stale = plain_table_with_stale(ddb, "race-agendas", 90, "r")

    def own_client():
        return support_client(dynamodb_local_endpoint, "dynamodb")

    race_reclaims_and_an_executor(own_client, "race-agendas", stale, lambda client: run_pass(
        client, writer(client, "race-agendas", grouped=True), tableName="race-agendas", objectScanLimit=7,
        targetBatchSize=30))  # fmt: skip


def _item_id(statement: dict) -> str:
    """The id of the item a statement updates: the first parameter after WHERE."""
    return statement["Parameters"][statement["Statement"].split(" WHERE ")[0].count("?")]["S"]


class Throttling:
    """A DynamoDB client whose first ``times`` BatchExecuteStatement calls throttle the statements on ``ids``."""

    def __init__(self, client, ids: set[str], times: int) -> None:
        self.client, self.ids, self.times = client, ids, times
        self.sent: list[int] = []

    def __getattr__(self, name):
        return getattr(self.client, name)

    def batch_execute_statement(self, Statements):  # noqa: N803 (boto3's own argument name)
        self.sent.append(len(Statements))
        if self.times <= 0:
            return self.client.batch_execute_statement(Statements=Statements)
        self.times -= 1
        throttled = [_item_id(s) in self.ids for s in Statements]
        passed = [s for s, t in zip(Statements, throttled, strict=True) if not t]
        answers = iter(self.client.batch_execute_statement(Statements=passed)["Responses"] if passed else [])
        error = {"Code": "ProvisionedThroughputExceeded", "Message": "throughput exceeded"}
        return {"Responses": [{"Error": error} if t else next(answers) for t in throttled]}


def test_throttled_statements_are_sent_again_and_left_for_a_later_pass_when_they_stay_throttled(ddb, caplog):
    now = int(time.time() * 1000)
    create_plain_table(ddb, "grouped-a")
    seed(ddb, "grouped-a", [agenda(f"a{n}", "EXECUTING", DAY_MS, now=now) for n in range(6)])
    waits = []
    client = Throttling(ddb, {"a1", "a4"}, times=2)
    w = writer(client, "grouped-a", grouped=True, sleep=waits.append)
    counts = run_pass(client, w)
    assert (counts.reclaimed, counts.raced, counts.errors) == (6, 0, 0)
    assert client.sent == [6, 2, 2]  # the whole group, then only the two throttled statements, twice
    assert len(waits) == 2

    seed(ddb, "grouped-a", [agenda(f"b{n}", "EXECUTING", DAY_MS, now=now) for n in range(3)])
    client = Throttling(ddb, {"b1"}, times=100)
    w = writer(client, "grouped-a", grouped=True, sleep=waits.append)
    counts = run_pass(client, w)
    assert (counts.reclaimed, counts.errors) == (2, 1)  # b1 is an error of this pass; the run goes on
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert line.endswith("(ProvisionedThroughputExceeded); left for a later pass")
    assert items_by_id(ddb, "grouped-a")["b1"]["processingState"] == "EXECUTING"
    assert run_pass(ddb, writer(ddb, "grouped-a", grouped=True)).reclaimed == 1  # the next pass takes it


def test_a_refused_batch_falls_back_to_one_write_per_item(ddb):
    now = int(time.time() * 1000)
    create_plain_table(ddb, "grouped-a")
    seed(ddb, "grouped-a", [agenda(f"a{n}", "EXECUTING", DAY_MS, now=now) for n in range(4)])

    class Refusing:
        def __init__(self, client):
            self.client = client

        def __getattr__(self, name):
            return getattr(self.client, name)

        def batch_execute_statement(self, Statements):  # noqa: N803
            raise ClientError({"Error": {"Code": "ValidationException", "Message": "refused"}},
                              "BatchExecuteStatement")  # fmt: skip

    client = Refusing(ddb)
    ddb.calls.clear()
    counts = run_pass(client, writer(client, "grouped-a", grouped=True))
    assert (counts.reclaimed, counts.errors) == (4, 0)
    assert ddb.calls["UpdateItem"] == 4


def test_groups_never_hold_two_statements_on_one_item():
    from pipelines.reclaim.writers import _distinct_groups

    pairs = [(Candidate(id=i, key={"id": {"S": i}}, state="EXECUTING", kind="timeout", time_attr={"N": "1"},
                        time_ms=1), None) for i in ["a", "b", "a"] + [f"c{n}" for n in range(30)]]  # fmt: skip
    groups = _distinct_groups([(n, {"Statement": str(n)}) for n in range(len(pairs))], pairs)
    assert [len(g) for g in groups] == [STATEMENTS_PER_CALL, len(pairs) - STATEMENTS_PER_CALL]
    for group in groups:
        ids = [pairs[i][0].id for i, _ in group]
        assert len(ids) == len(set(ids))


def test_outcomes_keep_the_order_of_the_pairs(ddb):
    now = int(time.time() * 1000)
    create_plain_table(ddb, "grouped-a")
    seed(ddb, "grouped-a", [agenda(f"a{n:02d}", "EXECUTING", DAY_MS, now=now) for n in range(40)])
    seen = {}

    class Recording:
        def __init__(self, inner):
            self.inner = inner

        def apply_many(self, pairs, *, now, cutoff):
            ddb.delete_item(TableName="grouped-a", Key={"id": {"S": "a31"}})
            outcomes = self.inner.apply_many(pairs, now=now, cutoff=cutoff)
            seen.update({c.id: o for (c, _), o in zip(pairs, outcomes, strict=True)})
            return outcomes

    run_pass(ddb, Recording(writer(ddb, "grouped-a", grouped=True)), targetBatchSize=50)
    assert {k for k, v in seen.items() if v == RACED} == {"a31"}
    assert all(v == DONE for k, v in seen.items() if k != "a31")
    assert not any(isinstance(v, ItemError) for v in seen.values())


# ------------------------------------------------------------------ the job and the deployments


def test_the_reclaim_job_groups_its_writes_when_the_deployment_says_so(ddb, dynamodb_local_endpoint, aws,
                                                                      monkeypatch):  # fmt: skip
    from pipelines.definitions import build_definitions
    from pipelines.reclaim import writers

    create_template_tables(ddb, "AgendaProgressTable", "ReadyAgendaTable")
    now = int(time.time() * 1000)
    seed(ddb, PROGRESS_TABLE, [agenda(f"j{n:02d}", "EXECUTING", DAY_MS, now=now) for n in range(60)])
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", dynamodb_local_endpoint)  # DynamoDB Local; the rest moto
    monkeypatch.setenv("DYNAMODB_GROUPED_WRITES", "true")
    groups = []
    execute = writers.DynamoWriter._execute
    monkeypatch.setattr(writers.DynamoWriter, "_execute", lambda self, group, *a, **k: (
        groups.append(len(group)), execute(self, group, *a, **k))[1])  # fmt: skip
    job = build_definitions("local").resolve_job_def("reclaim_agendas")
    config = {"tableName": PROGRESS_TABLE, "idFieldName": "id", "timeFieldName": "updatedTime",
              "reclaimAgeMinutes": 60, "targetBatchSize": 60, "objectScanLimit": 100}  # fmt: skip
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(run_config=config, instance=instance)
        logs = [e.user_message for e in instance.all_logs(result.run_id)]
    assert result.output_for_node("report_reclaim")["reclaimed"] == 60
    assert groups == [25, 25, 10]
    assert any("writer DynamoDB, grouped writes (up to 25 conditional updates per BatchExecuteStatement)" in m
               for m in logs)  # fmt: skip
    assert all(v["processingState"] == COMPLETE for v in items_by_id(ddb, PROGRESS_TABLE).values())


def test_grouped_writes_are_on_in_prod_and_off_on_moto(monkeypatch):
    from resources import resources_for

    monkeypatch.delenv("DYNAMODB_GROUPED_WRITES", raising=False)
    assert resources_for("prod")["dynamodb"].grouped_writes is True
    assert resources_for("local")["dynamodb"].grouped_writes is False
    assert resources_for("cluster")["dynamodb"].grouped_writes is False
    monkeypatch.setenv("DYNAMODB_GROUPED_WRITES", "false")
    assert resources_for("prod")["dynamodb"].grouped_writes is False
    monkeypatch.setenv("DYNAMODB_GROUPED_WRITES", "maybe")  # loads; using DynamoDB fails with this line
    assert resources_for("local")["dynamodb"].invalid == "DYNAMODB_GROUPED_WRITES='maybe' is invalid: true or false"
