"""ReportStream's receiver settings as they are: the import job, the timing rule against
ReportStream's own ``Receiver.Timing.batchInPrevious60Seconds``, and what each timing form does."""

import datetime as dt
import json
import shutil
import subprocess
import sys
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from pipelines.batching import store
from pipelines.batching.decider import decide
from pipelines.batching.reportstream_settings import entries_of, read_sources
from pipelines.batching.schedule import batch_times_in_day, due_in_window, parse_receiver
from pipelines.common import to_item
from pipelines.definitions import build_definitions
from resources import resources_for
from tests.batching_helpers import batcher, outbox, put_records, settings

UTC = dt.UTC
DATA = Path(__file__).parent / "data" / "reportstream"
SLICE = DATA / "slice"
IMPORT_JOB = build_definitions("local").resolve_job_def("import_receiver_settings")

# ReportStream's USTimeZone.kt as it is: each name's zoneId (its own spelling, not ours).
KOTLIN_ZONE_IDS = {
    "PACIFIC": "US/Pacific",
    "MOUNTAIN": "US/Mountain",
    "ARIZONA": "US/Arizona",
    "CENTRAL": "US/Central",
    "EASTERN": "US/Eastern",
    "SAMOA": "US/Samoa",
    "HAWAII": "US/Hawaii",
    "EAST_INDIANA": "US/East-Indiana",
    "INDIANA_STARKE": "US/Indiana-Starke",
    "MICHIGAN": "US/Michigan",
    "CHAMORRO": "Pacific/Guam",
    "ALASKA": "US/Alaska",
    "PUERTO_RICO": "America/Puerto_Rico",
    "US_VIRGIN_ISLANDS": "America/St_Thomas",
    "CHUUK": "Pacific/Chuuk",
    "POHNPEI": "Pacific/Pohnpei",
    "KOSRAE": "Pacific/Kosrae",
    "NORTHERN_MARIANA_ISLANDS": "Pacific/Guam",
    "UTC": "UTC",
    "MAJURO": "Pacific/Majuro",
}
SPRING_FORWARD, FALL_BACK, PLAIN = "2026-03-08", "2026-11-01", "2026-06-15"


@pytest.fixture(autouse=True)
def settings_dir(monkeypatch):
    """The import reads local paths under RECEIVER_SETTINGS_DIR: here the repository's data and tmp_path."""
    monkeypatch.setenv("RECEIVER_SETTINGS_DIR", "/")


def _import(aws, path, *, dry_run=False):
    result = IMPORT_JOB.execute_in_process(
        run_config={"path": str(path), "dry_run": dry_run}, resources=resources_for("local"), raise_on_error=False
    )
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    return result.output_for_node("import_reportstream_receivers")


def _items(aws) -> dict[str, dict]:
    return {i["receiver"]: i for i in store.scan_receivers(aws.client("dynamodb"), aws.env["RECEIVERS_TABLE"])}


# ---------------------------------------------------------------- ReportStream's rule, as its Kotlin states it


def _kotlin_rem(a: int, b: int) -> int:
    """Kotlin's ``%``: the sign of the dividend."""
    r = abs(a) % b
    return -r if a < 0 else r


def _seconds_of_day(text: str) -> int:
    parts = [int(x) for x in text.split(":")]
    return parts[0] * 3600 + parts[1] * 60 + (parts[2] if len(parts) > 2 else 0)


def _rs_due_at_wall(timing: dict, local_second_of_day: int) -> bool:
    initial = _seconds_of_day(timing.get("initialTime", "00:00"))
    period = (24 * 60 * 60) // timing.get("numberPerDay", 1)
    duration_from_initial = local_second_of_day - initial
    since_end = _kotlin_rem(duration_from_initial + (24 * 60 * 60) - 60, period) - period
    return since_end >= -60


def _rs_zone(timing: dict) -> ZoneInfo:
    name = timing.get("timeZone", "EASTERN")
    return ZoneInfo(KOTLIN_ZONE_IDS.get(name, name))


def batch_in_previous_60_seconds(timing: dict, now: dt.datetime) -> bool:
    """``Receiver.Timing.batchInPrevious60Seconds(now)``."""
    local = now.astimezone(_rs_zone(timing))
    return _rs_due_at_wall(timing, local.hour * 3600 + local.minute * 60 + local.second)


