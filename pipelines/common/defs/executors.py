"""The Celery executor of the jobs that fan out (reclaim's segments, batching, the termination
drain) under the ``cluster`` deployment: :func:`celery_fan_out_executor`. ``pipelines/definitions.py``
picks it for that deployment and passes it (or None: each capability's own choice) to each
capability's job factory."""

from __future__ import annotations

from typing import Any

import dagster as dg

CELERY_BROKER_ENV = "CELERY_BROKER_URL"
"""The broker of the ``cluster`` deployment (RabbitMQ: ``pyamqp://user:pass@host:5672/vhost``)."""


CELERY_BACKEND = "rpc://"
"""Results come back over the broker itself: no second service to run."""


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
"""Celery settings shared by the executor (run side) and the workers (``infra/cluster.py`` writes
them into the workers' config file), so both sides agree."""


def celery_executor_config(broker: Any = None) -> dict[str, Any]:
    """The celery executor's config: the broker (default: the ``CELERY_BROKER_URL`` variable), the
    rpc result backend and :data:`CELERY_SETTINGS`. Also what the workers' config file holds."""
    return {
        "broker": broker if broker is not None else {"env": CELERY_BROKER_ENV},
        "backend": CELERY_BACKEND,
        "config_source": CELERY_SETTINGS,
    }


def celery_fan_out_executor() -> dg.ExecutorDefinition:
    """The executor of the jobs that fan out under ``cluster``: dagster-celery's executor (imported
    only when this is called), on the broker named by ``CELERY_BROKER_URL``; every step is a Celery
    task that any worker of the cluster may take. A broker or instance database lost while a run is
    going fails it with one line (``resources.cluster``)."""
    from resources.cluster import celery_executor

    return celery_executor().configured(celery_executor_config(), name="celery")
