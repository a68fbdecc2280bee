"""Done-when: the seed's sample JSON, saved unchanged (duplicate key and all), runs the job via the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipelines.reclaim.local_endpoint import LocalAgendaEndpoint
from tests.reclaim_support import PROGRESS_TABLE, encrypted_password, items_by_id, seed_mixed

SAMPLE = Path(__file__).with_name("data") / "seed000_sample.json"
ROOT = Path(__file__).resolve().parent.parent


def _execute(config: Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "dagster", "job", "execute", "-m", "pipelines.definitions", "-j", "reclaim_agendas"]
    return subprocess.run([*cmd, "-c", str(config)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _assert_only_stale_failed(ddb, ids: dict[str, list[str]]) -> None:
    items = items_by_id(ddb)
    for item_id in ids["stale"]:
        item = items[item_id]
        assert (item["processingState"], item["processingStateMessage"]) == ("COMPLETE", "failed"), item
        assert item["attemptsCompleted"] == 1
        assert '"AgendaProgress timed out."' in item["diagnosticEvents"]
    for item_id in ids["fresh"]:
        assert items[item_id]["processingState"] == "EXECUTING"
        assert items[item_id]["diagnosticEvents"] == "[]"
    for item_id in ids["waiting"]:
        assert (items[item_id]["processingState"], items[item_id]["processingStateMessage"]) == ("WAITING", "pending")
    for item_id in ids["complete"]:
        assert items[item_id]["processingStateMessage"] == "succeeded"
        assert items[item_id]["diagnosticEvents"] == "[]"


def test_seed_sample_unchanged_has_a_duplicate_key():
    text = SAMPLE.read_text()
    assert text.count('"maximumExecutionSeconds"') == 2  # the later value (120) wins, as in YAML/JSON loaders


def test_seed_sample_via_cli_direct_dynamodb_writer(aws, tmp_path):
    ddb = aws.client("dynamodb")
    ids = seed_mixed(ddb)
    lines = [line for line in SAMPLE.read_text().splitlines() if "agendaProgressEndpointURL" not in line]
    config = tmp_path / "sample.json"
    config.write_text("\n".join(lines) + "\n")
    env = {k: v for k, v in aws.subprocess_env().items() if k != "AGENDA_PROGRESS_URL"}
    result = _execute(config, env, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "writer DynamoDB" in result.stderr + result.stdout
    _assert_only_stale_failed(ddb, ids)


def test_seed_sample_via_cli_http_endpoint_writer(aws, tmp_path):
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
        }
        result = _execute(config, env, tmp_path)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-6000:]
        assert f"writer HTTP {endpoint.progress_url}" in output
        puts = [path for method, path in endpoint.requests if method == "PUT"]
        assert sorted(p.rsplit("/", 1)[1] for p in puts) == sorted(ids["stale"])
        assert ("POST", "/login") in endpoint.requests
        token_headers = {h for h in endpoint.seen_auth if h.startswith("Bearer ")}
        assert token_headers and all(h[7:] not in output for h in token_headers)
        assert endpoint.password not in output
    _assert_only_stale_failed(ddb, ids)
