"""Every run-config key of every job has a description (the Launchpad shows it), and the reference
page of the job's capability lists every key with that description in its config table."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.definitions import defs

DOCS = Path(__file__).resolve().parent.parent / "docs"

# The page whose tables document a job's run config: by job name, or, for Dagster's asset jobs
# (``__ASSET_JOB``...), which carry the config of several assets, by the asset's op name.
PAGES = {
    "reclaim_agendas": "reclaim.md",
    "retry_demo": "retry.md",
    "retry_policies": "retry.md",
    "process_termination_queue": "fleet.md",
    "process_housekeeping_queue": "fleet.md",
    "housekeeping": "fleet.md",
    "redrive_dead_letters": "fleet.md",
    "pool_audit_job": "fleet.md",
    "pool_audit": "fleet.md",
    "pool_cost_report_job": "fleet.md",
    "pool_cost_report": "fleet.md",
    "receiver_batches_job": "batching.md",
    "receiver_batches": "batching.md",
    "redrive_failed_partitions": "batching.md",
    "import_receiver_settings": "batching.md",
    "batch_minute_job": "batching.md",
    "collect_zombies": "progressor.md",
    "demo_traffic": "operator-guide.md",
    "close_incident": "alerts.md",
}


def _config_fields() -> list[tuple[str, str, str, str]]:
    """(job, node, key, description) for the keys a user gives: the flat keys of a job with a
    config mapping (node = the job), otherwise each op's own config keys."""
    out = []
    for job in defs.resolve_all_job_defs():
        if job.config_mapping is not None:
            fields = job.config_mapping.config_schema.config_type.fields
            out.extend((job.name, job.name, key, field.description or "") for key, field in fields.items())
            continue
        for name, node in job.graph.node_dict.items():
            schema = node.definition.config_schema
            if schema is None or not hasattr(schema.config_type, "fields"):
                continue
            out.extend((job.name, name, key, f.description or "") for key, f in schema.config_type.fields.items())
    return sorted(set(out))


FIELDS = _config_fields()
IDS = [f"{job}.{node}.{key}" if node != job else f"{job}.{key}" for job, node, key, _ in FIELDS]


def page_for(job: str, node: str) -> str | None:
    """The reference page of a job's config: the job's own entry, else (an asset job) its op's."""
    return PAGES.get(job) or (PAGES.get(node) if job.startswith("__") else None)


def test_there_are_config_keys_to_check():
    assert len(FIELDS) > 20


@pytest.mark.parametrize(("job", "node", "key", "description"), FIELDS, ids=IDS)
def test_every_config_key_has_a_description(job, node, key, description):
    assert description.strip(), f"{job}: config key {key} has no description"


@pytest.mark.parametrize(("job", "node", "key", "description"), FIELDS, ids=IDS)
def test_the_capability_page_lists_every_config_key_with_its_description(job, node, key, description):
    page = page_for(job, node)
    assert page, f"{job} ({node}): no reference page for its config: add it to PAGES in {Path(__file__).name}"
    text = (DOCS / page).read_text()
    rows = [line for line in text.splitlines() if line.startswith(f"| `{key}` |")]
    assert rows, f"{job}: docs/{page} has no table row for config key {key}"
    assert any(description in row for row in rows), f"{job}: no row of docs/{page} for {key} says {description!r}"


def test_every_page_named_exists():
    assert not [page for page in set(PAGES.values()) if not (DOCS / page).is_file()]
