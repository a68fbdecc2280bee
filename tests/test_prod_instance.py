"""The production instance configuration (infra/dagster.prod.yaml, dagster-postgres) works.

Uses the PostgreSQL server on 127.0.0.1:5432: a fresh database per test process, dropped after.
"""

import os
import shutil
import uuid
from pathlib import Path

import dagster as dg
import psycopg2
import pytest

from infra.demo.definitions import build_local_definitions
from pipelines.definitions import ROOT_DIR

pytestmark = pytest.mark.postgres

PG = {"host": "127.0.0.1", "port": 5432, "user": os.environ.get("PGUSER", "postgres")}


@pytest.fixture
def prod_instance(tmp_path, monkeypatch):
    db_name = f"groundskeeper_test_{uuid.uuid4().hex[:10]}"
    admin = psycopg2.connect(dbname="postgres", **PG)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{db_name}"')
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT_DIR / "infra" / "dagster.prod.yaml", home / "dagster.yaml")
    for key, value in {
        "DAGSTER_PG_HOST": PG["host"],
        "DAGSTER_PG_PORT": str(PG["port"]),
        "DAGSTER_PG_DB": db_name,
        "DAGSTER_PG_USER": PG["user"],
        "DAGSTER_PG_PASSWORD": "",
    }.items():
        monkeypatch.setenv(key, value)
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        yield instance
    finally:
        instance.dispose()
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
        admin.close()


@pytest.mark.slow
def test_prod_instance_uses_postgres_and_records_runs(aws, prod_instance: dg.DagsterInstance):
    assert type(prod_instance.run_storage).__name__ == "PostgresRunStorage"
    assert type(prod_instance.event_log_storage).__name__ == "PostgresEventLogStorage"
    assert type(prod_instance.schedule_storage).__name__ == "PostgresScheduleStorage"
    assert prod_instance.run_retries_enabled
    assert not prod_instance.run_retries_retry_on_asset_or_op_failure
    result = (
        build_local_definitions()
        .resolve_job_def("demo_traffic")
        .execute_in_process(
            run_config={"ops": {"demo_traffic_step": {"config": {"seed": 5, "records": 3}}}}, instance=prod_instance
        )
    )
    stored = prod_instance.get_run_by_id(result.run_id)
    assert stored is not None
    assert stored.status == dg.DagsterRunStatus.SUCCESS


def test_prod_yaml_and_local_yaml_agree_on_retries_and_concurrency():
    import yaml

    local = yaml.safe_load((ROOT_DIR / "dagster.yaml").read_text())
    prod = yaml.safe_load((Path(ROOT_DIR) / "infra" / "dagster.prod.yaml").read_text())
    assert local["run_retries"] == prod["run_retries"]
    assert (
        local["concurrency"]["runs"]["tag_concurrency_limits"] == prod["concurrency"]["runs"]["tag_concurrency_limits"]
    )


INSTANCE_FILES = [
    "dagster.yaml",
    *sorted(str(p.relative_to(ROOT_DIR)) for p in (ROOT_DIR / "infra").glob("dagster.*.yaml")),
]


def _run_monitoring(path: str) -> dict:
    import yaml

    return yaml.safe_load((ROOT_DIR / path).read_text())["run_monitoring"]


CLUSTER_MAX_RUNTIME = _run_monitoring("infra/dagster.cluster.yaml")["max_runtime_seconds"]


@pytest.mark.parametrize("path", INSTANCE_FILES)
def test_every_instance_cancels_a_hung_run_after_the_clusters_max_runtime(path):
    """Dagster's default (0) is no limit: a hung run would hold its one_at_a_time slot (its schedule skipping)
    forever."""
    assert _run_monitoring(path).get("max_runtime_seconds") == CLUSTER_MAX_RUNTIME


def test_the_prod_instance_reads_its_max_runtime(prod_instance: dg.DagsterInstance):
    assert prod_instance.run_monitoring_max_runtime_seconds == CLUSTER_MAX_RUNTIME


def test_the_local_instance_reads_its_max_runtime(tmp_path):
    shutil.copy(ROOT_DIR / "dagster.yaml", tmp_path / "dagster.yaml")
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    try:
        assert instance.run_monitoring_max_runtime_seconds == CLUSTER_MAX_RUNTIME
    finally:
        instance.dispose()
