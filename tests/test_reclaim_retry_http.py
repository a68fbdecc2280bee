"""Reclaim's retry action (policy delays, attempt budget, ReadyAgenda) and the HTTP endpoint writer."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest
from botocore.exceptions import ClientError

from infra.agenda_endpoint import LocalAgendaEndpoint
from pipelines.common import from_item, to_item
from pipelines.reclaim import http as reclaim_http
from pipelines.reclaim.decide import decide
from pipelines.reclaim.engine import SegmentPlan, reclaim_pass
from pipelines.reclaim.http import EndpointError, Secret, make_writer
from pipelines.reclaim.params import ParamsError, parse_params, policy_from_params
from pipelines.reclaim.source import inspect_table, to_candidate
from pipelines.reclaim.writers import RACED, DynamoWriter, ItemError, apply_each
from pipelines.retry import dynamodb_fence
from tests.conftest import PATIENCE
from tests.reclaim_support import DAY_MS, PROGRESS_TABLE, agenda, encrypted_password, items_by_id, seed_mixed

BASE = {"tableName": PROGRESS_TABLE, "idFieldName": "id", "timeFieldName": "updatedTime", "reclaimAgeMinutes": 60}


class ListLog:
    """Collects what the engine logs (to check candidates are listed and secrets are not)."""

    def __init__(self):
        self.lines: list[str] = []

    def info(self, msg):
        self.lines.append(msg)

    warning = error = info


@dataclasses.dataclass(frozen=True)
class EndpointSettings:
    """The fields of the ``agenda`` settings resource the writer reads."""

    progress_url: str | None = None
    identity_url: str | None = None
    idm_user: str | None = None
    idm_encrypted_pass: str | None = None
    progress_allowed_urls: str | None = None  # comma-separated URL prefixes a run config may name
    ready_table: str | None = None


def run(aws, endpoint=None, log=None, **overrides):
    ddb = aws.client("dynamodb")
    params = parse_params({**BASE, **overrides})
    writer = make_writer(
        params,
        dynamodb=ddb,
        kms=aws.client("kms"),
        agenda=dataclasses.replace(endpoint or EndpointSettings(), ready_table=aws.env["AGENDA_READY_TABLE"]),
    )
    plan = SegmentPlan(params, 0, time.time() + PATIENCE, inspect_table(ddb, params))
    return reclaim_pass(ddb, plan, writer, log=log or ListLog())


def put(aws, *rows):
    for row in rows:
        aws.client("dynamodb").put_item(TableName=PROGRESS_TABLE, Item=to_item(row))


def ready_items(aws) -> dict[str, dict]:
    items = aws.client("dynamodb").scan(TableName=aws.env["AGENDA_READY_TABLE"])["Items"]
    return {i["agendaProgressId"]["S"]: from_item(i) for i in items}


def events(item) -> list[str]:
    return [e["message"] for e in json.loads(item["diagnosticEvents"])]


# ------------------------------------------------------------------ retry action


def test_retry_resets_to_waiting_and_queues_ahead_of_new_work(aws):
    now = int(time.time() * 1000)
    put(aws, agenda("a", "EXECUTING", DAY_MS, now=now), agenda("b", "EXECUTING", DAY_MS, now=now, maximumAttempts=5))
    counts = run(aws, reclaimAction="retry")
    assert counts.retried == 2
    items = items_by_id(aws.client("dynamodb"))
    for item_id in ("a", "b"):
        item = items[item_id]
        assert (item["processingState"], item["processingStateMessage"], item["attemptsCompleted"]) == (
            "WAITING",
            "pending",
            1,
        )
        assert events(item) == ["retry attempt 1"]
        assert "retryAt" not in item
    ready = ready_items(aws)
    assert set(ready) == {"a", "b"}
    assert ready["a"]["insightId"] == "insight-7"
    assert ready["a"]["agendaId"] == "agenda-a"
    assert ready["a"]["customerId"] == "cust-1"
    assert ready["a"]["insightIdCustomerIdComposite"] == "insight-7cust-1"  # POP's scheduler queries it
    assert ready["a"]["retryAttempt"] == 1
    assert ready["a"]["priority"] == 1
    # FIFO by `added`: the retry carries its original addedTime, so it sorts ahead of work added now
    assert ready["a"]["added"] == items["a"]["addedTime"] < now
    # nothing left to do: a second pass queues nothing twice
    assert run(aws, reclaimAction="retry").retried == 0
    assert len(ready_items(aws)) == 2


NO_QUEUE_KEY = {
    "agendaInsight missing": ({"agendaInsight": None}, "insightId"),
    "agendaInsight not JSON": ({"agendaInsight": "{insightId"}, "insightId"),
    "customerId missing": ({"customerId": None}, "customerId"),
}


@pytest.mark.parametrize("through", ["dynamodb", "endpoint"])
@pytest.mark.parametrize("change", list(NO_QUEUE_KEY.values()), ids=list(NO_QUEUE_KEY))
def test_an_agenda_without_the_ids_pops_scheduler_queries_by_is_failed_not_retried(aws, request, through, change):
    """A ReadyAgenda item without them would never be taken: retried or held, the agenda would stay stuck."""
    fields, missing = change
    now = int(time.time() * 1000)
    put(aws, agenda("lost", "EXECUTING", DAY_MS, now=now, **fields), agenda("ok", "EXECUTING", DAY_MS, now=now))
    settings = endpoint_settings(aws, request.getfixturevalue("endpoint")) if through == "endpoint" else None
    policy = {"kind": "fixed", "delay": 60, "maxAttempts": 3}  # "ok" is held, "lost" failed
    counts = run(aws, endpoint=settings, log=ListLog(), reclaimAction="retry", retryPolicy=policy)
    assert (counts.held, counts.errors) == (1, 0)
    assert ready_items(aws) == {}
    lost = items_by_id(aws.client("dynamodb"))["lost"]
    assert lost["processingState"] == "COMPLETE"
    assert lost["processingStateMessage"] == "failed"
    assert f"not retryable (no {missing} for its ReadyAgenda item)" in str(lost["diagnosticEvents"])


def late_write(aws, item_id: str, attempt_id: str | None) -> bool:
    """An executor of ``attempt_id`` finishes late: COMPLETE/succeeded, fenced by its attempt.
    Returns whether DynamoDB took the write."""
    fence = dynamodb_fence(attempt_id)
    try:
        aws.client("dynamodb").update_item(
            TableName=PROGRESS_TABLE,
            Key={"id": {"S": item_id}},
            UpdateExpression="SET processingState = :complete, processingStateMessage = :succeeded",
            ConditionExpression=fence["condition"],
            ExpressionAttributeNames=fence["names"],
            ExpressionAttributeValues={
                ":complete": {"S": "COMPLETE"},
                ":succeeded": {"S": "succeeded"},
                **fence["values"],
            },
        )
    except aws.client("dynamodb").exceptions.ConditionalCheckFailedException:
        return False
    return True


def test_retry_writes_a_new_attempt_id_on_the_progress_and_the_ready_item(aws):
    now = int(time.time() * 1000)
    put(aws, agenda("a", "EXECUTING", DAY_MS, now=now, attemptId="att-first"))
    run(aws, reclaimAction="retry")
    attempt_id = items_by_id(aws.client("dynamodb"))["a"]["attemptId"]
    assert attempt_id not in (None, "att-first")
    assert ready_items(aws)["a"]["attemptId"] == attempt_id


def test_a_late_write_from_the_superseded_attempt_is_rejected(aws):
    now = int(time.time() * 1000)
    put(aws, agenda("late", "EXECUTING", DAY_MS, now=now, attemptId="att-first"))
    run(aws, reclaimAction="retry")  # attempt att-first timed out: a new attempt is queued
    assert late_write(aws, "late", "att-first") is False
    assert items_by_id(aws.client("dynamodb"))["late"]["processingState"] == "WAITING"


def test_the_new_attempt_still_writes(aws):
    now = int(time.time() * 1000)
    put(aws, agenda("live", "EXECUTING", DAY_MS, now=now))  # no attempt id yet: written before them
    run(aws, reclaimAction="retry")
    assert late_write(aws, "live", ready_items(aws)["live"]["attemptId"]) is True


def test_a_reclaim_write_for_a_superseded_attempt_is_raced(aws):
    """A reclaim run read the item; before it writes, a retry superseded that attempt. Everything
    else (state, time, attempts) is as read, so only the fence refuses the write."""
    ddb = aws.client("dynamodb")
    now = int(time.time() * 1000)
    put(aws, agenda("x", "EXECUTING", DAY_MS, now=now, attemptId="att-first"))
    params = parse_params(BASE)
    info = inspect_table(ddb, params)
    (item,) = ddb.scan(TableName=PROGRESS_TABLE)["Items"]
    candidate = to_candidate(item, info, params, now)
    ddb.update_item(
        TableName=PROGRESS_TABLE,
        Key={"id": {"S": "x"}},
        UpdateExpression="SET attemptId = :next",
        ExpressionAttributeValues={":next": {"S": "att-next"}},
    )
    writer = DynamoWriter(ddb, params)
    decision = decide(candidate, action="fail", now=now, cutoff=params.cutoff_ms(now), policy=policy_from_params(None))
    assert writer.apply(candidate, decision, now=now, cutoff=params.cutoff_ms(now)) == RACED


class CancelledTransactions:
    """DynamoDB as it answers a retry's TransactWriteItems cancelled for ``codes`` (one per action)."""

    def __init__(self, real, codes):
        self.real, self.codes = real, codes

    def __getattr__(self, name):
        return getattr(self.real, name)

    def transact_write_items(self, **kwargs):
        reasons = [{"Code": code, **({"Message": f"{code} here"} if code != "None" else {})} for code in self.codes]
        error = {"Error": {"Code": "TransactionCanceledException", "Message": "Transaction cancelled"}}
        raise ClientError({**error, "CancellationReasons": reasons}, "TransactWriteItems")


