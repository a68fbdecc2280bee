"""POP's sample JSON, saved unchanged (duplicate key and all), runs the job: once through the CLI
(with the HTTP endpoint writer it names) and once in process with the direct DynamoDB writer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from infra.agenda_endpoint import LocalAgendaEndpoint
from tests.reclaim_support import PROGRESS_TABLE, encrypted_password, items_by_id, seed_mixed

pytestmark = pytest.mark.cli

SAMPLE = Path(__file__).with_name("data") / "pop_reclaim_sample.json"


def _execute(config: Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "dagster", "job", "execute", "-m", "pipelines.definitions", "-j", "reclaim_agendas"]
    return subprocess.run([*cmd, "-c", str(config)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _states(ddb, ids: list[str]) -> set[tuple[str, str | None]]:
    items = items_by_id(ddb)
    return {(items[i]["processingState"], items[i].get("processingStateMessage")) for i in ids}


def _assert_only_stale_failed(ddb, ids: dict[str, list[str]]) -> None:
    items = items_by_id(ddb)
    assert _states(ddb, ids["stale"]) == {("COMPLETE", "failed")}
    assert {items[i]["attemptsCompleted"] for i in ids["stale"]} == {1}
    assert all('"AgendaProgress timed out."' in items[i]["diagnosticEvents"] for i in ids["stale"]), "timeout event"
    assert _states(ddb, ids["fresh"]) == {("EXECUTING", None)}
    assert _states(ddb, ids["waiting"]) == {("WAITING", "pending")}
    assert _states(ddb, ids["complete"]) == {("COMPLETE", "succeeded")}
    untouched = ids["fresh"] + ids["complete"]
    assert {items[i]["diagnosticEvents"] for i in untouched} == {"[]"}


def test_pop_sample_unchanged_has_a_duplicate_key():
    text = SAMPLE.read_text()
    assert text.count('"maximumExecutionSeconds"') == 2  # the later value (120) wins, as in YAML/JSON loaders


def test_pop_sample_in_process_direct_dynamodb_writer(aws):
    ddb = aws.client("dynamodb")
    ids = seed_mixed(ddb)
    config = {k: v for k, v in json.loads(SAMPLE.read_text()).items() if k != "agendaProgressEndpointURL"}
    from pipelines.definitions import build_definitions

    job = build_definitions("local").resolve_job_def("reclaim_agendas")
    instance = dg.DagsterInstance.ephemeral()
    result = job.execute_in_process(run_config=config, instance=instance)
    logs = [e.user_message for e in instance.all_logs(result.run_id)]
    assert any("writer DynamoDB" in m for m in logs)
    _assert_only_stale_failed(ddb, ids)


def test_pop_sample_via_cli_http_endpoint_writer(aws, tmp_path):
    ddb = aws.client("dynamodb")
    ids = seed_mixed(ddb)
    with LocalAgendaEndpoint(aws.client("dynamodb"), PROGRESS_TABLE) as endpoint:
        config = tmp_path / "sample.json"
        config.write_text(SAMPLE.read_text().replace("https://www.myurl.com", endpoint.progress_url))
        env = {
            **aws.subprocess_env(),
            "IDENTITY_URL": endpoint.identity_url,
            "IDM_USER": endpoint.username,
            "IDM_ENCRYPTED_PASS": encrypted_password(aws.client("kms"), endpoint.password),
            "AGENDA_PROGRESS_ALLOWED_URLS": endpoint.base,  # the deployment names the sample's endpoint
        }
        result = _execute(config, env, tmp_path)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-6000:]
        assert f"writer HTTP {endpoint.progress_url}" in output
        puts = [path for method, path in endpoint.requests if method == "PUT"]
        assert sorted(p.rsplit("/", 1)[1] for p in puts) == sorted(ids["stale"])
        assert ("POST", "/login") in endpoint.requests
        token_headers = {h for h in endpoint.seen_auth if h.startswith("Bearer ")}
        assert token_headers, "no bearer token was sent"
        assert not any(h[7:] in output for h in token_headers), "a token shows in the output"
        assert endpoint.password not in output
    _assert_only_stale_failed(ddb, ids)