def _expected_ticks(timing: dict, day: str) -> set[dt.datetime]:
    """Every decider minute of the UTC day at which ReportStream batches, plus what its rule loses
    in a spring-forward gap: a wall time that does not exist fires at the same distance after it."""
    start = dt.datetime.fromisoformat(day).replace(tzinfo=UTC)
    ticks = [start + dt.timedelta(minutes=m) for m in range(1440)]
    expected = {t for t in ticks if batch_in_previous_60_seconds(timing, t)}
    zone = _rs_zone(timing)
    wall = (start - dt.timedelta(days=1)).astimezone(zone).replace(tzinfo=None, hour=0, minute=0)
    for m in range(3 * 1440):
        naive = wall + dt.timedelta(minutes=m)
        exists = naive.replace(tzinfo=zone).astimezone(UTC).astimezone(zone).replace(tzinfo=None) == naive
        if exists or not _rs_due_at_wall(timing, naive.hour * 3600 + naive.minute * 60):
            continue
        before = naive.replace(tzinfo=zone).utcoffset()  # the offset of before the change (fold=0)
        moment = (naive - before).replace(tzinfo=UTC)
        if start <= moment < start + dt.timedelta(days=1):
            expected.add(moment)
    return expected


@pytest.mark.slow
def test_imported_settings_batch_at_reportstreams_times_on_dst_days(aws):
    out = _import(aws, SLICE)
    assert out["add"] == 29
    settings = {e.receiver: e for e in entries_of(read_sources(str(SLICE), root=str(DATA))[0])[0] if e.item}
    items = _items(aws)
    assert sorted(items) == sorted(settings)
    zones = {e.item["timing"].get("timeZone", "EASTERN") for e in settings.values()}
    assert set(KOTLIN_ZONE_IDS) <= zones
    mismatched = []
    for name, entry in sorted(settings.items()):
        cfg = parse_receiver(items[name])
        for day in (SPRING_FORWARD, FALL_BACK, PLAIN):
            ours = set(batch_times_in_day(cfg, day))
            theirs = _expected_ticks(entry.item["timing"], day)
            if ours != theirs:
                mismatched.append((name, day, sorted(ours ^ theirs)[:3]))
    assert mismatched == []


def test_a_minutely_eastern_receiver_is_due_every_minute_of_the_repeated_hour():
    (entry,) = [e for e in entries_of(read_sources(str(SLICE), root=str(DATA))[0])[0] if e.receiver == "waters.giang"]
    cfg = parse_receiver(entry.item)
    start = dt.datetime(2026, 11, 1, 5, 0, tzinfo=UTC)  # 01:00 EDT; then 01:00 EST at 06:00Z
    ticks = [start + dt.timedelta(minutes=m) for m in range(120)]
    theirs = [t for t in ticks if batch_in_previous_60_seconds(entry.item["timing"], t)]
    assert [t for t in ticks if due_in_window(cfg, t)] == theirs  # all 120 minutes, both 01:xx hours


def test_a_time_in_the_spring_forward_gap_fires_right_after_it():
    (entry,) = [
        e
        for e in entries_of(read_sources(str(SLICE), root=str(DATA))[0])[0]
        if e.receiver == "rs-forms.east-indiana-none-once"
    ]
    cfg = parse_receiver(entry.item)  # once a day at 02:30, America/Indiana/Indianapolis
    assert batch_times_in_day(cfg, SPRING_FORWARD) == [dt.datetime(2026, 3, 8, 7, 30, tzinfo=UTC)]  # 03:30 EDT


def test_puerto_rico_is_america_puerto_rico_without_daylight_saving():
    cfg = parse_receiver(
        {"receiver": "pr.elr", "timing": {"numberPerDay": 1, "initialTime": "08:00", "timeZone": "PUERTO_RICO"}}
    )
    assert cfg.time_zone == "America/Puerto_Rico"
    summer, winter = batch_times_in_day(cfg, PLAIN), batch_times_in_day(cfg, "2026-12-15")
    assert [t.hour for t in summer + winter] == [12, 12]


def test_max_report_count_defaults_to_reportstreams_100():
    cfg = parse_receiver({"receiver": "a.b", "timing": {"numberPerDay": 1440, "timeZone": "EASTERN"}})
    assert cfg.max_batch_size == 100


def test_timing_defaults_are_reportstreams():
    cfg = parse_receiver({"receiver": "a.b", "timing": {}})
    assert (cfg.number_per_day, cfg.initial_time, cfg.time_zone, cfg.operation) == (
        1,
        "00:00",
        "America/New_York",
        "NONE",
    )


