"""Batch times of receivers in several time zones, DST changes included, and receiver validation."""

import datetime as dt

import pytest

from pipelines.batching.schedule import (
    InvalidReceiver,
    batch_times,
    batch_times_in_day,
    due_in_window,
    parse_receiver,
    receiver_errors,
)
from tests.batching_helpers import receiver

UTC = dt.UTC


def _cfg(**kw):
    return parse_receiver(receiver("r", **kw))


def _hm(times):
    return [t.strftime("%H:%M") for t in times]


def test_hourly_utc_receiver_has_24_batches_on_the_hour():
    times = batch_times_in_day(_cfg(number_per_day=24, initial_time="00:00"), "2026-11-22")
    assert len(times) == 24
    assert _hm(times) == [f"{h:02d}:00" for h in range(24)]


def test_quarter_hourly_new_york_receiver_in_winter():
    cfg = _cfg(number_per_day=96, initial_time="00:05", time_zone="America/New_York")
    times = batch_times_in_day(cfg, "2026-11-22")
    assert len(times) == 96
    assert _hm(times)[:3] == ["00:05", "00:20", "00:35"]  # EST is UTC-5: 19:05 local is 00:05Z


def test_daily_berlin_receiver_follows_summer_and_winter_time():
    cfg = _cfg(number_per_day=1, initial_time="06:00", time_zone="Europe/Berlin")
    assert batch_times_in_day(cfg, "2026-11-22") == [dt.datetime(2026, 11, 22, 5, 0, tzinfo=UTC)]  # CET
    assert batch_times_in_day(cfg, "2026-07-01") == [dt.datetime(2026, 7, 1, 4, 0, tzinfo=UTC)]  # CEST
    # The 2026 change is on 29 March at 02:00 local: 06:00 that day is already CEST.
    assert batch_times_in_day(cfg, "2026-03-28") == [dt.datetime(2026, 3, 28, 5, 0, tzinfo=UTC)]
    assert batch_times_in_day(cfg, "2026-03-29") == [dt.datetime(2026, 3, 29, 4, 0, tzinfo=UTC)]


def test_spring_forward_gap_time_fires_after_the_gap_and_once():
    # New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT. 02:30 does not exist.
    cfg = _cfg(number_per_day=24, initial_time="00:30", time_zone="America/New_York")
    zone = cfg.zone
    start = dt.datetime(2026, 3, 8, 0, 0, tzinfo=zone)
    end = dt.datetime(2026, 3, 9, 0, 0, tzinfo=zone)
    times = batch_times(cfg, start, end)
    local = [t.astimezone(zone).strftime("%H:%M") for t in times]
    assert len(times) == 23  # a 23-hour day: 02:30 lands on 03:30 EDT, which fires once
    assert local[:4] == ["00:30", "01:30", "03:30", "04:30"]
    assert dt.datetime(2026, 3, 8, 7, 30, tzinfo=UTC) in times  # 02:30 EST == 03:30 EDT == 07:30Z


def test_fall_back_repeated_time_fires_at_both_occurrences():
    # New York, 2026-11-01: 02:00 EDT falls back to 01:00 EST. 01:30 happens twice, and fires
    # twice, as ReportStream's wall-clock rule has it (one batch an hour, the 25-hour day's 25).
    cfg = _cfg(number_per_day=24, initial_time="00:30", time_zone="America/New_York")
    zone = cfg.zone
    times = batch_times(cfg, dt.datetime(2026, 11, 1, 0, 0, tzinfo=zone), dt.datetime(2026, 11, 2, 0, 0, tzinfo=zone))
    assert len(times) == 25
    assert dt.datetime(2026, 11, 1, 5, 30, tzinfo=UTC) in times  # the first 01:30 (EDT)
    assert dt.datetime(2026, 11, 1, 6, 30, tzinfo=UTC) in times  # the second 01:30 (EST)
    gaps = {(b - a) for a, b in zip(times, times[1:], strict=False)}
    assert gaps == {dt.timedelta(hours=1)}


def test_fall_back_keeps_a_minutely_receiver_batching_through_the_repeated_hour():
    cfg = _cfg(number_per_day=1440, initial_time="00:00", time_zone="America/New_York")
    start = dt.datetime(2026, 11, 1, 5, 0, tzinfo=UTC)  # 01:00 EDT; 06:00Z is 01:00 EST
    ticks = [start + dt.timedelta(minutes=m) for m in range(120)]
    assert [t for t in ticks if not due_in_window(cfg, t)] == []


def test_uneven_cadence_uses_whole_minutes_and_wraps_midnight():
    cfg = _cfg(number_per_day=7, initial_time="22:00")
    # offsets floor(k*1440/7): 0, 205, 411, 617, 822, 1028, 1234 minutes after 22:00
    assert _hm(batch_times_in_day(cfg, "2026-11-22")) == ["01:25", "04:51", "08:17", "11:42", "15:08", "18:34", "22:00"]


def test_batch_times_up_to_now_and_the_decider_window():
    cfg = _cfg(number_per_day=96, initial_time="00:05", time_zone="America/New_York")
    now = dt.datetime(2026, 11, 22, 1, 0, 30, tzinfo=UTC)
    assert _hm(batch_times_in_day(cfg, "2026-11-22", until=now)) == ["00:05", "00:20", "00:35", "00:50"]
    assert due_in_window(cfg, dt.datetime(2026, 11, 22, 0, 20, tzinfo=UTC)) == [
        dt.datetime(2026, 11, 22, 0, 20, tzinfo=UTC)
    ]
    assert due_in_window(cfg, dt.datetime(2026, 11, 22, 0, 21, tzinfo=UTC)) == []  # (00:20, 00:21]
    assert due_in_window(cfg, dt.datetime(2026, 11, 22, 0, 20, 40, tzinfo=UTC)) == [
        dt.datetime(2026, 11, 22, 0, 20, tzinfo=UTC)
    ]


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"number_per_day": 0}, "number_per_day"),
        ({"number_per_day": 2000}, "number_per_day"),
        ({"number_per_day": True}, "number_per_day"),
        ({"time_zone": "Mars/Olympus_Mons"}, "time_zone"),
        ({"time_zone": "../../etc/passwd"}, "time_zone"),
        ({"time_zone": "America"}, "time_zone"),  # a folder of tzdata, not a zone
        ({"time_zone": "x" * 256}, "time_zone"),  # longer than a file name may be
        ({"initial_time": "6:00"}, "initial_time"),
        ({"initial_time": "24:00"}, "initial_time"),
        ({"initial_time": "noon"}, "initial_time"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"batching_enabled": "yes"}, "batching_enabled"),
        ({"receiver": "a|b"}, "receiver name"),
    ],
)
def test_invalid_receivers_are_named(overrides, problem):
    item = receiver("r", **overrides)
    errors = receiver_errors(item)
    assert errors
    assert any(problem in e for e in errors)
    with pytest.raises(InvalidReceiver, match=problem):
        parse_receiver(item)


def test_defaults_for_optional_fields():
    item = receiver("r")
    for key in ("time_zone", "send_if_empty_batch", "batching_enabled"):
        item.pop(key)
    cfg = parse_receiver(item)
    assert (cfg.time_zone, cfg.send_if_empty_batch, cfg.batching_enabled) == ("UTC", False, True)
