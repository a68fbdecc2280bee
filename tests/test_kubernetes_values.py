"""docs/deployment.md's Helm values for Kubernetes hold the run queue and run monitoring of infra/dagster.prod.yaml,
in the chart's names: the chart writes the instance configuration itself, so nothing else carries them there."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PROD = yaml.safe_load((ROOT / "infra" / "dagster.prod.yaml").read_text())


def helm_values() -> dict:
    """The first YAML block of the page's Kubernetes section."""
    section = (ROOT / "docs" / "deployment.md").read_text().split("## Kubernetes", 1)[1]
    return yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))


def test_the_helm_values_queue_runs_as_the_prod_instance():
    queued = helm_values()["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert queued["tagConcurrencyLimits"] == PROD["concurrency"]["runs"]["tag_concurrency_limits"]
    assert queued["maxConcurrentRuns"] == PROD["concurrency"]["runs"]["max_concurrent_runs"]


def test_the_helm_values_monitor_runs_as_the_prod_instance():
    monitoring = helm_values()["dagsterDaemon"]["runMonitoring"]
    as_instance = {re.sub(r"[A-Z]", lambda c: "_" + c.group().lower(), key): v for key, v in monitoring.items()}
    assert as_instance == PROD["run_monitoring"]
