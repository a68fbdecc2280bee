"""Alerting: one message per incident, from runs, checks, ticks and queues. Plain Python (no Dagster)
except ``defs.py``.

- ``incidents``: :class:`Signal` (an observation), :class:`AlertBook` (incidents, per-sink outboxes,
  delivery by the retry library's policy, at most ``ALERTS_MAX_PER_TICK`` per tick);
- ``sources``: what runs, check evaluations, ticks and the capabilities' measures mean as signals;
- ``sinks``: SNS (``ALERTS_SNS_TOPIC_ARN``) and a Slack-compatible webhook (``ALERTS_WEBHOOK_URL``);
- ``config``: the ``ALERTS_*`` settings, checked at each tick;
- ``heartbeat``: the ``AlertsHeartbeat`` metric the template's alarm watches;
- ``defs``: the ``alerts`` sensor and the ``alerts/incidents`` asset.

The message is in ``docs/contracts.md`` ("Alerts"); each kind has a runbook in ``docs/runbooks/``.
"""
