"""The attempt model (seed 001): ids, retry rules, canonical status, duplicates and fencing.
Unit tests first, then hypothesis properties over random attempt histories and event orders."""

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipelines.retry import (
    JOB_STATUSES,
    Attempt,
    AttemptStatus,
    Engine,
    EventKind,
    HistoryEvent,
    Job,
    SupersededError,
    accepts,
    canonical_status,
    dynamodb_fence,
    new_attempt_id,
    new_processing_id,
    new_schedule_id,
)


def ev(kind, attempt_id, processing_id="p1"):
    return HistoryEvent(EventKind(kind), attempt_id, processing_id)


def failed_job() -> tuple[Job, str]:
    job = Job.scheduled("s1")
    first = job.attempts[0].attempt_id
    job.record(ev("started", first))
    job.record(ev("failed", first))
    return job, first


def test_ids_are_unique_and_prefixed():
    ids = {new_schedule_id() for _ in range(100)} | {new_attempt_id() for _ in range(100)}
    assert len(ids) == 200
    assert new_processing_id().startswith("prc-")


def test_a_job_goes_scheduled_queued_processing_completed():
    job = Job.scheduled("s1", at=60, now=0)
    a1 = job.attempts[0].attempt_id
    assert job.status == "scheduled"
    assert job.dispatch(now=30) == []
    assert job.dispatch(now=60) == [a1]
    assert job.status == "queued"
    job.record(ev("started", a1))
    assert job.status == "processing" and not job.processing_timeout
    job.record(ev("timedout", a1))
    assert job.status == "processing" and job.processing_timeout and job.attempts[0].processing_timeout
    job.record(ev("completed", a1))
    assert job.status == "completed" and not job.processing_timeout


def test_duplicate_schedule_command_changes_nothing():
    engine = Engine()
    first = engine.schedule("s1")
    again = engine.schedule("s1", at=500)
    assert first.changed and not again.changed
    assert again.attempt_id == first.attempt_id
    assert len(engine.jobs["s1"].attempts) == 1


def test_duplicate_history_event_changes_nothing_but_is_stored():
    job = Job.scheduled("s1")
    a1 = job.attempts[0].attempt_id
    job.record(ev("started", a1))
    before = job.snapshot()
    outcome = job.record(ev("started", a1))
    assert not outcome.changed and job.snapshot() == before
    assert len(job.history) == 2  # stored as is before handling


def test_late_started_after_failed_does_not_revive_the_processing():
    job, a1 = failed_job()
    job.record(ev("started", a1))
    assert job.status == "failed"


def test_an_attempt_processed_twice():
    job = Job.scheduled("s1")
    a1 = job.attempts[0].attempt_id
    job.record(ev("started", a1, "p1"))
    job.record(ev("started", a1, "p2"))
    job.record(ev("failed", a1, "p1"))
    assert job.attempts[0].status is AttemptStatus.PROCESSING  # failed only with no other processing
    job.record(ev("timedout", a1, "p2"))
    assert job.processing_timeout
    job.record(ev("completed", a1, "p2"))
    assert job.status == "completed"


def test_manual_retry_is_refused_while_queued_processing_or_completed():
    job = Job.scheduled("s1")
    a1 = job.attempts[0].attempt_id
    assert not job.retry_manual("m1").accepted  # queued
    job.record(ev("started", a1))
    assert not job.retry_manual("m2").accepted  # processing
    job.record(ev("completed", a1))
    refused = job.retry_manual("m3")
    assert not refused.accepted and "completed" in refused.reason


def test_manual_retry_queues_at_once_and_cancels_scheduled_attempts():
    job, a1 = failed_job()
    auto = job.retry_automatic("auto-1", at=3600)
    assert auto.accepted and job.status == "scheduled"
    manual = job.retry_manual("m1", now=10)
    assert manual.accepted
    assert job.attempt(auto.attempt_id).status is AttemptStatus.CANCELLED
    assert job.attempt(manual.attempt_id).status is AttemptStatus.QUEUED
    assert job.status == "queued"
    # the same command again changes nothing
    before = job.snapshot()
    assert not job.retry_manual("m1", now=11).changed and job.snapshot() == before