def test_the_whole_2022_organizations_file_reads():
    entries, problems, _ = entries_of(read_sources(str(DATA / "organizations-2022-04-29.yml"), root=str(DATA))[0])
    assert problems == []
    assert len(entries) == 106
    assert sum(1 for e in entries if e.item) == 93
    assert sum(1 for e in entries if e.problem) == 13


# ---------------------------------------------------------------- the import job


@pytest.mark.slow
def test_reimport_changes_nothing_also_from_s3(aws):
    _import(aws, SLICE)
    before = _items(aws)
    s3 = aws.client("s3")
    for file in SLICE.iterdir():
        s3.put_object(Bucket=aws.env["BATCH_OUTBOX_BUCKET"], Key=f"settings/{file.name}", Body=file.read_bytes())
    again = _import(aws, f"s3://{aws.env['BATCH_OUTBOX_BUCKET']}/settings/")
    assert (again["add"], again["change"], again["disable"], again["unchanged"]) == (0, 0, 0, 29)
    assert _items(aws) == before


@pytest.mark.slow
def test_dry_run_writes_nothing_and_shows_the_adds(aws):
    out = _import(aws, SLICE, dry_run=True)
    assert out["add"] == 29
    assert {c["outcome"] for c in out["changes"] if c["action"] == "add"} == {"would"}
    assert _items(aws) == {}


@pytest.mark.slow
def test_a_long_value_another_system_stored_is_shown_cut_short_in_its_change(aws):
    _import(aws, SLICE)
    aws.client("dynamodb").update_item(
        TableName=aws.env["RECEIVERS_TABLE"],
        Key={"receiver": {"S": "rs-forms.michigan"}},
        UpdateExpression="SET organization = :o, settings_digest = :d",  # as another writer might leave it
        ExpressionAttributeValues={":o": {"S": "x" * 100_000}, ":d": {"S": "another"}},
    )
    changes = {c["receiver"]: c for c in _import(aws, SLICE)["changes"]}
    assert len(changes["rs-forms.michigan"]["detail"]) < 300


@pytest.mark.slow
def test_changed_and_removed_receivers_are_changed_and_disabled(aws, tmp_path):
    folder = tmp_path / "settings"
    shutil.copytree(SLICE, folder)
    _import(aws, folder)
    forms = folder / "reportstream-forms.yml"
    text = forms.read_text().replace(
        'numberPerDay: 96\n        initialTime: "00:05"', 'numberPerDay: 48\n        initialTime: "00:05"'
    )
    text = text.replace('    - name: "utc"', '    - name: "utc-renamed"')
    forms.write_text(text)
    out = _import(aws, folder)
    actions = {c["receiver"]: (c["action"], c["outcome"]) for c in out["changes"]}
    assert actions["rs-forms.michigan"] == ("change", "done")
    assert actions["rs-forms.utc"] == ("disable", "done")
    assert actions["rs-forms.utc-renamed"] == ("add", "done")
    items = _items(aws)
    assert items["rs-forms.michigan"]["timing"]["numberPerDay"] == 48
    assert items["rs-forms.utc"]["batching_enabled"] is False
    assert _import(aws, folder)["disable"] == 0
    forms.write_text(text.replace('    - name: "utc-renamed"', '    - name: "utc"'))  # back in the settings
    back = {c["receiver"]: c for c in _import(aws, folder)["changes"]}
    assert back["rs-forms.utc"]["action"] == "unchanged"
    assert "set it to true" in back["rs-forms.utc"]["detail"]
    assert _items(aws)["rs-forms.utc"]["batching_enabled"] is False  # an import never enables