CANCELLATIONS = {
    "throttled": (
        ["ThrottlingError", "None"],
        "errors",
        "(ThrottlingError: ThrottlingError here); left for a later pass",
    ),
    "conflict": (
        ["None", "TransactionConflict"],
        "errors",
        "(TransactionConflict: TransactionConflict here); left for a later pass",
    ),
    "over 400 KB": (["ValidationError", "None"], "errors", "cancelled (ValidationError: ValidationError here)"),
    "progress moved on": (["ConditionalCheckFailed", "None"], "raced", "changed since it was read; left alone"),
    "queued already": (["None", "ConditionalCheckFailed"], "raced", "changed since it was read; left alone"),
}


@pytest.mark.parametrize(("codes", "counter", "said"), list(CANCELLATIONS.values()), ids=list(CANCELLATIONS))
def test_a_cancelled_retry_is_raced_only_when_a_condition_failed(aws, codes, counter, said):
    now = int(time.time() * 1000)
    put(aws, agenda("c", "EXECUTING", DAY_MS, now=now))
    ddb = aws.client("dynamodb")
    params = parse_params({**BASE, "reclaimAction": "retry"})
    writer = DynamoWriter(CancelledTransactions(ddb, codes), params, ready_table=aws.env["AGENDA_READY_TABLE"])
    log = ListLog()
    plan = SegmentPlan(params, 0, time.time() + PATIENCE, inspect_table(ddb, params))
    counts = reclaim_pass(ddb, plan, writer, log=log)
    assert getattr(counts, counter) == 1
    assert counts.errors + counts.raced == 1
    (line,) = [line for line in log.lines if " c" in line]  # one line about the item
    assert line.endswith(said)


def test_attempt_budget_counts_the_timed_out_attempt(aws):
    now = int(time.time() * 1000)
    put(
        aws,
        agenda("last", "EXECUTING", DAY_MS, now=now, attemptsCompleted=2),  # 2 + 1 = 3 = maximumAttempts (default)
        agenda("more", "EXECUTING", DAY_MS, now=now, attemptsCompleted=2, maximumAttempts=4),
        agenda("never", "EXECUTING", DAY_MS, now=now, retryable=False),
    )
    counts = run(aws, reclaimAction="retry")
    assert (counts.retried, counts.reclaimed) == (1, 2)
    items = items_by_id(aws.client("dynamodb"))
    assert (items["last"]["processingState"], items["last"]["attemptsCompleted"]) == ("COMPLETE", 3)
    assert events(items["last"]) == ["AgendaProgress timed out. attempts exhausted (3 of 3)"]
    assert items["last"]["retryDecision"] == "exhausted"
    assert (items["more"]["processingState"], items["more"]["attemptsCompleted"]) == ("WAITING", 3)
    assert events(items["never"]) == ["AgendaProgress timed out. not retryable"]
    assert set(ready_items(aws)) == {"more"}