def test_automatic_retry_is_cancelled_by_a_sooner_queued_processing_or_completed_attempt():
    job, a1 = failed_job()
    assert job.status == "failed"
    first = job.retry_automatic("r1", at=100)
    assert first.accepted
    later = job.retry_automatic("r2", at=200)
    assert not later.accepted and "sooner" in later.reason
    job.dispatch(now=100)
    assert not job.retry_automatic("r3", at=300).accepted  # one is queued
    job.record(ev("started", first.attempt_id, "p9"))
    assert not job.retry_automatic("r4", at=300).accepted  # processing
    job.record(ev("completed", first.attempt_id, "p9"))
    assert not job.retry_automatic("r5", at=300).accepted  # completed


def test_an_earlier_automatic_retry_is_still_scheduled_beside_a_later_one():
    job, _ = failed_job()
    late = job.retry_automatic("r1", at=500)
    early = job.retry_automatic("r2", at=100)
    assert late.accepted and early.accepted
    assert job.dispatch(now=100) == [early.attempt_id]


def test_completion_cancels_everything_scheduled():
    job = Job.scheduled("s1")
    a1 = job.attempts[0].attempt_id
    job.record(ev("started", a1))
    job.record(ev("failed", a1))
    r = job.retry_automatic("r1", at=100)
    job.record(ev("completed", a1, "p-late"))  # a duplicate processing of attempt 1 succeeded
    assert job.attempt(r.attempt_id).status is AttemptStatus.CANCELLED
    assert job.status == "completed"
    assert job.dispatch(now=1000) == []


def test_the_job_is_failed_only_when_nothing_is_scheduled_queued_or_processing():
    job, _ = failed_job()
    assert job.status == "failed"
    job.retry_automatic("r1", at=100)
    assert job.status == "scheduled"


def test_an_event_for_an_unknown_attempt_is_kept_and_refused():
    job = Job.scheduled("s1")
    outcome = job.record(ev("completed", "att-nope"))
    assert not outcome.accepted and job.status == "queued" and len(job.history) == 1


def test_fencing_refuses_an_old_attempt_and_tells_it_who_won():
    job, a1 = failed_job()
    assert job.fence(a1) == 1
    r = job.retry_automatic("r1", at=100)
    assert job.fence(a1) == 1  # the retry is only scheduled: attempt 1 is still the latest to run
    job.dispatch(now=100)
    with pytest.raises(SupersededError) as info:
        job.fence(a1)
    assert info.value.current_id == r.attempt_id and info.value.current_number == 2
    assert job.fence(r.attempt_id) == 2
    with pytest.raises(SupersededError):
        job.fence("att-unknown")


def test_fenced_store_rule_and_dynamodb_condition():
    assert accepts(None, 1) and accepts(2, 2) and accepts(2, 3) and not accepts(3, 2)
    fence = dynamodb_fence(4, "attempt")
    assert fence["names"] == {"#fence": "attempt"} and fence["values"] == {":fence": {"N": "4"}}
    assert "#fence <= :fence" in fence["condition"]


def test_canonical_status_needs_a_live_attempt():
    with pytest.raises(ValueError):
        canonical_status([Attempt("a", 1, 0, cancelled=True)])


# -- properties ------------------------------------------------------------------------------

attempts_st = st.builds(
    Attempt,
    attempt_id=st.uuids().map(str),
    number=st.integers(1, 9),
    due=st.floats(0, 100),
    manual=st.booleans(),
    queued=st.booleans(),
    cancelled=st.booleans(),
    processings=st.dictionaries(st.sampled_from(["p1", "p2", "p3"]), st.sampled_from(list(EventKind)), max_size=3),
)


