"""The ready configs under ``docs/examples/`` run the reclaim job: the demo one reclaims make dev's stuck
agendas (non-zero counts); POP's sample (its duplicate key removed) writes through the local
AgendaProgress endpoint that make dev starts."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path

import dagster as dg
import pytest
import yaml

from infra.agenda_endpoint import LocalAgendaEndpoint
from infra.demo.reclaim import AgendaTraffic, agenda_traffic
from tests.reclaim_support import PROGRESS_TABLE, items_by_id, seed_mixed

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"
LOCAL_ENDPOINT = "http://127.0.0.1:5056/progress"  # make dev's default AGENDA_ENDPOINT_PORT


def _reclaim(run_config: dict) -> dg.ExecuteInProcessResult:
    from pipelines.definitions import build_definitions

    job = build_definitions("local").resolve_job_def("reclaim_agendas")
    return job.execute_in_process(run_config=run_config, instance=dg.DagsterInstance.ephemeral())


@pytest.mark.slow
def test_the_demo_example_reclaims_the_stuck_demo_agendas(aws):
    ddb = aws.client("dynamodb")
    traffic = AgendaTraffic(new_agendas=3, stuck_agendas=4)
    made = agenda_traffic(ddb, PROGRESS_TABLE, traffic, random.Random(7), dt.datetime.now(dt.UTC))
    assert made["agendas_stuck"] == 4
    config = yaml.safe_load((EXAMPLES / "reclaim_demo.yaml").read_text())
    result = _reclaim(config)
    summary = result.output_for_node("report_reclaim")
    assert summary["table"] == PROGRESS_TABLE
    assert summary["reclaimed"] >= 4
    assert summary["matched"] >= 4
    failed = [i for i in items_by_id(ddb).values() if i.get("processingStateMessage") == "failed"]
    assert len(failed) == summary["reclaimed"]


@pytest.mark.slow
def test_pop_sample_example_has_no_duplicate_key_and_writes_through_the_local_endpoint(aws, monkeypatch):
    text = (EXAMPLES / "pop_reclaim_sample.json").read_text()
    pairs = json.loads(text, object_pairs_hook=lambda kv: kv)
    assert len(pairs) == len({k for k, _ in pairs})  # the UI's YAML editor refuses duplicate keys
    sample = dict(pairs)
    assert sample["agendaProgressEndpointURL"] == LOCAL_ENDPOINT
    assert sample["tableName"] == PROGRESS_TABLE
    ddb = aws.client("dynamodb")
    ids = seed_mixed(ddb)  # stale items are 4 days old: past the sample's 4320 minutes
    with LocalAgendaEndpoint(ddb, PROGRESS_TABLE) as endpoint:
        for name, value in endpoint.deployment_env(aws.client("kms")).items():
            monkeypatch.setenv(name, value)  # as make dev writes them to .groundskeeper/local.env
        result = _reclaim({**sample, "agendaProgressEndpointURL": endpoint.progress_url})  # its port here
        assert result.output_for_node("report_reclaim")["reclaimed"] == len(ids["stale"])
        puts = sorted(path.rsplit("/", 1)[1] for method, path in endpoint.requests if method == "PUT")
        assert puts == sorted(ids["stale"])
        assert ("POST", "/login") in endpoint.requests