def test_policy_delays_hold_the_retry_until_a_later_run_queues_it(aws):
    now = int(time.time() * 1000)
    put(
        aws,
        agenda("first", "EXECUTING", DAY_MS, now=now, maximumAttempts=10),
        agenda("second", "EXECUTING", DAY_MS, now=now, maximumAttempts=10, attemptsCompleted=1),
        agenda("stop", "EXECUTING", DAY_MS, now=now, maximumAttempts=10, attemptsCompleted=2),
    )
    policy = {"kind": "exponential", "initial": 60, "coefficient": 2, "maxDelay": 3600, "maxAttempts": 3}
    policy["jitter"] = "none"
    counts = run(aws, reclaimAction="retry", retryPolicy=policy)
    assert (counts.held, counts.retried, counts.reclaimed) == (2, 0, 1)  # "stop": the policy's 3 attempts are used
    items = items_by_id(aws.client("dynamodb"))
    # delay(n) after n attempts: delay(1) = 60 s, delay(2) = 120 s
    assert abs(items["first"]["retryAt"] - (now + 60_000)) < 10_000
    assert abs(items["second"]["retryAt"] - (now + 120_000)) < 10_000
    assert items["first"]["processingState"] == "WAITING"
    assert events(items["first"]) == ["retry attempt 1"]
    assert "exhausted" in events(items["stop"])[0]
    assert ready_items(aws) == {}

    assert run(aws, reclaimAction="retry", retryPolicy=policy).queued == 0  # not due yet: held
    aws.client("dynamodb").update_item(
        TableName=PROGRESS_TABLE,
        Key={"id": {"S": "first"}},
        UpdateExpression="SET retryAt = :past",
        ExpressionAttributeValues={":past": {"N": str(now - 1)}},
    )
    counts = run(aws, reclaimAction="retry", retryPolicy=policy)
    assert counts.queued == 1
    assert set(ready_items(aws)) == {"first"}
    assert ready_items(aws)["first"]["retryAttempt"] == 1
    items = items_by_id(aws.client("dynamodb"))
    assert "retryAt" not in items["first"]
    assert "retryAt" in items["second"]


@pytest.mark.parametrize("through", ["dynamodb", "endpoint"])
def test_a_held_retry_whose_retry_at_is_not_whole_is_queued(aws, request, through):
    now = int(time.time() * 1000)
    put(aws, agenda("half", "WAITING", DAY_MS, now=now, message="pending", attemptsCompleted=1))
    aws.client("dynamodb").update_item(
        TableName=PROGRESS_TABLE,
        Key={"id": {"S": "half"}},
        UpdateExpression="SET retryAt = :past",
        ExpressionAttributeValues={":past": {"N": f"{now - 60_000}.5"}},
    )
    settings = endpoint_settings(aws, request.getfixturevalue("endpoint")) if through == "endpoint" else None
    counts = run(aws, endpoint=settings, reclaimAction="retry")
    assert (counts.queued, counts.raced) == (1, 0)
    assert set(ready_items(aws)) == {"half"}


@pytest.mark.parametrize("through", ["dynamodb", "endpoint"])
def test_a_queued_held_retry_is_fresh_and_the_next_run_with_include_waiting_leaves_it_alone(aws, request, through):
    now = int(time.time() * 1000)
    held = agenda("held", "WAITING", DAY_MS, now=now, message="pending", attemptsCompleted=1, retryAt=now - 1000)
    put(aws, held)
    settings = endpoint_settings(aws, request.getfixturevalue("endpoint")) if through == "endpoint" else None
    assert run(aws, endpoint=settings, reclaimAction="retry", includeWaiting=True).queued == 1
    assert items_by_id(aws.client("dynamodb"))["held"]["updatedTime"] >= now
    again = run(aws, endpoint=settings, reclaimAction="retry", includeWaiting=True)
    assert (again.matched, again.retried) == (0, 0)
    assert len(ready_items(aws)) == 1


def test_non_retryable_error_types_of_the_policy(aws):
    now = int(time.time() * 1000)
    bad = [{"message": "boom", "errorType": "ValidationException"}]
    put(aws, agenda("v", "EXECUTING", DAY_MS, now=now, diagnosticEvents=json.dumps(bad)))
    policy = {"kind": "fixed", "delay": 0, "maxAttempts": 5, "nonRetryable": ["ValidationException"]}
    counts = run(aws, reclaimAction="retry", retryPolicy=policy)
    assert counts.reclaimed == 1
    assert counts.retried == 0
    assert (
        events(items_by_id(aws.client("dynamodb"))["v"])[-1]
        == "AgendaProgress timed out. not retryable (ValidationException)"
    )
    assert items_by_id(aws.client("dynamodb"))["v"]["retryDecision"] == "non-retryable"


def test_retry_failed_handles_each_failure_once(aws):
    now = int(time.time() * 1000)
    put(
        aws,
        agenda("failed-once", "COMPLETE", 1000, now=now, message="failed", attemptsCompleted=1),
        agenda("failed-out", "COMPLETE", 1000, now=now, message="failed", attemptsCompleted=3),
        agenda("succeeded", "COMPLETE", 1000, now=now, message="succeeded", attemptsCompleted=1),
    )
    counts = run(aws, reclaimAction="retry", retryFailed=True)
    assert (counts.retried, counts.exhausted) == (1, 1)
    items = items_by_id(aws.client("dynamodb"))
    assert (items["failed-once"]["processingState"], items["failed-once"]["attemptsCompleted"]) == ("WAITING", 1)
    assert items["failed-out"]["processingState"] == "COMPLETE"
    assert items["failed-out"]["retryDecision"] == "exhausted"
    assert items["succeeded"]["diagnosticEvents"] == "[]"
    again = run(aws, reclaimAction="retry", retryFailed=True)
    assert (again.matched, again.retried, again.exhausted) == (0, 0, 0)
    assert set(ready_items(aws)) == {"failed-once"}


def test_retry_failed_on_the_index_path_finds_a_recent_failure_behind_a_long_history(aws):
    ddb = aws.client("dynamodb")
    now = int(time.time() * 1000)
    history = [agenda(f"ok-{n:02d}", "COMPLETE", 2 * DAY_MS + n, now=now, message="succeeded") for n in range(30)]
    put(aws, *history, agenda("failed-now", "COMPLETE", 60_000, now=now, message="failed", attemptsCompleted=1))
    params = parse_params({**BASE, "reclaimAction": "retry", "retryFailed": True, "objectScanLimit": 5})
    info = inspect_table(ddb, params)
    reads = []

    class CountingReads:
        def __getattr__(self, name):
            return getattr(ddb, name)

        def query(self, **kwargs):
            reads.append(kwargs["KeyConditionExpression"])
            return ddb.query(**kwargs)

    writer = DynamoWriter(ddb, params, ready_table=aws.env["AGENDA_READY_TABLE"])
    budget = SegmentPlan(params, 0, 1.0, info)  # used up after the EXECUTING, WAITING and one COMPLETE page
    counts = reclaim_pass(CountingReads(), budget, writer, log=ListLog(), clock=lambda: 2.0 if len(reads) >= 3 else 0.0)
    assert info.index is not None
    assert reads == ["#s = :exec AND #t < :cutoff", "#s = :wait", "#s = :complete"]
    assert counts.retried == 1
    assert set(ready_items(aws)) == {"failed-now"}