@pytest.mark.slow
def test_bad_entries_are_listed_one_line_each_and_the_rest_imported(aws, tmp_path):
    (tmp_path / "broken.yml").write_text("- name: x\n  receivers: [\n")
    (tmp_path / "bad.yml").write_text(
        """
- description: no name
- name: bad
  receivers:
    - name: "zone"
      timing: {numberPerDay: 24, timeZone: ATLANTIS}
    - name: "never"
      timing: {numberPerDay: 0}
    - name: "has space"
      timing: {numberPerDay: 24}
    - "not a map"
    - {timing: {numberPerDay: 1}}
    - name: "no-timing"
    - name: "good"
      customerStatus: active
      timing: {numberPerDay: 24, timeZone: HAWAII, maxReportCount: 10}
- name: big
  receivers:
    - name: "x"
      timing: !<WHATEVER> {numberPerDay: 1, initialTime: 12:30, timeZone: CENTRAL}
"""
    )
    out = _import(aws, tmp_path)
    skipped = {c["receiver"]: c["detail"] for c in out["changes"] if c["action"] == "skipped"}
    lines = [(c["receiver"], c["detail"]) for c in out["changes"] if c["action"] == "skipped"]
    assert [name for name, _ in lines].count("bad.?") == 2  # the receiver that is not a map, the one without a name
    assert sorted(skipped) == ["bad.?", "bad.has space", "bad.never", "bad.no-timing", "bad.zone"]
    assert "ATLANTIS" in skipped["bad.zone"]
    assert len(out["not_read"]) == 2  # the broken file, the organization without a name
    items = _items(aws)
    assert sorted(items) == ["bad.good", "big.x"]
    assert items["big.x"]["timing"]["initialTime"] == "12:30"


def test_a_time_zone_that_is_a_tzdata_folder_is_a_skipped_line_and_the_rest_imported(aws, tmp_path):
    (tmp_path / "zones.yml").write_text(
        """
- name: zones
  receivers:
    - name: folder
      timing: {numberPerDay: 24, timeZone: US}
    - name: long
      timing: {numberPerDay: 24, timeZone: %s}
    - name: good
      customerStatus: active
      timing: {numberPerDay: 24, timeZone: EASTERN}
"""
        % ("x" * 256)
    )
    out = _import(aws, tmp_path)
    skipped = {c["receiver"]: c["detail"] for c in out["changes"] if c["action"] == "skipped"}
    assert sorted(skipped) == ["zones.folder", "zones.long"]
    assert "timeZone must be a ReportStream USTimeZone name" in skipped["zones.folder"]
    assert sorted(_items(aws)) == ["zones.good"]


# ---------------------------------------------------------------- what each form does


def _put_timing(aws, name, timing, status="active"):
    item = {"receiver": name, "timing": timing, "customerStatus": status}
    aws.client("dynamodb").put_item(TableName=aws.env["RECEIVERS_TABLE"], Item=to_item(item))


def _keys(aws, prefix) -> list[str]:
    return list(store.list_keys(aws.client("s3"), aws.env["BATCH_OUTBOX_BUCKET"], prefix))


@pytest.mark.slow
def test_only_once_per_day_sends_one_empty_file_a_day_even_when_run_again(aws):
    _put_timing(
        aws, "o.once", {"numberPerDay": 24, "timeZone": "UTC", "whenEmpty": {"action": "SEND", "onlyOncePerDay": True}}
    )
    _put_timing(aws, "o.every", {"numberPerDay": 24, "timeZone": "UTC", "whenEmpty": {"action": "SEND"}})
    end = dt.datetime(2026, 11, 20, 23, 59, tzinfo=UTC)
    for name in ("o.once", "o.every"):
        batcher(aws).run(name, "2026-11-20", end)
    s3 = aws.client("s3")
    for key in _keys(aws, "ledger/o.once/"):
        s3.delete_object(Bucket=aws.env["BATCH_OUTBOX_BUCKET"], Key=key)  # a run at least once more
    batcher(aws).run("o.once", "2026-11-20", end)
    assert sorted(outbox(aws, "o.once")) == ["batches/o.once/2026-11-20T00:00Z/1.jsonl"]
    assert len(outbox(aws, "o.every")) == 24


@pytest.mark.slow
def test_the_decider_launches_no_second_empty_batch_of_the_day(aws):
    _put_timing(
        aws, "o.once", {"numberPerDay": 24, "timeZone": "UTC", "whenEmpty": {"action": "SEND", "onlyOncePerDay": True}}
    )
    batcher(aws).run("o.once", "2026-11-20", dt.datetime(2026, 11, 20, 0, 0, 30, tzinfo=UTC))
    later = decide(aws.client("dynamodb"), settings(aws), tick=dt.datetime(2026, 11, 20, 1, 0, tzinfo=UTC))
    assert later.due == []
    tomorrow = decide(aws.client("dynamodb"), settings(aws), tick=dt.datetime(2026, 11, 21, 0, 0, tzinfo=UTC))
    assert [(d.receiver, d.batch_time) for d in tomorrow.due] == [("o.once", dt.datetime(2026, 11, 21, tzinfo=UTC))]