@given(st.lists(attempts_st, min_size=1, max_size=6))
def test_status_of_any_attempt_history_is_a_seed_status_and_follows_the_rules(attempts):
    assume(any(a.status is not AttemptStatus.CANCELLED for a in attempts))
    status = canonical_status(attempts)
    statuses = {a.status for a in attempts}
    assert status in JOB_STATUSES
    assert (status == "completed") == (AttemptStatus.COMPLETED in statuses)
    if status == "failed":
        assert not statuses & {AttemptStatus.SCHEDULED, AttemptStatus.QUEUED, AttemptStatus.PROCESSING}
    if status == "processing":
        assert AttemptStatus.PROCESSING in statuses
    if status == "queued":
        assert not statuses & {AttemptStatus.PROCESSING, AttemptStatus.COMPLETED}
    if status == "scheduled":  # a failed attempt may wait for its automatic retry
        assert AttemptStatus.SCHEDULED in statuses
        assert not statuses & {AttemptStatus.QUEUED, AttemptStatus.PROCESSING, AttemptStatus.COMPLETED}


# A random "life" of one job: commands and history events in any order, with duplicates.
op_st = st.one_of(
    st.tuples(
        st.just("event"), st.sampled_from(list(EventKind)), st.integers(0, 5), st.sampled_from(["p1", "p2", "p3"])
    ),
    st.tuples(st.just("manual"), st.sampled_from(["m1", "m2", "m3"]), st.floats(0, 100)),
    st.tuples(st.just("auto"), st.sampled_from(["r1", "r2", "r3", "r4"]), st.floats(0, 100)),
    st.tuples(st.just("dispatch"), st.floats(0, 100)),
)


def apply(job: Job, op) -> None:
    kind = op[0]
    if kind == "event":
        _, event_kind, index, processing_id = op
        attempt_id = job.attempts[index % len(job.attempts)].attempt_id
        job.record(HistoryEvent(event_kind, attempt_id, f"{attempt_id}/{processing_id}"))
    elif kind == "manual":
        job.retry_manual(op[1], now=op[2], attempt_id=f"att-{op[1]}")
    elif kind == "auto":
        job.retry_automatic(op[1], at=op[2], attempt_id=f"att-{op[1]}")
    else:
        job.dispatch(now=op[1])


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op_st, max_size=25), st.booleans())
def test_random_histories_keep_a_seed_status_and_duplicates_never_change_it(ops, start_scheduled):
    job = Job.scheduled("s1", at=50 if start_scheduled else 0, now=0, attempt_id="att-first")
    was_completed = False
    for op in ops:
        apply(job, op)
        status = job.status
        assert status in JOB_STATUSES
        completed = any(a.status is AttemptStatus.COMPLETED for a in job.attempts)
        assert (status == "completed") == completed
        assert not (was_completed and status != "completed")  # completed only once, for good
        was_completed = completed
        if op[0] in ("event", "manual", "auto"):  # the same command or event again: no change
            before = job.snapshot()
            apply(job, op)
            assert job.snapshot() == before
        if status == "completed":
            assert not any(a.status is AttemptStatus.SCHEDULED for a in job.attempts)


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(st.sampled_from(list(EventKind)), st.integers(0, 2), st.sampled_from(["p1", "p2"])),
        min_size=1,
        max_size=12,
    ),
    st.randoms(use_true_random=False),
)
def test_history_events_give_the_same_status_in_any_order_and_with_duplicates(events, rnd):
    def run(sequence):
        job, _ = failed_job()
        job.retry_automatic("r1", at=10, attempt_id="att-2")
        job.dispatch(now=10)
        job.record(ev("failed", "att-2", "x"))
        job.retry_automatic("r2", at=20, attempt_id="att-3")
        ids = [a.attempt_id for a in job.attempts]
        for kind, index, pid in sequence:
            job.record(HistoryEvent(kind, ids[index], f"{ids[index]}/{pid}"))
        return job.status, job.processing_timeout, [a.status for a in job.attempts if a.status != "cancelled"]

    shuffled = list(events)
    rnd.shuffle(shuffled)
    doubled = shuffled + [events[rnd.randrange(len(events))]]
    rnd.shuffle(doubled)
    assert run(events) == run(shuffled) == run(doubled)
