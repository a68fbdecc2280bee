"""The alerting tests' webhook receiver: ``infra.alerts_receiver`` (the one ``make dev`` runs) on a
free port, under a path like a chat webhook's, whose last segment is its secret."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from infra.alerts_receiver import LocalAlertsReceiver


@contextmanager
def webhook_receiver(path: str = "/services/T000/B000/secret-token") -> Iterator[LocalAlertsReceiver]:
    with LocalAlertsReceiver(path=path) as receiver:
        yield receiver


_TICK = """
import json, sys
import dagster as dg
from pipelines.alerts.defs import build_alerts_sensor
from resources import CloudWatchResource, SNSResource, SQSResource
from resources.settings import AlertSettings, fleet_settings_from_env
res = {"alerts": AlertSettings(**json.loads(sys.argv[2])), "fleet": fleet_settings_from_env(),
       "sns": SNSResource(region_name="us-east-1"), "sqs": SQSResource(region_name="us-east-1"),
       "cloudwatch": CloudWatchResource(region_name="us-east-1")}
with dg.instance_for_test(temp_dir=sys.argv[1]) as instance:
    with dg.build_sensor_context(instance=instance, resources=res) as context:
        print(build_alerts_sensor().evaluate_tick(context).skip_message)
"""


def tick_in_a_new_process(instance_dir: str, settings: dict, env: dict[str, str]) -> str:
    """One evaluation of the alerts sensor in a new Python process over the instance stored in
    ``instance_dir``, as a restarted daemon's; returns its skip reason."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import PATIENCE

    done = subprocess.run(
        [sys.executable, "-c", _TICK, instance_dir, json.dumps(settings)],
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]