@pytest.mark.slow
def test_operation_none_writes_one_file_per_record(aws):
    _put_timing(aws, "o.none", {"numberPerDay": 24, "timeZone": "UTC", "operation": "NONE"})
    put_records(aws, "o.none", [dt.datetime(2026, 11, 20, 9, 0, s, tzinfo=UTC) for s in range(3)])
    report = batcher(aws).run("o.none", "2026-11-20", dt.datetime(2026, 11, 20, 10, 0, tzinfo=UTC))
    assert [f.records for f in report.files] == [1, 1, 1]


@pytest.mark.slow
def test_customer_status_inactive_is_disabled_and_testing_batches(aws):
    _put_timing(aws, "o.inactive", {"numberPerDay": 24, "timeZone": "UTC", "operation": "MERGE"}, status="inactive")
    _put_timing(aws, "o.testing", {"numberPerDay": 24, "timeZone": "UTC", "operation": "MERGE"}, status="testing")
    for name in ("o.inactive", "o.testing"):
        put_records(aws, name, [dt.datetime(2026, 11, 20, 9, 0, tzinfo=UTC)])
    decision = decide(aws.client("dynamodb"), settings(aws), tick=dt.datetime(2026, 11, 20, 10, 0, tzinfo=UTC))
    assert [d.receiver for d in decision.due] == ["o.testing"]
    assert decision.skipped["o.inactive"] == "customerStatus is inactive"
    report = batcher(aws).run("o.inactive", "2026-11-20", dt.datetime(2026, 11, 20, 10, 0, tzinfo=UTC))
    assert report.status == "disabled"


@pytest.mark.cli
def test_the_cli_imports_and_shows_a_dry_run(aws, tmp_path):
    env = {**aws.subprocess_env(), "DAGSTER_HOME": str(tmp_path), "RECEIVER_SETTINGS_DIR": str(DATA)}
    (tmp_path / "dagster.yaml").write_text("")
    config = json.dumps({"path": "slice/reportstream-forms.yml", "dry_run": True})
    cmd = [sys.executable, "-m", "pipelines.cli", "import_receiver_settings", "--config-json", config]
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "rs-forms.puerto-rico: add -> would" in result.stdout + result.stderr
    assert _items(aws) == {}


ALIAS_CHAIN = """
- name: org-a
  receivers:
    - name: good
      customerStatus: active
      timing: {numberPerDay: 1, initialTime: "09:00", timeZone: EASTERN, maxReportCount: 100}
- name: org-b
  x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]
"""
ALIAS_CHAIN += "".join(f"  x{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]\n" for n in range(1, 10))
ALIAS_CHAIN += "  receivers:\n    - *a9\n"  # 10^10 strings once expanded, in under 1 KiB


def test_a_receiver_that_is_a_yaml_alias_chain_is_one_short_line_and_the_others_are_read(tmp_path):
    path = tmp_path / "organizations.yml"
    path.write_text(ALIAS_CHAIN)
    sources, _ = read_sources(str(path), None, str(tmp_path))
    entries, _, _ = entries_of(sources)
    problems = {entry.receiver: entry.problem for entry in entries}
    assert problems["org-a.good"] is None
    assert len(problems["org-b.?"]) < 120


TEN_THOUSAND = "  x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"  x{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]\n" for n in range(1, 4)
)  # *a3: 10^4 strings once expanded (its repr some 70,000 characters)


@pytest.mark.parametrize(
    ("key", "shown_in"),
    [("numberPerDay", lambda entry: entry.problem), ("timeBetweenBatches", lambda entry: entry.notes[0])],
)
def test_a_timing_value_that_is_a_yaml_alias_chain_is_shown_in_a_short_line(tmp_path, key, shown_in):
    path = tmp_path / "organizations.yml"
    path.write_text(f"- name: org\n{TEN_THOUSAND}  receivers:\n    - name: r1\n      timing:\n        {key}: *a3\n")
    [entry] = entries_of(read_sources(str(path), None, str(tmp_path))[0])[0]
    assert len(shown_in(entry)) < 200


