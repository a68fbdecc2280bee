"""Every run-config key of every job has a description (the Launchpad shows it), and the README's
tables list every key with that description."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.definitions import defs

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def _config_fields() -> list[tuple[str, str, str]]:
    """(job, key, description) for the keys a user gives: the flat keys of a job with a config
    mapping, otherwise each op's own config keys."""
    out = []
    for job in defs.resolve_all_job_defs():
        if job.config_mapping is not None:
            fields = job.config_mapping.config_schema.config_type.fields
            out.extend((job.name, key, field.description or "") for key, field in fields.items())
            continue
        for node in job.graph.node_dict.values():
            schema = node.definition.config_schema
            if schema is None or not hasattr(schema.config_type, "fields"):
                continue
            out.extend((job.name, key, f.description or "") for key, f in schema.config_type.fields.items())
    return sorted(set(out))


FIELDS = _config_fields()


def test_there_are_config_keys_to_check():
    assert len(FIELDS) > 20


@pytest.mark.parametrize(("job", "key", "description"), FIELDS, ids=[f"{j}.{k}" for j, k, _ in FIELDS])
def test_every_config_key_has_a_description(job, key, description):
    assert description.strip(), f"{job}: config key {key} has no description"


@pytest.mark.parametrize(("job", "key", "description"), FIELDS, ids=[f"{j}.{k}" for j, k, _ in FIELDS])
def test_the_readme_lists_every_config_key_with_its_description(job, key, description):
    rows = [line for line in README.splitlines() if line.startswith(f"| `{key}` |")]
    assert rows, f"{job}: the README has no table row for config key {key}"
    assert any(description in row for row in rows), f"{job}: no README row for {key} says {description!r}"
