"""``make ui-test``: drive the Dagster UI of ``make dev`` in headless Chromium (playwright).

Not part of ``make test``: pytest does not collect this file (its name matches neither
``test_*.py`` nor ``*_test.py``). It:

1. copies the repository's tracked files to a temporary folder and starts ``python -m infra.local``
   there on free ports (its state folder, ``.groundskeeper/``, is then the copy's, so a developer's
   own ``make dev`` state is left alone), waits until GraphQL answers and the code location is
   loaded, and always stops the whole process group at the end;
2. with Debian's Chromium (``/usr/bin/chromium``), headless:
   a. Launchpad of ``reclaim_agendas``: pastes ``docs/examples/reclaim_demo.yaml``, launches, waits for
      the run to succeed, and reads a non-zero ``reclaimed`` count on the run page;
   b. ``pool_cost_report`` asset page: materializes today's partition (GraphQL) and finds the
      text-bar chart inline;
   c. ``retry_policies`` asset page (materialized at start by ``retry_policies_on_start``): finds the
      timeline table inline;
   d. launches a 3-partition backfill of ``receiver_batches`` from the asset's Materialize dialog
      (or, printing a ``note:`` line, GraphQL ``launchPartitionBackfill`` if the dialog cannot be
      driven) and watches it finish on the UI's backfill page;
   e. ``progressor/health_default_default`` asset page, after ``progressor_health_job``: the
      ``task_durations`` chart is text bars inline, and the page has no ``data:`` image;
   f. ``operations_summary``, materialized after that backfill: its runs count under ``batching``,
      and no row names Dagster's ``__ASSET_JOB``;
   g. the runs list shows at most 3 tags per run (besides a batch minute run's batch time and handoff tags).

One screenshot per step goes to ``.groundskeeper/ui-test/`` of this repository; their paths are
printed. ``UI_TEST_URL=http://127.0.0.1:3000`` drives a ``make dev`` already running instead
(it then changes that one's state). Any failure ends with one ``ui-test FAILED: ...`` line and exit status 1.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / ".groundskeeper" / "ui-test"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LOCATION = "groundskeeper"
COUNTS_TAG = "groundskeeper/counts"  # a run's counters, one JSON tag (pipelines/common/summary.py)
MAX_RUN_TAGS = 3  # tags the runs list shows per run (it hides Dagster's own but dagster/partition)
# ... besides a batch_minute_job run's decider minute and, when receivers failed in it, its two handoff
# tags: the contract gives that run these (docs/contracts.md, "Run tags (batching)")
MINUTE_RUN_TAGS = ("groundskeeper/batch_time", "groundskeeper/handoff", "groundskeeper/failed_partitions")
REPOSITORY = "__repository__"
STACK_TIMEOUT_S = 600  # moto + CloudFormation + embedded PostgreSQL + dagster dev, on a busy 2-core machine
RUN_TIMEOUT_S = 600
BACKFILL_TIMEOUT_S = 900


class UIFailure(Exception):
    """One step failed; the message is the one line printed."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check: Callable[[], object], timeout_s: float, every_s: float = 2.0) -> object:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except UIFailure:
            raise
        except Exception as exc:  # not ready yet: connection refused, location still loading
            last_error = exc
        time.sleep(every_s)
    why = f" ({last_error})" if last_error else ""
    raise UIFailure(f"timed out after {timeout_s:.0f} s waiting for {what}{why}")