@pytest.mark.slow
def test_retry_config_through_the_job(aws):
    from pipelines.definitions import build_definitions

    now = int(time.time() * 1000)
    put(aws, agenda("j", "EXECUTING", DAY_MS, now=now))
    job = build_definitions("local").resolve_job_def("reclaim_agendas")
    config = {**BASE, "reclaimAction": "retry", "retryPolicy": {"kind": "fixed", "delay": 0, "maxAttempts": 3}}
    result = job.execute_in_process(run_config=config)
    assert result.output_for_node("report_reclaim")["retried"] == 1
    assert set(ready_items(aws)) == {"j"}


# ------------------------------------------------------------------ HTTP endpoint writer


@pytest.fixture
def endpoint(aws):
    with LocalAgendaEndpoint(aws.client("dynamodb"), PROGRESS_TABLE) as server:
        yield server


def endpoint_settings(aws, server, password=None) -> EndpointSettings:
    return EndpointSettings(
        progress_url=server.progress_url,
        identity_url=server.identity_url,
        idm_user=server.username,
        idm_encrypted_pass=encrypted_password(aws.client("kms"), password or server.password),
    )


def test_http_writer_fails_stale_items_with_kms_login_and_bearer_token(aws, endpoint):
    ids = seed_mixed(aws.client("dynamodb"))
    endpoint.error_ids = {ids["stale"][0]}  # HTTP 200 with errorResponse: a failure, not a success
    log = ListLog()
    counts = run(aws, endpoint=endpoint_settings(aws, endpoint), log=log)
    assert (counts.reclaimed, counts.errors) == (len(ids["stale"]) - 1, 1)
    assert endpoint.requests.count(("POST", "/login")) == 1
    gets = [p for m, p in endpoint.requests if m == "GET"]
    puts = [p for m, p in endpoint.requests if m == "PUT"]
    assert len(gets) == len(ids["stale"])
    assert len(puts) == len(ids["stale"])
    assert all(h.startswith("Bearer ") for h in endpoint.seen_auth)
    items = items_by_id(aws.client("dynamodb"))
    assert items[ids["stale"][0]]["processingState"] == "EXECUTING"
    for item_id in ids["stale"][1:]:
        assert (items[item_id]["processingState"], items[item_id]["processingStateMessage"]) == ("COMPLETE", "failed")
        assert events(items[item_id]) == ["AgendaProgress timed out."]
    assert any("errorResponse on HTTP 200" in line for line in log.lines)
    secrets = [endpoint.password, *endpoint.tokens]
    assert not any(secret in line for line in log.lines for secret in secrets)


def test_http_writer_retry_and_race(aws, endpoint):
    now = int(time.time() * 1000)
    put(aws, agenda("h", "EXECUTING", DAY_MS, now=now), agenda("gone", "EXECUTING", DAY_MS, now=now))
    settings = endpoint_settings(aws, endpoint)

    class ExecutorBetweenScanAndGet:
        def __init__(self, inner):
            self.inner = inner

        def apply_many(self, pairs, *, now, cutoff):
            return apply_each(self, pairs, now=now, cutoff=cutoff)

        def apply(self, c, d, *, now, cutoff):
            if c.id == "gone":  # the executor came back after the scan read it
                aws.client("dynamodb").update_item(
                    TableName=PROGRESS_TABLE,
                    Key={"id": {"S": "gone"}},
                    UpdateExpression="SET updatedTime = :now",
                    ExpressionAttributeValues={":now": {"N": str(int(time.time() * 1000))}},
                )
            return self.inner.apply(c, d, now=now, cutoff=cutoff)

    ddb = aws.client("dynamodb")
    params = parse_params({**BASE, "reclaimAction": "retry"})
    settings = dataclasses.replace(settings, ready_table=aws.env["AGENDA_READY_TABLE"])
    writer = make_writer(params, dynamodb=ddb, kms=aws.client("kms"), agenda=settings)
    plan = SegmentPlan(params, 0, time.time() + PATIENCE, inspect_table(ddb, params))
    counts = reclaim_pass(ddb, plan, ExecutorBetweenScanAndGet(writer), log=ListLog())
    assert (counts.retried, counts.raced) == (1, 1)
    items = items_by_id(ddb)
    assert items["h"]["processingState"] == "WAITING"
    assert "retryAt" not in items["h"]
    assert items["gone"]["processingState"] == "EXECUTING"
    assert set(ready_items(aws)) == {"h"}


def test_http_retry_by_two_passes_at_once_queues_one_attempt_and_the_other_pass_races(aws, endpoint):
    """Pass A is held after its GET while pass B retries the agenda: A's ReadyAgenda put is refused, so A
    writes nothing and the endpoint keeps the attempt that ReadyAgenda queued."""
    ddb = aws.client("dynamodb")
    put(aws, agenda("h", "EXECUTING", DAY_MS, now=int(time.time() * 1000)))
    settings = dataclasses.replace(endpoint_settings(aws, endpoint), ready_table=aws.env["AGENDA_READY_TABLE"])
    params = parse_params({**BASE, "reclaimAction": "retry"})
    info = inspect_table(ddb, params)

    def writer():
        return make_writer(params, dynamodb=ddb, kms=aws.client("kms"), agenda=settings)

    def one_pass(w):
        return reclaim_pass(ddb, SegmentPlan(params, 0, time.time() + PATIENCE, info), w, log=ListLog())

    held = writer()
    got, release, waited = threading.Event(), threading.Event(), []
    real_get = held.endpoint.get

    def get_then_wait(item_id):
        current = real_get(item_id)
        got.set()
        waited.append(release.wait(PATIENCE))
        return current

    held.endpoint.get = get_then_wait
    counts = {}
    pass_a = threading.Thread(target=lambda: counts.update(a=one_pass(held)))
    pass_a.start()
    assert got.wait(PATIENCE), "pass A did not reach its GET"
    counts["b"] = one_pass(writer())  # runs to completion while A waits after its GET
    release.set()
    pass_a.join(PATIENCE)
    assert all(waited), "pass A went on before pass B had finished"
    assert "a" in counts, "pass A did not finish"
    assert counts["a"].retried + counts["b"].retried == 1
    assert counts["a"].raced + counts["b"].raced == 1
    item = items_by_id(ddb)["h"]
    assert item["attemptId"] == ready_items(aws)["h"]["attemptId"]
    assert events(item).count("retry attempt 1") == 1