def test_a_settings_file_nested_too_deeply_is_one_line_and_the_other_files_are_imported(aws, tmp_path):
    (tmp_path / "a.yml").write_text("- name: org\n  receivers:\n    - name: good\n      timing: {numberPerDay: 24}\n")
    (tmp_path / "deep.yml").write_text("- name: deep\n  receivers: " + "[" * 600 + "]" * 600 + "\n")
    out = _import(aws, tmp_path)
    assert out["not_read"] == [f"{tmp_path / 'deep.yml'}: not valid YAML (nested too deeply)"]
    assert sorted(_items(aws)) == ["org.good"]


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("2024-02-30", "ValueError: day is out of range for month"),
        ("!!int abc", "ValueError: invalid literal for int() with base 10: 'abc'"),
        ("!!bool maybe", "KeyError: 'maybe'"),
        ("1" * 5001, "ValueError: Exceeds the limit (4300 digits) for integer string conversion"),
    ],
    ids=["no such day", "not an int", "not a bool", "too many digits"],
)
def test_a_settings_file_with_a_value_yaml_cannot_read_is_one_line_and_the_other_files_are_read(value, line):
    good = "- name: org\n  receivers:\n    - name: good\n      timing: {numberPerDay: 24}\n"
    entries, problems, _ = entries_of([("a.yml", good), ("odd.yml", f"- name: odd\n  lastModified: {value}\n")])
    assert [entry.receiver for entry in entries] == ["org.good"]
    assert len(problems) == 1
    assert problems[0].startswith(f"odd.yml: not valid YAML: {line}")


def test_settings_files_past_the_limit_are_one_line_from_a_folder(tmp_path, monkeypatch):
    monkeypatch.setattr("pipelines.batching.reportstream_settings.MAX_FILES", 2)
    for name in ("a.yml", "b.yml", "c.yml"):
        (tmp_path / name).write_text("- name: org\n  receivers: []\n")
    sources, problems = read_sources(str(tmp_path), root=str(tmp_path))
    assert [Path(source).name for source, _ in sources] == ["a.yml", "b.yml"]
    assert problems == [f"{tmp_path}: 3 settings files, only the first 2 read"]


@pytest.mark.parametrize("name", ["organizations.txt", "passwd", "environ"])
def test_a_local_file_that_is_not_named_as_settings_is_not_read(tmp_path, name):
    file = tmp_path / name
    file.write_text("- name: org\n  receivers:\n  - name: full-elr\n")
    sources, problems = read_sources(str(file), root=str(tmp_path))
    assert sources == []
    assert problems == [f"{file}: no .yml or .yaml settings file"]


def test_settings_files_past_the_limit_are_one_line_from_s3(aws, monkeypatch):
    monkeypatch.setattr("pipelines.batching.reportstream_settings.MAX_FILES", 2)
    s3, bucket = aws.client("s3"), aws.env["BATCH_OUTBOX_BUCKET"]
    for name in ("a.yml", "b.yml", "c.yml"):
        s3.put_object(Bucket=bucket, Key=f"many/{name}", Body=b"- name: org\n  receivers: []\n")
    sources, problems = read_sources(f"s3://{bucket}/many/", s3)
    assert [source for source, _ in sources] == [f"s3://{bucket}/many/a.yml", f"s3://{bucket}/many/b.yml"]
    assert problems == [f"s3://{bucket}/many/: 3 settings files, only the first 2 read"]


def test_a_local_path_is_not_read_when_no_settings_folder_is_set(aws, monkeypatch):
    monkeypatch.delenv("RECEIVER_SETTINGS_DIR")
    out = _import(aws, SLICE)
    assert out["not_read"] == [f"{SLICE}: a local path is read only under RECEIVER_SETTINGS_DIR, which is not set"]


@pytest.mark.parametrize("path", ["../../etc", "/etc/ssl", "slice/../../../etc"])
def test_a_local_path_leading_out_of_the_settings_folder_is_not_read(path):
    sources, problems = read_sources(path, root=str(DATA))
    assert sources == []
    assert problems == [f"{path}: outside RECEIVER_SETTINGS_DIR ({DATA.resolve()}): not read"]


def test_a_settings_file_that_links_out_of_the_settings_folder_is_not_read(tmp_path):
    (tmp_path / "outside.yml").write_text("- name: secret\n  receivers: []\n")
    (tmp_path / "settings").mkdir()
    (tmp_path / "settings" / "organizations.yml").symlink_to(tmp_path / "outside.yml")
    sources, problems = read_sources(".", root=str(tmp_path / "settings"))
    assert sources == []
    assert problems == [
        f"{tmp_path / 'settings' / '.' / 'organizations.yml'}: a link outside RECEIVER_SETTINGS_DIR: not read"
    ]