class Stack:
    """``python -m infra.local`` in a temporary copy of the repository, on free ports."""

    def __init__(self) -> None:
        self.copy = Path(tempfile.mkdtemp(prefix="groundskeeper-ui-test-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = SHOTS / "make-dev.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        files = (
            subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True)
            .stdout.decode()
            .split("\0")
        )
        for name in filter(None, files):
            src = ROOT / name
            if src.is_file():
                (self.copy / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, self.copy / name)
        env = {
            **os.environ,
            "PYTHONPATH": str(self.copy),
            "DAGSTER_PORT": str(self.port),
            "MOTO_PORT": str(free_port()),
            "AGENDA_ENDPOINT_PORT": str(free_port()),
            "ALERTS_RECEIVER_PORT": str(free_port()),
            "DYNAMODB_LOCAL_PORT": str(free_port()),
        }
        env.pop("PROGRESSOR_DSN", None)  # the copy's own embedded PostgreSQL
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infra.local"],
            cwd=self.copy,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        print(f"make dev (copy in {self.copy}) on {self.url}; log: {self.log_path}", flush=True)
        wait_for("the Dagster UI and the code location to load", self._ready, STACK_TIMEOUT_S, every_s=3)

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise UIFailure(f"make dev exited with status {self.proc.returncode}; see {self.log_path}")
        data = gql(
            self.url,
            "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
            "locationOrLoadError { __typename ... on PythonError { message } } } } } }",
        )
        for entry in data["workspaceOrError"]["locationEntries"]:
            if entry["name"] == LOCATION and entry["loadStatus"] == "LOADED":
                loaded = entry["locationOrLoadError"]
                if loaded["__typename"] == "PythonError":
                    raise UIFailure(f"code location {LOCATION} failed to load: {loaded['message'].strip()}")
                return True
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # infra.local stops moto, dagster, PostgreSQL
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        shutil.rmtree(self.copy, ignore_errors=True)


def gql(url: str, query: str, variables: dict | None = None) -> dict:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    req = urllib.request.Request(f"{url}/graphql", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        payload = json.load(resp)
    if payload.get("errors"):
        raise UIFailure(f"GraphQL error: {payload['errors'][0].get('message')}")
    return payload["data"]


RUN_QUERY = """query ($id: ID!) { runOrError(runId: $id) { __typename
  ... on Run { status tags { key value } } } }"""


def wait_run(url: str, run_id: str, what: str) -> dict:
    def done():
        run = gql(url, RUN_QUERY, {"id": run_id})["runOrError"]
        if run["__typename"] != "Run":
            return None
        if run["status"] in ("FAILURE", "CANCELED"):
            raise UIFailure(f"{what}: run {run_id} ended {run['status']} ({url}/runs/{run_id})")
        return run if run["status"] == "SUCCESS" else None

    return wait_for(f"{what} (run {run_id}) to succeed", done, RUN_TIMEOUT_S)


def dismiss_community_modal(page) -> None:
    skip = page.get_by_role("button", name="Skip")
    try:
        if skip.is_visible():
            skip.click()
    except Exception:
        pass


def goto(page, url: str) -> None:
    page.goto(url, wait_until="domcontentloaded")
    dismiss_community_modal(page)


def shot(page, name: str) -> Path:
    dismiss_community_modal(page)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}", flush=True)
    return path


def expect_text(page, pattern: str | re.Pattern, what: str, timeout_s: float = 120) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.get_by_text(pattern).first.wait_for(state="visible", timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        raise UIFailure(f"{what}: {pattern!r} not seen on {page.url}") from None


def show_inline(page, locator, missing: str, name: str, timeout_s: float = 180) -> None:
    """Wait until ``locator`` shows on the page, scroll to it and take the step's screenshot."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        locator.first.wait_for(state="visible", timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        raise UIFailure(f"{missing} on {page.url}") from None
    locator.first.scroll_into_view_if_needed()
    shot(page, name)


# --- the steps -----------------------------------------------------------------------------------


def step_reclaim(page, url: str) -> str:
    config = (ROOT / "docs" / "examples" / "reclaim_demo.yaml").read_text()
    goto(page, f"{url}/locations/{LOCATION}/jobs/reclaim_agendas/playground")
    editor = page.locator(".CodeMirror").first
    editor.wait_for(state="visible", timeout=120_000)
    dismiss_community_modal(page)
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.insert_text(config)
    typed = page.evaluate("() => document.querySelector('.CodeMirror').CodeMirror.getValue()")
    if typed.strip() != config.strip():  # the editor re-indented the paste: set it as a whole
        page.evaluate("(text) => document.querySelector('.CodeMirror').CodeMirror.setValue(text)", config)
    launch = page.get_by_role("button", name="Launch Run").last
    launch.wait_for(state="visible", timeout=60_000)
    wait_for("the Launch Run button to be enabled", launch.is_enabled, 60, every_s=1)
    shot(page, "1-reclaim-launchpad")
    launch.click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"), timeout=120_000)
    run_id = re.search(r"/runs/([0-9a-f-]{36})", page.url).group(1)
    run = wait_run(url, run_id, "reclaim_agendas from the Launchpad")
    counts = json.loads(next((t["value"] for t in run["tags"] if t["key"] == COUNTS_TAG), "{}"))
    reclaimed = int(counts.get("reclaimed", 0) or 0)
    goto(page, f"{url}/runs/{run_id}")
    expect_text(page, re.compile(r"summary: reclaim"), "reclaim run page (summary log line)")
    expect_text(page, re.compile(r"reclaimed=[1-9]"), "reclaim run page (non-zero reclaimed count)")
    shot(page, "2-reclaim-run")
    if reclaimed <= 0:
        raise UIFailure(f"reclaim_agendas run {run_id} reclaimed nothing (counts {counts})")
    return f"reclaim_agendas run {run_id}: " + ", ".join(f"{k}={v}" for k, v in counts.items())


LAUNCH_MUTATION = """mutation ($params: ExecutionParams!) { launchRun(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on RunConfigValidationInvalid { errors { message } } ... on InvalidSubsetError { message } } }"""


def launch_job(url: str, job: str, tags: dict[str, str]) -> str:
    params = {
        "selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "jobName": job},
        "runConfigData": {},
        "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
    }
    result = gql(url, LAUNCH_MUTATION, {"params": params})["launchRun"]
    if result["__typename"] != "LaunchRunSuccess":
        raise UIFailure(f"cannot launch {job}: {json.dumps(result)[:300]}")
    return result["run"]["runId"]


def step_pool_cost_report(page, url: str) -> str:
    day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    # today's snapshot first: the demo's pool_audit_schedule runs every 15 minutes, maybe not yet
    wait_run(url, launch_job(url, "pool_audit_job", {}), "pool_audit_job (a snapshot of the demo's pools)")
    run_id = launch_job(url, "pool_cost_report_job", {"dagster/partition": day})
    wait_run(url, run_id, f"pool_cost_report for {day}")
    goto(page, f"{url}/assets/pool_cost_report?partition={day}")
    # the chart is a text-bar chart in a markdown code block: bars are drawn with block characters
    chart = page.locator("pre, code").filter(has_text=re.compile(r"[█▇▆▅▄▃▂▁▏▎▍▌▋▊▉░▒▓#]{3,}"))
    show_inline(page, chart, "pool_cost_report: no inline chart (code block with bars)", "3-pool-cost-report")
    return f"pool_cost_report {day}: chart inline"


def step_retry_policies(page, url: str) -> str:
    goto(page, f"{url}/assets/retry_policies")
    table = page.locator("table").filter(has_text=re.compile(r"preset")).filter(has_text="timeline")
    show_inline(page, table, "retry_policies: no inline timeline table", "4-retry-policies")
    return "retry_policies: timeline table inline"


BACKFILL_MUTATION = """mutation ($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
BACKFILL_QUERY = """query ($id: String!) { partitionBackfillOrError(backfillId: $id) { __typename
  ... on PartitionBackfill { status numPartitions } } }"""


BACKFILLS_QUERY = "{ partitionBackfillsOrError(limit: 20) { ... on PartitionBackfills { results { id } } } }"


def backfill_ids(url: str) -> set[str]:
    return {b["id"] for b in gql(url, BACKFILLS_QUERY)["partitionBackfillsOrError"]["results"]}


def backfill_from_dialog(page, url: str, receiver: str, days: list[str]) -> str:
    """Assets -> receiver_batches -> Materialize: the days as a range, one receiver, Launch backfill.
    Returns the new backfill's id."""
    before = backfill_ids(url)
    goto(page, f"{url}/assets/receiver_batches")
    page.get_by_role("button", name="Materialize").first.click()
    dialog = page.get_by_role("dialog")
    day_input = dialog.get_by_placeholder(re.compile(r"^ex: "))
    day_input.fill(f"[{days[0]}...{days[-1]}]")
    day_input.press("Enter")
    dialog.get_by_text("Select a partition").first.click()
    page.keyboard.type(receiver)
    page.get_by_text(re.compile(r"^Select all \(1\)$")).click()  # the search left only this receiver
    dialog.get_by_text("Launch runs to materialize").click()  # closes the picker
    dialog.get_by_text(re.compile(rf"^{len(days)} partitions$")).wait_for(state="visible", timeout=30_000)
    shot(page, "5-backfill-dialog")
    dialog.get_by_role("button", name="Launch backfill").click()
    new = wait_for("the backfill launched from the dialog", lambda: backfill_ids(url) - before, 120, every_s=2)
    return sorted(new)[0]


def step_backfill(page, url: str) -> str:
    query = '{ assetNodeOrError(assetKey: {path: ["receiver_batches"]}) { ... on AssetNode { partitionKeys } } }'
    keys = gql(url, query)
    all_keys = keys["assetNodeOrError"]["partitionKeys"]
    receiver = sorted({k.split("|", 1)[1] for k in all_keys})[0]
    mine = sorted(k for k in all_keys if k.endswith(f"|{receiver}"))[-3:]
    if len(mine) != 3:
        raise UIFailure(f"receiver_batches: fewer than 3 partitions for {receiver}: {mine}")
    try:
        backfill_id, how = (
            backfill_from_dialog(page, url, receiver, [k.split("|", 1)[0] for k in mine]),
            "UI's Materialize dialog",
        )
    except Exception as exc:  # the dialog changed: launch it as the dialog would, and still watch it in the UI
        shot(page, "5-backfill-dialog-failed")
        print(f"note: the Materialize dialog did not launch the backfill ({str(exc).splitlines()[0]}); "
              "launching it over GraphQL", flush=True)  # fmt: skip
        params = {"assetSelection": [{"path": ["receiver_batches"]}], "partitionNames": mine, "fromFailure": False}
        result = gql(url, BACKFILL_MUTATION, {"params": params})["launchPartitionBackfill"]
        if result["__typename"] != "LaunchBackfillSuccess":
            raise UIFailure(f"cannot launch the receiver_batches backfill: {json.dumps(result)[:300]}") from None
        backfill_id, how = result["backfillId"], "GraphQL API"
    goto(page, f"{url}/runs/b/{backfill_id}")
    shot(page, "6-backfill-started")

    def finished():
        b = gql(url, BACKFILL_QUERY, {"id": backfill_id})["partitionBackfillOrError"]
        if b["status"] in ("FAILED", "CANCELED", "COMPLETED_FAILED"):
            raise UIFailure(f"receiver_batches backfill {backfill_id} ended {b['status']} ({url}/runs/b/{backfill_id})")
        return b["status"] in ("COMPLETED", "COMPLETED_SUCCESS")

    wait_for(f"receiver_batches backfill {backfill_id} to finish", finished, BACKFILL_TIMEOUT_S, every_s=5)
    goto(page, f"{url}/runs/b/{backfill_id}")
    expect_text(page, re.compile(r"^(Succeeded|Completed|Success)$", re.I), "backfill page (completed status)")
    shot(page, "7-backfill-finished")
    return f"receiver_batches backfill {backfill_id} (launched from the {how}): {', '.join(mine)} done"


DATA_IMAGES = (
    "() => [...document.querySelectorAll('img')].filter(i => (i.getAttribute('src') || '').startsWith('data:')).length"
)


def step_progressor_chart(page, url: str) -> str:
    # one step of progressor's demo traffic first: it finishes the running tasks, so there are durations
    wait_run(url, launch_job(url, "progressor_demo_traffic", {}), "progressor_demo_traffic")
    run_id = launch_job(url, "progressor_health_job", {})
    wait_run(url, run_id, "progressor_health_job")
    goto(page, f"{url}/assets/progressor/health_default_default")
    # task_durations: text bars per bucket in a code block, drawn like the pool cost chart
    chart = page.locator("pre, code").filter(has_text=re.compile(r"<=50 ")).filter(has_text=re.compile(r"[█░▓▒]"))
    show_inline(
        page, chart, "progressor health: no inline task_durations chart (code block with bars)", "8-progressor-chart"
    )
    images = page.evaluate(DATA_IMAGES)
    if images or page.get_by_text("[Show Markdown]").count():
        raise UIFailure(f"progressor health: {images} data: image(s) or a [Show Markdown] link on {page.url}")
    return "progressor task_durations: chart inline, no data: image"


def step_operations_summary(page, url: str) -> str:
    """After the UI backfill of receiver_batches (Dagster's __ASSET_JOB): operations_summary counts
    its runs under batching, with no __ASSET_JOB row."""
    params = {
        "selector": {
            "repositoryLocationName": LOCATION,
            "repositoryName": REPOSITORY,
            "jobName": "__ASSET_JOB",
            "assetSelection": [{"path": ["operations_summary"]}],
        },
        "runConfigData": {},
    }
    result = gql(url, LAUNCH_MUTATION, {"params": params})["launchRun"]
    if result["__typename"] != "LaunchRunSuccess":
        raise UIFailure(f"cannot materialize operations_summary: {json.dumps(result)[:300]}")
    wait_run(url, result["run"]["runId"], "operations_summary")
    goto(page, f"{url}/assets/operations_summary")
    table = page.locator("table").filter(has_text="batches_sent").filter(has_text="batching")
    show_inline(page, table, "operations_summary: no per_capability row of batching", "9-operations-summary")
    if page.get_by_text("__ASSET_JOB").count():
        raise UIFailure(f"operations_summary lists a capability __ASSET_JOB on {page.url}")
    return "operations_summary: the backfill's runs count under batching, no __ASSET_JOB row"


# the runs list (Dagster 1.13): a row per run, its tags (BaseTag) in the RunRowTags wrapper of the ID cell
RUN_TAG_COUNTS = """() => [...document.querySelectorAll('[class*="RunsFeedRow_rowGrid"]')].map(row => {
  const id = row.querySelector('a[href^="/runs/"]');
  const tags = [...row.querySelectorAll('[class*="RunRowTags_runTagsWrapper"] [class*="BaseTag_baseTag"]')];
  return [id ? id.innerText.trim() : '?', tags.length, tags.map(t => t.innerText.trim())];
})"""


def step_runs_list(page, url: str) -> str:
    goto(page, f"{url}/runs")
    page.get_by_text(re.compile(r"^View all tags")).first.wait_for(state="visible", timeout=120_000)
    dismiss_community_modal(page)
    page.wait_for_timeout(2000)
    rows = page.evaluate(RUN_TAG_COUNTS)
    shot(page, "10-runs-list")
    if not rows or not any(count for _, count, _ in rows):
        raise UIFailure(f"runs list: no run tags found on {page.url} (the page changed?)")
    counted = [(run, [t for t in tags if t.split(":")[0].strip() not in MINUTE_RUN_TAGS]) for run, _, tags in rows]
    crowded = [(run, tags) for run, tags in counted if len(tags) > MAX_RUN_TAGS]
    if crowded:
        run, tags = crowded[0]
        raise UIFailure(f"runs list: run {run} shows {len(tags)} tags (at most {MAX_RUN_TAGS}): {', '.join(tags)}")
    return f"runs list: {len(rows)} runs, at most {max(len(t) for _, t in counted)} tags each (besides a minute run's)"


def main() -> int:
    if not Path(CHROMIUM).exists():
        print(f"ui-test FAILED: {CHROMIUM} is missing (sudo apt-get install chromium)", file=sys.stderr)
        return 1
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):
        old.unlink()
    reuse = os.environ.get("UI_TEST_URL")  # a make dev already running (for working on this script)
    stack = Stack()
    results: list[str] = []
    try:
        if reuse:
            stack.url = reuse.rstrip("/")
        else:
            stack.start()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(60_000)
            try:
                steps = (
                    step_reclaim,
                    step_pool_cost_report,
                    step_retry_policies,
                    step_backfill,
                    step_progressor_chart,
                    step_operations_summary,
                    step_runs_list,
                )
                for step in steps:
                    results.append(step(page, stack.url))
                    print(f"ok: {results[-1]}", flush=True)
            except Exception as exc:
                shot(page, "failure")
                if isinstance(exc, UIFailure):
                    raise
                first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise UIFailure(f"{step.__name__}: {type(exc).__name__}: {first_line} (on {page.url})") from exc
            finally:
                browser.close()
    except UIFailure as exc:
        print(f"ui-test FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    print(f"ui-test passed ({len(results)} steps); screenshots in {SHOTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