def test_http_retry_after_a_pass_died_between_its_queue_write_and_its_put(aws, endpoint):
    """The next pass finds the attempt queued and the endpoint unchanged: it PUTs the queued attemptId."""
    ddb = aws.client("dynamodb")
    put(aws, agenda("h", "EXECUTING", DAY_MS, now=int(time.time() * 1000)))
    settings = dataclasses.replace(endpoint_settings(aws, endpoint), ready_table=aws.env["AGENDA_READY_TABLE"])
    params = parse_params({**BASE, "reclaimAction": "retry"})
    dying = make_writer(params, dynamodb=ddb, kms=aws.client("kms"), agenda=settings)

    def die(item_id, partial):
        raise ItemError(f"PUT {item_id}: the process died")

    dying.endpoint.put = die
    plan = SegmentPlan(params, 0, time.time() + PATIENCE, inspect_table(ddb, params))
    assert reclaim_pass(ddb, plan, dying, log=ListLog()).errors == 1
    assert run(aws, endpoint=settings, reclaimAction="retry").retried == 1
    item = items_by_id(ddb)["h"]
    assert item["attemptId"] == ready_items(aws)["h"]["attemptId"]
    assert json.loads(item["diagnosticEvents"])[-1]["payload"]["attemptId"] == item["attemptId"]


MALFORMED_ALL = {"as-object": {"id": "as-object", "processingState": "EXECUTING"}, "of-strings": ["x"]}


def test_a_get_answering_no_list_of_objects_is_an_error_of_that_item_and_the_pass_goes_on(aws, endpoint, monkeypatch):
    now = int(time.time() * 1000)
    put(aws, *(agenda(item_id, "EXECUTING", DAY_MS, now=now) for item_id in [*MALFORMED_ALL, "plain"]))
    real_request = reclaim_http._request

    def malformed_get(method, url, body=None, headers=None):
        item_id = url.rsplit("/", 1)[1]
        if method == "GET" and item_id in MALFORMED_ALL:
            return 200, {"all": MALFORMED_ALL[item_id], "count": 1, "errorResponse": None}
        return real_request(method, url, body, headers)

    monkeypatch.setattr(reclaim_http, "_request", malformed_get)
    log = ListLog()
    counts = run(aws, endpoint=endpoint_settings(aws, endpoint), log=log)
    assert (counts.reclaimed, counts.errors) == (1, len(MALFORMED_ALL))
    assert [p for m, p in endpoint.requests if m == "PUT"] == ["/progress/plain"]
    refused = [line for line in log.lines if "not a list of AgendaProgress objects" in line]
    assert len(refused) == len(MALFORMED_ALL)


@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_an_item_call_that_gets_no_answer_is_an_error_of_that_item_and_the_pass_goes_on(
    aws, endpoint, monkeypatch, method
):
    from pipelines.common import http as common_http

    ids = seed_mixed(aws.client("dynamodb"))
    real_open, calls = common_http.NO_REDIRECTS.open, []

    def one_times_out(req, *args, **kwargs):
        if req.get_method() == method:
            calls.append(req.full_url)
            if len(calls) == 2:
                raise TimeoutError("timed out")  # a socket timeout, as urllib raises it
        return real_open(req, *args, **kwargs)

    monkeypatch.setattr(common_http.NO_REDIRECTS, "open", one_times_out)
    log = ListLog()
    counts = run(aws, endpoint=endpoint_settings(aws, endpoint), log=log)
    assert (counts.reclaimed, counts.errors) == (len(ids["stale"]) - 1, 1)
    (line,) = [line for line in log.lines if "timed out" in line]
    assert line.startswith(f"could not fail {calls[1].rsplit('/', 1)[1]}: cannot reach {method} ")


@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_an_endpoint_that_stops_answering_ends_the_pass_after_three_calls(aws, endpoint, monkeypatch, method):
    from pipelines.common import http as common_http
    from pipelines.reclaim.http import UNANSWERED_IN_A_ROW

    seed_mixed(aws.client("dynamodb"))
    real_open, calls = common_http.NO_REDIRECTS.open, []

    def down_after_login(req, *args, **kwargs):  # the other method answers
        if req.get_method() == method:
            calls.append(req.full_url)
            raise TimeoutError("timed out")
        return real_open(req, *args, **kwargs)

    monkeypatch.setattr(common_http.NO_REDIRECTS, "open", down_after_login)
    with pytest.raises(EndpointError, match=f"3 {method} calls in a row got no answer"):
        run(aws, endpoint=endpoint_settings(aws, endpoint), log=ListLog())
    assert len(calls) == UNANSWERED_IN_A_ROW


def test_http_login_errors_are_one_line_and_never_show_secrets(aws, endpoint):
    seed_mixed(aws.client("dynamodb"))
    with pytest.raises(EndpointError) as wrong:
        run(aws, endpoint=endpoint_settings(aws, endpoint, password="not-the-password"))
    assert "login" in str(wrong.value)
    assert "HTTP 401" in str(wrong.value)
    assert "not-the-password" not in str(wrong.value)
    with pytest.raises(EndpointError, match="IDM_ENCRYPTED_PASS is not valid base64"):
        run(aws, endpoint=dataclasses.replace(endpoint_settings(aws, endpoint), idm_encrypted_pass="%%%"))
    with pytest.raises(EndpointError, match="needs IDENTITY_URL, IDM_USER"):
        run(aws, endpoint=EndpointSettings(progress_url=endpoint.progress_url))
    assert "s3cret" not in repr(Secret("s3cret"))
    assert "s3cret" not in str(Secret("s3cret"))


def _login_answering(body: bytes) -> tuple[EndpointError, str]:
    """A login against an identity endpoint that answers ``body`` (HTTP 200): its error, and the endpoint's base."""
    from infra.local_server import LocalServer
    from pipelines.reclaim.http import login

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    identity = LocalServer()
    identity._serve(Handler, 0)
    with identity, pytest.raises(EndpointError) as info:
        login(f"{identity.base}/login", "reclaimer", Secret("pw"))
    return info.value, identity.base


