"""The ``cluster`` profile's Celery executor: a broker or instance database lost while a run is going is
one line (``docs/troubleshooting-cluster.md``). dagster-celery is imported only when it is built."""

import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import unquote, urlsplit

import dagster as dg

from pipelines.common import first_line

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


STORAGE_WAIT_SECONDS = 300.0
"""How long a run whose storage database was lost waits for it to answer again, to record why it failed."""

_STORAGE_ERROR_NAMES = frozenset({"DagsterPostgresException", "OperationalError", "InterfaceError", "DatabaseError"})
SUBMISSION_ERROR = "Encountered error during celery task submission"
_STORAGE_WORDS = ("psycopg2", "postgres", "database", "server closed the connection", "terminating connection")


def _chain(exc: Any, cause: Callable[[Any], Any] = lambda e: e.__cause__ or e.__context__) -> Iterator[Any]:
    """``exc`` and its causes (``cause``: an exception's, or a serialized error's), each once."""
    seen: set[int] = set()
    current = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = cause(current)


def _reason(exc: BaseException) -> str:
    """The most telling message of ``exc`` and its causes: the driver's, not the wrapper's."""
    messages = [first_line(getattr(e, "orig", None) or e, None) for e in _chain(exc)]
    return next((text for text in reversed(messages) if text), type(exc).__name__)


def _without_credentials(text: str, url: str) -> str:
    """``text`` with the URL's user and password masked: a server's error may name them
    (RabbitMQ's ``ACCESS_REFUSED ... for user 'guest'``, PostgreSQL's ``for user "postgres"``)."""
    parts = urlsplit(url)
    for secret in (parts.password, parts.username):
        if secret:
            text = text.replace(unquote(secret), "***")
    return text


def broker_lost_message(broker_url: str, exc: BaseException) -> str:
    """Names the broker as ``scheme://host:port/vhost``: no user, no password, also not in the reason."""
    parts = urlsplit(broker_url)
    where = f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "") + (parts.path or "/")
    return f"the Celery broker {where} was lost: {_without_credentials(_reason(exc), broker_url)}"


def storage_lost_message(database_url: str, reason: str, step_keys: Iterable[str] = ()) -> str:
    """Names the database as ``host:port/dbname`` (SQLAlchemy or libpq URL): no user, no password."""
    parts = urlsplit(database_url)
    port = f":{parts.port}" if parts.port else ""
    steps = sorted(step_keys)
    on = f" (step {', '.join(steps)} on its Celery worker)" if steps else ""
    where = f"{parts.hostname or 'localhost'}{port}/{unquote(parts.path.lstrip('/'))}"
    reason = _without_credentials(first_line(reason, None), database_url)
    return f"the Dagster storage database {where} was lost: {reason}{on}"


def is_broker_error(exc: BaseException) -> bool:
    """A connection or channel error of the broker's transport (kombu, amqp, a socket)."""
    from amqp.exceptions import AMQPError
    from kombu.exceptions import OperationalError

    return any(isinstance(e, OperationalError | AMQPError | ConnectionError) for e in _chain(exc))


def is_storage_error(exc: BaseException) -> bool:
    """An error of the instance's PostgreSQL database (SQLAlchemy, psycopg2, dagster-postgres)."""
    import psycopg2
    import sqlalchemy.exc

    return any(
        isinstance(e, sqlalchemy.exc.DBAPIError | psycopg2.Error)
        or any(cls.__name__ == "DagsterPostgresException" for cls in type(e).__mro__)
        for e in _chain(exc)
    )


def storage_error_info(infos: Iterable[Any]) -> Any:
    """The first serialized error (a worker's) that is the instance database's, or None."""
    for info in infos:
        for current in _chain(info, lambda e: e.cause or e.context):
            name, text = current.cls_name or "", (current.message or "").lower()
            if name == "DagsterPostgresException" or (
                name in _STORAGE_ERROR_NAMES and any(word in text for word in _STORAGE_WORDS)
            ):
                return current
    return None


def _storage_lost(instance: Any, run_id: str, reason: str, step_keys: Iterable[str] = ()) -> str:
    """The line of a lost instance database, once it answers again (so that the run's failure can be
    recorded at all) or ``STORAGE_WAIT_SECONDS`` have passed."""
    deadline = time.monotonic() + STORAGE_WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            instance.get_run_by_id(run_id)
            break
        except Exception:
            time.sleep(2)
    url = getattr(getattr(instance, "run_storage", None), "postgres_url", None) or os.environ.get("DAGSTER_PG_URL", "")
    return storage_lost_message(url, reason, step_keys)


def celery_fan_out_executor() -> dg.ExecutorDefinition:
    """dagster-celery's ``celery`` executor, configured, whose run fails in one line when its broker or
    database is lost: the executor of the jobs that fan out (reclaim's segments, batching, the
    termination drain) under the ``cluster`` deployment."""
    from dagster_celery.executor import CELERY_CONFIG, CeleryExecutor
    from dagster_celery.executor import celery_executor as dagster_celery_executor

    class LossReportingCeleryExecutor(CeleryExecutor):
        def execute(self, plan_context, execution_plan):
            held = None  # dagster-celery's submission error event, multi-line: dropped if the broker was lost
            try:
                for event in super().execute(plan_context, execution_plan):
                    if held is not None:
                        yield held
                        held = None
                    # dagster-celery's engine event logged just before it re-raises an error of apply_async
                    if event.is_engine_event and (event.message or "").startswith(SUBMISSION_ERROR):
                        held = event
                        continue
                    yield event
            except Exception as exc:
                lost = self._lost(plan_context, execution_plan, exc)
                if lost is None:
                    if held is not None:
                        yield held
                    raise
                # a RUN_FAILURE of the line alone (an exception from the executor would carry its stack
                # trace); a run being terminated ends as Dagster ends it
                run = plan_context.instance.get_run_by_id(plan_context.run_id)
                if run is not None and not run.is_finished and run.status != dg.DagsterRunStatus.CANCELING:
                    plan_context.instance.report_run_failed(run, message=lost)
                raise dg.DagsterExecutionInterruptedError(lost) from None
            if held is not None:
                yield held

        def _lost(self, plan_context, execution_plan, exc: Exception) -> str | None:
            instance, run_id = plan_context.instance, plan_context.run_id
            if is_storage_error(exc):
                return _storage_lost(instance, run_id, _reason(exc))
            if is_broker_error(exc):
                return broker_lost_message(self.broker, exc)
            if isinstance(exc, dg.DagsterSubprocessError):
                info = storage_error_info(exc.subprocess_error_infos)
                if info is not None:
                    steps = [k for k in execution_plan.step_keys_to_execute if f"[{k}]:" in str(exc)]
                    reason = info.message.split(f"{info.cls_name}: ", 1)[-1]  # without the module.Class prefix
                    return _storage_lost(instance, run_id, reason, steps)
            return None

    @dg.executor(name="celery", config_schema=CELERY_CONFIG, requirements=dg.multiple_process_executor_requirements())
    def _celery_executor(init_context):
        executor = dagster_celery_executor.executor_creation_fn(init_context)  # dagster-celery's, as configured
        executor.__class__ = LossReportingCeleryExecutor  # the same state; only execute differs
        return executor

    return _celery_executor.configured(celery_executor_config(), name="celery")
