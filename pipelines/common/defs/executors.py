"""The Celery executor of the jobs that fan out (reclaim's segments, batching, the termination drain)
under the ``cluster`` deployment: :func:`celery_fan_out_executor`."""

from __future__ import annotations

from typing import Any

import dagster as dg

CELERY_BROKER_ENV = "CELERY_BROKER_URL"  # the cluster's RabbitMQ: pyamqp://user:pass@host:5672/vhost

CELERY_SETTINGS: dict[str, Any] = {
    # A step's task is acknowledged when it ends, not when a worker takes it: a worker killed
    # mid-step leaves it unacknowledged, and the broker hands it to another worker (the step
    # runs again there; every write is conditional, so what the dead worker did is not redone).
    "task_acks_late": True,
    "task_reject_on_worker_lost": True,
    # One task at a time per worker process: a long segment never holds a second one hostage.
    "worker_prefetch_multiplier": 1,
    # Broker unreachable: give up after a few quick retries instead of hanging the run.
    "broker_connection_timeout": 10,
    "broker_transport_options": {"max_retries": 3, "interval_start": 0, "interval_step": 0.5, "interval_max": 2},
}
"""Shared by the executor and the workers (``infra/cluster.py`` writes them in their config)."""


def celery_executor_config(broker: Any = None) -> dict[str, Any]:
    """The celery executor's config, also the workers': the broker (default: ``CELERY_BROKER_URL``),
    results back over the broker itself (``rpc://``: no second service to run), :data:`CELERY_SETTINGS`."""
    broker = {"env": CELERY_BROKER_ENV} if broker is None else broker
    return {"broker": broker, "backend": "rpc://", "config_source": CELERY_SETTINGS}


def celery_fan_out_executor() -> dg.ExecutorDefinition:
    """``resources.cluster``'s Celery executor (imported only when called), configured."""
    from resources.cluster import celery_executor

    return celery_executor().configured(celery_executor_config(), name="celery")
