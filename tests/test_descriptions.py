"""Every job, asset, asset check, schedule and sensor says what it is for: the UI shows the
description beside each, and an operator reads it before launching anything."""

import pytest

from pipelines.definitions import build_definitions


def _undescribed(deployment: str) -> list[str]:
    defs = build_definitions(deployment)
    repo = defs.get_repository_def()
    graph = defs.resolve_asset_graph()
    named = [
        # Dagster's own jobs (``__ASSET_JOB``, a sensor's ``__anonymous_asset_job_...``) are hidden in the UI
        *((f"job {j.name}", j.description) for j in repo.get_all_jobs() if not j.name.startswith("__")),
        *((f"asset {k.to_user_string()}", graph.get(k).description) for k in graph.get_all_asset_keys()),
        *((f"check {k.to_user_string()}", graph.get(k).description) for k in graph.asset_check_keys),
        *((f"schedule {s.name}", s.description) for s in repo.schedule_defs),
        *((f"sensor {s.name}", s.description) for s in repo.sensor_defs),
    ]
    assert len(named) > 30  # the iteration found the definitions
    return sorted(name for name, description in named if not (description or "").strip())


@pytest.mark.parametrize("deployment", ["local", "prod", "cluster"])
def test_every_definition_has_a_description(deployment):
    assert _undescribed(deployment) == []
