"""Every numeric parameter of the fleet processors and the pool audit has a range; a value outside
it is refused with one line that names the key and the value."""

import time

import pytest

from pipelines.common.params import ParamsError, parse_params, specs
from pipelines.fleet.dead_letter_redrive import RedriveSettings, redrive_dead_letters
from pipelines.fleet.drain import DrainLimits, TerminationLimits, receive_budget
from pipelines.fleet.pool_audit.audit import TASK as pool_audit_task
from pipelines.fleet.pool_audit.audit import PoolAuditParams, PoolCostReportParams
from tests import fleet_support as fs


@pytest.mark.parametrize("cls", [TerminationLimits, RedriveSettings, PoolAuditParams, PoolCostReportParams])
def test_every_numeric_parameter_has_a_range(cls):
    for spec in specs(cls):
        if spec.kind in (int, float):
            assert spec.minimum is not None, f"{cls.__name__}.{spec.name} has no range"
            assert spec.maximum is not None, f"{cls.__name__}.{spec.name} has no range"


@pytest.mark.parametrize(
    "cls, raw, message",
    [
        (RedriveSettings, {"rate_per_second": 0.01}, "rate_per_second must be at least 0.1, got 0.01"),
        (RedriveSettings, {"ratePerSecond": 0.01}, "ratePerSecond must be at least 0.1, got 0.01"),
        (RedriveSettings, {"max_seconds": 86400}, "max_seconds must be at most 3600"),
        (RedriveSettings, {"max_redrives": 10**9}, "max_redrives must be at most 100"),
        (DrainLimits, {"max_seconds": 10**9}, "max_seconds must be at most 3600"),
        (DrainLimits, {"stop_timeout_seconds": 10**6}, "stop_timeout_seconds must be at most 900"),
        (PoolAuditParams, {"idle_cost_threshold_usd_per_hour": -1}, "must be at least 0, got -1"),
        (PoolAuditParams, {"idle_cost_threshold_usd_per_hour": 1e12}, "must be at most 100000"),
    ],
)
def test_out_of_range_values_are_refused_with_one_line(cls, raw, message):
    with pytest.raises(ParamsError, match=message) as caught:
        parse_params(cls, raw)
    assert "\n" not in str(caught.value)


def test_the_pool_audit_message_threshold_is_refused_out_of_range():
    with pytest.raises(ParamsError, match="at most 100000"):
        pool_audit_task.parse({"idle_cost_threshold_usd_per_hour": 1e9})


@pytest.mark.slow
def test_a_slow_redrive_stops_at_max_seconds_instead_of_sleeping_on(aws_shared):
    aws = aws_shared
    sqs = aws.client("sqs")
    dlq = sqs.create_queue(QueueName="redrive-slow-dlq")["QueueUrl"]
    source = sqs.create_queue(QueueName="redrive-slow")["QueueUrl"]
    try:
        sqs.send_message_batch(QueueUrl=dlq, Entries=[{"Id": str(n), "MessageBody": f"m{n}"} for n in range(10)])
        sqs.send_message_batch(QueueUrl=dlq, Entries=[{"Id": str(n), "MessageBody": f"n{n}"} for n in range(10)])
        settings, _ = parse_params(RedriveSettings, {"rate_per_second": 0.1, "max_seconds": 1})
        out = redrive_dead_letters(fs.redrive_run(aws, dlq_url=dlq, source_url=source), None, settings)
        assert out["stopped_by"] == "max_seconds"
        assert 1 <= out["redriven"] < 20  # the rest stays in the dead-letter queue for the next run
        # At 0.1/s, the first receive's redrives alone would have it wait at least 10 s per message (a sleep
        # never returns early); the budget cut that wait. This bounds the rule, not the machine's speed.
        assert out["seconds"] < out["redriven"] / 0.1, out
    finally:
        sqs.delete_queue(QueueUrl=dlq)
        sqs.delete_queue(QueueUrl=source)


def test_only_the_termination_drain_takes_flush_rounds():
    from pipelines.definitions import build_definitions

    defs = build_definitions("local")

    def keys(job: str) -> set[str]:
        return set(defs.resolve_job_def(job).config_mapping.config_schema.config_type.fields)

    assert "flush_rounds" in keys("process_termination_queue")
    assert "flush_rounds" not in keys("process_housekeeping_queue")
    assert keys("process_termination_queue") - keys("process_housekeeping_queue") == {"flush_rounds"}
    with pytest.raises(ParamsError, match="flush_rounds"):
        parse_params(DrainLimits, {"flush_rounds": 2})


@pytest.mark.parametrize("cls", [DrainLimits, RedriveSettings])
def test_drains_and_the_dead_letter_redrive_take_what_is_left_of_max_messages(cls):
    limits = cls(max_messages=25)
    assert receive_budget(limits, 20, time.monotonic(), 10) == 5


@pytest.mark.parametrize("cls", [DrainLimits, RedriveSettings])
def test_drains_and_the_dead_letter_redrive_stop_at_max_messages(cls):
    limits = cls(max_messages=25)
    assert receive_budget(limits, 25, time.monotonic(), 10) == "max_messages"


@pytest.mark.parametrize("cls", [DrainLimits, RedriveSettings])
def test_drains_and_the_dead_letter_redrive_stop_at_max_seconds(cls):
    limits = cls(max_seconds=60)
    assert receive_budget(limits, 0, time.monotonic() - 61, 10) == "max_seconds"


@pytest.mark.parametrize("cls", [DrainLimits, RedriveSettings])
def test_without_max_messages_a_receive_takes_a_whole_round(cls):
    assert receive_budget(cls(max_messages=0), 10_000, time.monotonic(), 10) == 10
