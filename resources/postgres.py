"""The progressor database: a libpq URL from ``PROGRESSOR_DSN``, connections through psycopg2.

psycopg2 comes with dagster-postgres already; psycopg 3 is deliberately not installed (with SQLAlchemy
2.1 it would change what a bare ``postgresql://`` means to dagster-postgres, see ``infra/dagster.prod.yaml``).
An unreachable database fails with one line that names the host, port and database (never the password).

Nothing waits on the database for ever: the connection is bounded (``connect_timeout``), every statement
(``statement_timeout``) and every lock wait (``lock_timeout``) of the session is, and TCP keepalives with
``tcp_user_timeout`` notice a server or network that went silent. A statement cancelled by these, or a
connection lost under a statement, fails with one line naming the database and the server's own reason
(:meth:`ProgressorDatabase.connection`).
"""

from __future__ import annotations

import contextlib
import os

import dagster as dg
import psycopg2
import psycopg2.errors
import psycopg2.extensions
from pydantic import Field

from pipelines.common import first_line

KEEPALIVES = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3}
"""A silent peer is noticed within about a minute (30 s idle, then 3 probes 10 s apart)."""
TCP_USER_TIMEOUT_MS = 60_000  # data sent and not acknowledged for a minute: the connection is lost


class ProgressorDatabaseError(ConnectionError):
    """The progressor database cannot be reached, or failed a statement on its side; one line."""


def describe_dsn(dsn: str) -> str:
    """``host:port/dbname`` of a libpq URL or key=value string, without credentials."""
    try:
        parts = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        return "an unparsable DSN"
    host = parts.get("host") or "localhost"
    return f"{host}:{parts.get('port') or 5432}/{parts.get('dbname') or parts.get('user') or ''}"


def _options(dsn: str, statement_timeout: int, lock_timeout: int) -> str:
    """The session's bounds, then whatever ``options`` the DSN gives (which win where they overlap)."""
    ours = f"-c statement_timeout={statement_timeout}s -c lock_timeout={lock_timeout}s"
    try:
        theirs = psycopg2.extensions.parse_dsn(dsn).get("options", "")
    except psycopg2.ProgrammingError:
        theirs = ""
    return f"{ours} {theirs}".strip()


def reason(exc: psycopg2.Error) -> str:
    """The server's message (without the statement it quotes), or libpq's lines without its indented hints."""
    if exc.pgcode and exc.diag.message_primary:
        return exc.diag.message_primary
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and not line[:1].isspace()]
    return "; ".join(lines) or type(exc).__name__


def connect(
    dsn: str,
    *,
    connect_timeout: int = 10,
    statement_timeout: int = 60,
    lock_timeout: int = 10,
    application_name: str = "groundskeeper",
):
    """A connection whose statements and lock waits are bounded (seconds), with TCP keepalives."""
    try:
        return psycopg2.connect(
            dsn,
            connect_timeout=connect_timeout,
            application_name=application_name,
            options=_options(dsn, statement_timeout, lock_timeout),
            tcp_user_timeout=TCP_USER_TIMEOUT_MS,
            **KEEPALIVES,
        )
    except psycopg2.OperationalError as exc:
        text = (str(exc).strip().splitlines() or ["unknown error"])[-1].strip()
        if text.startswith("Is the server running"):
            text = first_line(exc, None)
        raise ProgressorDatabaseError(
            f"cannot reach the progressor database at {describe_dsn(dsn)} (PROGRESSOR_DSN): {text}"
        ) from None


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


class ProgressorDatabase(dg.ConfigurableResource):
    """Progressor's PostgreSQL database and the CloudWatch namespace of its metrics."""

    dsn: str = Field(description="libpq URL of the progressor database (PROGRESSOR_DSN).")
    metrics_namespace: str = Field(
        default="RunsFleet",
        description="CloudWatch namespace of the Progressor* metrics (RUNS_FLEET_METRICS_NAMESPACE).",
    )
    connect_timeout: int = Field(default=10, description="Seconds to wait for a connection (1 to 300).")
    statement_timeout: int = Field(
        default=60, description="Seconds any one statement may take before the server cancels it (1 to 3600)."
    )
    lock_timeout: int = Field(
        default=10,
        description="Seconds a statement may wait for a lock before the server cancels it (1 to 3600); the "
        "collector's batches use their own, shorter lock_timeout_ms.",
    )

    @contextlib.contextmanager
    def connection(self):
        """A bounded connection (see the module). A database error that ends the block (a statement
        cancelled by a timeout, the connection lost) becomes one :class:`ProgressorDatabaseError` line."""
        statement_timeout = _clamp(self.statement_timeout, 1, 3600)
        conn = connect(
            self.dsn,
            connect_timeout=_clamp(self.connect_timeout, 1, 300),
            statement_timeout=statement_timeout,
            lock_timeout=_clamp(self.lock_timeout, 1, 3600),
        )
        try:
            yield conn
        except psycopg2.OperationalError as exc:
            raise ProgressorDatabaseError(self._failure(exc, statement_timeout, lost=bool(conn.closed))) from None
        finally:
            conn.close()

    def _failure(self, exc: psycopg2.OperationalError, statement_timeout: int, *, lost: bool) -> str:
        where = f"the progressor database at {describe_dsn(self.dsn)} (PROGRESSOR_DSN)"
        if lost:
            return f"lost {where}: {reason(exc)}"
        if isinstance(exc, psycopg2.errors.QueryCanceled):
            return f"a statement on {where} was cancelled: {reason(exc)} (statement_timeout {statement_timeout}s)"
        return f"a statement on {where} failed: {reason(exc)}"


def progressor_database_from_env() -> ProgressorDatabase:
    return ProgressorDatabase(
        dsn=dg.EnvVar("PROGRESSOR_DSN"),
        metrics_namespace=os.environ.get("RUNS_FLEET_METRICS_NAMESPACE") or "RunsFleet",
    )