@pytest.mark.parametrize("token", ["eyJhbGciOi.SECRET-BEARER.sig\r\n", "SECRET BEARER", "SECRET\u00e9"])
def test_a_login_answering_a_token_no_header_can_carry_fails_in_one_line_without_it(token):
    error, _ = _login_answering(json.dumps({"token": token}).encode())
    message = str(error)
    assert message.splitlines() == [message]
    assert "SECRET" not in message
    assert "not a bearer token" in message


def test_a_login_answering_json_nested_deeper_than_the_parser_goes_fails_in_one_line():
    error, base = _login_answering(b"[" * 50000 + b"]" * 50000)
    assert str(error) == f"identity login at {base}/login as 'reclaimer' failed (HTTP 200)"


def test_a_retry_policy_naming_an_unregistered_function_fails_the_run_with_one_line(aws_shared):
    from pipelines.definitions import build_definitions

    policy = {"kind": "function", "path": "os:_exit", "maxAttempts": 3}
    with pytest.raises(ParamsError, match=r"retryPolicy: path 'os:_exit' is not in a registered module"):
        parse_params({**BASE, "reclaimAction": "retry", "retryPolicy": policy})
    job = build_definitions("local").resolve_job_def("reclaim_agendas")
    config = {**BASE, "tableName": "NoSuchTable-unregistered", "reclaimAction": "retry",
              "retryPolicy": {**policy, "path": "math:sqrt"}}  # fmt: skip
    result = job.execute_in_process(run_config=config, raise_on_error=False)
    assert not result.success
    description = result.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    assert description.splitlines() == [description]
    assert "GROUNDSKEEPER_RETRY_FUNCTIONS" in description
    assert "math:sqrt" in description


# ------------------------------------------------------------------ the bearer token stays home


def test_an_endpoint_url_must_be_under_a_named_prefix():
    from pipelines.reclaim.http import url_allowed

    prefixes = ["https://agenda.example.com/api/", "http://127.0.0.1:8080"]
    assert url_allowed("https://agenda.example.com/api", prefixes)
    assert url_allowed("https://agenda.example.com/api/progress", prefixes)
    assert url_allowed("https://AGENDA.example.com/api/progress", prefixes)
    assert url_allowed("http://127.0.0.1:8080/progress", prefixes)
    for url in (
        "https://agenda.example.com.evil.net/api/progress",
        "https://agenda.example.com/apix",
        "http://agenda.example.com/api/progress",  # not the same scheme
        "https://user@agenda.example.com/api/progress",
        "http://127.0.0.1:8081/progress",
        "https://evil.net/?https://agenda.example.com/api/",
    ):
        assert not url_allowed(url, prefixes), url
    assert not url_allowed("https://agenda.example.com/api", [])


def test_a_segment_is_a_dot_segment_before_a_semicolon_a_question_mark_or_a_hash():
    from pipelines.common.http import leaves_its_path

    for segment in ("..;x", "..%3F", "..%23", "%2e%2e%3fx"):
        assert leaves_its_path(segment), segment


def test_a_run_config_url_below_agenda_progress_url_is_refused_without_an_allow_list(aws, endpoint):
    from pipelines.reclaim.http import endpoint_url

    settings = endpoint_settings(aws, endpoint)
    assert endpoint_url(parse_params({**BASE, "agendaProgressEndpointURL": endpoint.progress_url}), settings)
    with pytest.raises(ParamsError, match="AGENDA_PROGRESS_ALLOWED_URLS"):
        endpoint_url(parse_params({**BASE, "agendaProgressEndpointURL": endpoint.progress_url + "/admin"}), settings)


