"""Alerting: one message per incident, from runs, checks, ticks and queues (docs/alerts.md; the message:
docs/contracts.md, "Alerts"). Plain Python (no Dagster) except ``defs.py``."""
