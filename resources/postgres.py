"""The progressor database: a libpq URL from ``PROGRESSOR_DSN``, connections through psycopg2.

psycopg2 comes with dagster-postgres already; psycopg 3 is deliberately not installed (with SQLAlchemy
2.1 it would change what a bare ``postgresql://`` means to dagster-postgres, see ``infra/dagster.prod.yaml``).
An unreachable database fails with one line that names the host, port and database (never the password).
"""

from __future__ import annotations

import contextlib
import os

import dagster as dg
import psycopg2
import psycopg2.extensions
from pydantic import Field

from pipelines.common import first_line


class ProgressorDatabaseError(ConnectionError):
    """The progressor database cannot be reached; one line."""


def describe_dsn(dsn: str) -> str:
    """``host:port/dbname`` of a libpq URL or key=value string, without credentials."""
    try:
        parts = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        return "an unparsable DSN"
    host = parts.get("host") or "localhost"
    return f"{host}:{parts.get('port') or 5432}/{parts.get('dbname') or parts.get('user') or ''}"


def connect(dsn: str, *, connect_timeout: int = 10, application_name: str = "groundskeeper"):
    try:
        return psycopg2.connect(dsn, connect_timeout=connect_timeout, application_name=application_name)
    except psycopg2.OperationalError as exc:
        reason = (str(exc).strip().splitlines() or ["unknown error"])[-1].strip()
        if reason.startswith("Is the server running"):
            reason = first_line(exc, None)
        raise ProgressorDatabaseError(
            f"cannot reach the progressor database at {describe_dsn(dsn)} (PROGRESSOR_DSN): {reason}"
        ) from None


class ProgressorDatabase(dg.ConfigurableResource):
    """Progressor's PostgreSQL database and the CloudWatch namespace of its metrics."""

    dsn: str = Field(description="libpq URL of the progressor database (PROGRESSOR_DSN).")
    metrics_namespace: str = Field(
        default="RunsFleet",
        description="CloudWatch namespace of the Progressor* metrics (RUNS_FLEET_METRICS_NAMESPACE).",
    )
    connect_timeout: int = Field(default=10, description="Seconds to wait for a connection (1 to 300).")

    @contextlib.contextmanager
    def connection(self):
        conn = connect(self.dsn, connect_timeout=max(1, min(300, self.connect_timeout)))
        try:
            yield conn
        finally:
            conn.close()


def progressor_database_from_env() -> ProgressorDatabase:
    return ProgressorDatabase(
        dsn=dg.EnvVar("PROGRESSOR_DSN"),
        metrics_namespace=os.environ.get("RUNS_FLEET_METRICS_NAMESPACE") or "RunsFleet",
    )