def _endpoint_env(aws, server, monkeypatch, **extra) -> None:
    """The deployment's endpoint settings in the environment (read when the definitions are built)."""
    settings = endpoint_settings(aws, server)
    env = {"IDENTITY_URL": settings.identity_url, "IDM_USER": settings.idm_user,
           "IDM_ENCRYPTED_PASS": settings.idm_encrypted_pass, **extra}  # fmt: skip
    for name in ("AGENDA_PROGRESS_URL", "AGENDA_PROGRESS_ALLOWED_URLS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def _reclaim_job():
    from pipelines.definitions import build_definitions

    return build_definitions("local").resolve_job_def("reclaim_agendas")


def test_a_run_config_naming_another_endpoint_makes_no_request_and_fails_with_one_line(aws, endpoint, monkeypatch):
    seed_mixed(aws.client("dynamodb"))
    _endpoint_env(aws, endpoint, monkeypatch, AGENDA_PROGRESS_URL=endpoint.progress_url)
    with LocalAgendaEndpoint(aws.client("dynamodb"), PROGRESS_TABLE) as elsewhere:
        result = _reclaim_job().execute_in_process(
            run_config={**BASE, "agendaProgressEndpointURL": elsewhere.progress_url}, raise_on_error=False
        )
        assert not result.success
        description = result.get_step_failure_events()[0].step_failure_data.user_failure_data.description
        assert description.splitlines() == [description]
        assert "AGENDA_PROGRESS_ALLOWED_URLS" in description
        assert elsewhere.progress_url in description
        assert elsewhere.requests == []
        assert elsewhere.seen_auth == []
    assert endpoint.requests == []  # not even a login
    assert items_by_id(aws.client("dynamodb"))["stale-0"]["processingState"] == "EXECUTING"


@pytest.mark.slow
def test_an_endpoint_echoing_the_token_never_puts_it_in_the_run_output(aws, endpoint, monkeypatch, capfd):
    import dagster as dg

    ids = seed_mixed(aws.client("dynamodb"))
    endpoint.error_ids, endpoint.echo_auth = set(ids["stale"]), True
    _endpoint_env(aws, endpoint, monkeypatch, AGENDA_PROGRESS_ALLOWED_URLS=f"{endpoint.base}/")
    with dg.instance_for_test() as instance:
        result = _reclaim_job().execute_in_process(
            run_config={**BASE, "agendaProgressEndpointURL": endpoint.progress_url}, instance=instance
        )
        log = "\n".join(dg.serialize_value(entry) for entry in instance.all_logs(result.run_id))
    output = capfd.readouterr()
    assert result.output_for_node("report_reclaim")["errors"] == len(ids["stale"])
    assert endpoint.tokens
    for secret in [*endpoint.tokens, endpoint.password]:
        for where, text in (("event log", log), ("stdout", output.out), ("stderr", output.err)):
            assert secret not in text, f"a secret reached the {where}"
    assert "request had Authorization: Bearer ***" in log  # the echo arrived, redacted


# ------------------------------------------------------------------ no credential follows a redirect


@pytest.mark.parametrize("status", [302, 307])
@pytest.mark.parametrize("method", ["GET", "PUT"])
@pytest.mark.parametrize("named_by", ["agendaProgressEndpointURL", "AGENDA_PROGRESS_URL"])
def test_a_redirect_from_the_endpoint_is_an_item_error_and_the_token_never_follows_it(
    aws, endpoint, named_by, method, status
):
    ids = seed_mixed(aws.client("dynamodb"))
    settings, overrides = endpoint_settings(aws, endpoint), {}
    if named_by == "agendaProgressEndpointURL":  # the run config names it, under an allowed prefix
        settings = dataclasses.replace(settings, progress_url=None, progress_allowed_urls=endpoint.progress_url)
        overrides = {"agendaProgressEndpointURL": endpoint.progress_url}
    log = ListLog()
    with LocalAgendaEndpoint(aws.client("dynamodb"), PROGRESS_TABLE) as elsewhere:  # another server
        elsewhere.tokens = endpoint.tokens  # it takes the token: a followed redirect would look like success
        endpoint.redirects = {method: (status, elsewhere.base)}
        counts = run(aws, endpoint=settings, log=log, **overrides)
        assert elsewhere.requests == []
        assert elsewhere.seen_auth == []  # not one request, never the token
    assert (counts.reclaimed, counts.errors) == (0, len(ids["stale"]))
    assert (method, f"/progress/{ids['stale'][0]}") in endpoint.requests  # the redirect was answered
    redirects = [line for line in log.lines if "redirect" in line]
    assert len(redirects) == len(ids["stale"])
    for line in redirects:
        assert line.splitlines() == [line]
        assert f"{method} " in line
        assert f"HTTP {status}" in line
        assert elsewhere.base in line
        assert "not followed" in line
    items = items_by_id(aws.client("dynamodb"))
    assert {items[i]["processingState"] for i in ids["stale"]} == {"EXECUTING"}


@pytest.mark.parametrize("status", [302, 303, 307])
def test_a_redirect_from_the_identity_login_fails_the_run_and_the_password_never_follows_it(aws, endpoint, status):
    seed_mixed(aws.client("dynamodb"))
    with LocalAgendaEndpoint(aws.client("dynamodb"), PROGRESS_TABLE) as elsewhere:
        endpoint.redirects = {"POST": (status, elsewhere.base)}
        with pytest.raises(EndpointError) as info:
            run(aws, endpoint=endpoint_settings(aws, endpoint))
        assert elsewhere.requests == []
        assert elsewhere.seen_auth == []
    message = str(info.value)
    assert message.splitlines() == [message]
    assert f"HTTP {status}, a redirect to {elsewhere.base}/login: not followed" in message
    assert endpoint.password not in message
    assert endpoint.requests == [("POST", "/login")]  # no item call without a token


# ------------------------------------------------------------------ dot segments


DOT_PATHS = [
    "/../../evil",
    "/%2e%2e/%2E%2E/evil",
    "/.%2e/evil",
    "/..;/evil",
    "/./x",
    "/..%2fevil",
    "/..%5cevil",
    "/%252e%252e/%252e%252e/evil",
    "/..%252f..%252fevil",
    "/%2e%2e%3fx",
    "/..%23x",
]  # decoded twice: by a proxy, then the server


def test_an_endpoint_url_with_dot_segments_is_under_no_prefix():
    from pipelines.reclaim.http import url_allowed

    prefix = "https://agenda.example.com/pop/progress"
    assert url_allowed(f"{prefix}/x", [prefix])
    for tail in DOT_PATHS:
        assert not url_allowed(prefix + tail, [prefix]), tail


@pytest.mark.parametrize("tail", DOT_PATHS)
def test_every_url_a_credential_goes_to_is_refused_with_dot_segments(aws, endpoint, tail):
    from pipelines.reclaim.http import endpoint_url

    settings = dataclasses.replace(endpoint_settings(aws, endpoint), progress_allowed_urls=endpoint.progress_url)
    for name, settings_, overrides in (
        ("agendaProgressEndpointURL", settings, {"agendaProgressEndpointURL": endpoint.progress_url + tail}),
        ("AGENDA_PROGRESS_URL", dataclasses.replace(settings, progress_url=endpoint.progress_url + tail), {}),
        ("IDENTITY_URL", dataclasses.replace(settings, identity_url=endpoint.identity_url + tail), {}),
    ):
        with pytest.raises(ParamsError) as info:
            params = parse_params({**BASE, **overrides})
            endpoint_url(params, settings_)
            make_writer(params, dynamodb=None, kms=None, agenda=settings_)
        message = str(info.value)
        assert message.splitlines() == [message]
        assert message.startswith(f"{name} ")
        assert "dot segment" in message
    assert endpoint.requests == []


@pytest.mark.parametrize("tail", ["/../../evil", "/%2e%2e/%2e%2e/evil"])
def test_a_run_config_endpoint_with_dot_segments_makes_no_request_and_fails_with_one_line(
    aws, endpoint, monkeypatch, tail
):
    seed_mixed(aws.client("dynamodb"))
    _endpoint_env(aws, endpoint, monkeypatch, AGENDA_PROGRESS_ALLOWED_URLS=endpoint.progress_url)
    url = endpoint.progress_url + tail
    result = _reclaim_job().execute_in_process(
        run_config={**BASE, "agendaProgressEndpointURL": url}, raise_on_error=False
    )
    assert not result.success
    description = result.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    assert description.splitlines() == [description]
    assert "dot segment" in description
    assert tail not in description  # the value is not shown
    assert endpoint.requests == []
    assert endpoint.seen_auth == []  # not even a login
    assert items_by_id(aws.client("dynamodb"))["stale-0"]["processingState"] == "EXECUTING"


# ------------------------------------------------------------------ what a credential's URL may hold

SECRET = "s3cr3t-Pa55"


def _refusal(params_overrides: dict, settings) -> str:
    """The one line refusing a URL: at parse time (the run config) or when the writer is built."""
    from pipelines.reclaim.http import endpoint_url

    with pytest.raises(ParamsError) as info:
        params = parse_params({**BASE, **params_overrides})
        endpoint_url(params, settings)
        make_writer(params, dynamodb=None, kms=None, agenda=settings)
    return str(info.value)


def _named(name: str, url: str, settings, prefix: str):
    """(run config overrides, settings) that put ``url`` under the setting ``name``."""
    if name == "agendaProgressEndpointURL":
        return {name: url}, dataclasses.replace(settings, progress_allowed_urls=prefix)
    if name == "AGENDA_PROGRESS_ALLOWED_URLS":
        return {"agendaProgressEndpointURL": prefix}, dataclasses.replace(
            settings, progress_allowed_urls=url, progress_url=None
        )
    field = {"AGENDA_PROGRESS_URL": "progress_url", "IDENTITY_URL": "identity_url"}[name]
    return {}, dataclasses.replace(settings, **{field: url})


URL_SETTINGS = ["agendaProgressEndpointURL", "AGENDA_PROGRESS_URL", "AGENDA_PROGRESS_ALLOWED_URLS", "IDENTITY_URL"]


@pytest.mark.parametrize("name", URL_SETTINGS)
def test_user_info_in_a_url_a_credential_goes_to_is_refused_and_never_shown(aws, endpoint, name):
    settings = endpoint_settings(aws, endpoint)
    url = {"IDENTITY_URL": endpoint.identity_url}.get(name, endpoint.progress_url)
    with_user = url.replace("http://", f"http://svc:{SECRET}@")
    message = _refusal(*_named(name, with_user, settings, endpoint.progress_url))
    assert message.splitlines() == [message]
    assert message.startswith(f"{name} ")
    assert "user info" in message
    assert SECRET not in message
    assert endpoint.requests == []


@pytest.mark.parametrize("name", ["agendaProgressEndpointURL", "AGENDA_PROGRESS_URL", "AGENDA_PROGRESS_ALLOWED_URLS"])
def test_a_query_on_an_endpoint_url_is_refused_and_never_shown(aws, endpoint, name):
    settings = endpoint_settings(aws, endpoint)
    message = _refusal(*_named(name, f"{endpoint.progress_url}?token={SECRET}", settings, endpoint.progress_url))
    assert message.splitlines() == [message]
    assert message.startswith(f"{name} ")
    assert SECRET not in message
    assert endpoint.requests == []


def test_a_query_on_the_identity_url_is_never_shown(aws, endpoint):
    # IDENTITY_URL may carry a query (nothing is appended to it), but no line shows it.
    seed_mixed(aws.client("dynamodb"))
    settings = dataclasses.replace(
        endpoint_settings(aws, endpoint), identity_url=f"http://127.0.0.1:9/login?key={SECRET}"
    )
    with pytest.raises(EndpointError) as info:
        run(aws, endpoint=settings)
    message = str(info.value)
    assert message.startswith("cannot reach POST http://127.0.0.1:9/login: ")
    assert SECRET not in message


UNSAFE_TAILS = {
    "fragment": "#x",
    "NUL after dots": "/..%00",
    "encoded dots and NUL": "/%2e%2e%00",
    "fullwidth dots": "/\uff0e\uff0e/evil",
    "encoded fullwidth dots": "/%ef%bc%8e%ef%bc%8e/evil",
    "overlong UTF-8 dots": "/%c0%ae%c0%ae/evil",
    "invalid percent-encoding": "/%zz",
    "a raw NUL": "/\x00",
    "a blank": "/a b",
}


@pytest.mark.parametrize("tail", list(UNSAFE_TAILS.values()), ids=list(UNSAFE_TAILS))
@pytest.mark.parametrize("name", URL_SETTINGS)
def test_a_fragment_nul_or_non_ascii_in_a_url_a_credential_goes_to_is_refused(aws, endpoint, name, tail):
    settings = endpoint_settings(aws, endpoint)
    url = {"IDENTITY_URL": endpoint.identity_url}.get(name, endpoint.progress_url) + tail
    message = _refusal(*_named(name, url, settings, endpoint.progress_url))
    assert message.splitlines() == [message]
    assert message.startswith(f"{name} ")
    assert tail not in message
    assert endpoint.requests == []


def test_a_fragment_in_the_run_configs_endpoint_makes_no_request_and_fails_with_one_line(aws, endpoint, monkeypatch):
    # Before, '#x' swallowed the item id: every GET and PUT went to the collection URL.
    seed_mixed(aws.client("dynamodb"))
    _endpoint_env(aws, endpoint, monkeypatch, AGENDA_PROGRESS_ALLOWED_URLS=endpoint.progress_url)
    result = _reclaim_job().execute_in_process(
        run_config={**BASE, "agendaProgressEndpointURL": endpoint.progress_url + "#x"}, raise_on_error=False
    )
    assert not result.success
    description = result.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    assert description.splitlines() == [description]
    assert "agendaProgressEndpointURL" in description
    assert "fragment" in description
    assert endpoint.requests == []
    assert endpoint.seen_auth == []
    assert items_by_id(aws.client("dynamodb"))["stale-0"]["processingState"] == "EXECUTING"


def test_user_info_in_agenda_progress_url_fails_the_run_with_one_line_without_it(aws, endpoint, monkeypatch):
    seed_mixed(aws.client("dynamodb"))
    with_user = endpoint.progress_url.replace("http://", f"http://svc:{SECRET}@")
    _endpoint_env(aws, endpoint, monkeypatch, AGENDA_PROGRESS_URL=with_user)
    result = _reclaim_job().execute_in_process(run_config=BASE, raise_on_error=False)
    assert not result.success
    description = result.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    assert description.splitlines() == [description]
    assert description.startswith("AGENDA_PROGRESS_URL ")
    assert SECRET not in description
    assert [p for _, p in endpoint.requests if p != "/login"] == []


# A dot segment, also once the quoted id is decoded twice (a proxy and a server), a '\', an encoded '/',
# fullwidth dots a server may normalise to '..'.
LEAVING_IDS = ["..", ".", "..\\admin", "%2e%2e%2fadmin", "a/../../admin", "\uff0e\uff0e", "..?", "..#x"]


def test_an_item_id_that_leaves_the_endpoint_path_is_an_item_error_and_never_sent(aws, endpoint):
    now = int(time.time() * 1000)
    put(aws, *(agenda(item_id, "EXECUTING", DAY_MS, now=now) for item_id in [*LEAVING_IDS, "plain"]))
    log = ListLog()
    counts = run(aws, endpoint=endpoint_settings(aws, endpoint), log=log)
    assert (counts.reclaimed, counts.errors) == (1, len(LEAVING_IDS))
    assert [p for _, p in endpoint.requests if p != "/login"] == ["/progress/plain", "/progress/plain"]
    refused = [line for line in log.lines if "not sent" in line]
    assert len(refused) == len(LEAVING_IDS)
    assert all(line.splitlines() == [line] for line in refused)
    assert all(f"not sent, this id would name a path outside {endpoint.progress_url}" in line for line in refused)
