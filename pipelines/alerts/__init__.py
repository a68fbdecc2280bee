"""Alerting (docs/alerts.md; the message: docs/contracts.md, "Alerts"). Plain Python except ``defs.py``."""
