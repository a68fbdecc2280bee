"""The progressor database (``PROGRESSOR_DSN``) through psycopg2 (not psycopg 3: see
``infra/dagster.prod.yaml``), bounded everywhere; each failure is one line, never the password."""

import contextlib
import os
import re

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


def _user_info_spills(rest: str) -> bool:
    """A URL's user-info (``rest``: after ``scheme://``) runs into what libpq reads as its host, port or
    database: libpq ends it at the first '@', unless a '/' comes first (then there is none), so a further '@'
    before the path (or, after a '/', before the query) is a password's unencoded '@' or '/'."""
    end = re.search(r"[@/]", rest)
    if end is None:
        return False
    after = rest[end.end() :]
    return "@" in re.split(r"[/?]" if end.group() == "@" else r"\?", after, maxsplit=1)[0]


def _where(dsn: str) -> tuple[str, str]:
    """``host:port/dbname`` of a libpq URL or key=value string (without credentials), and its ``options``;
    ProgressorDatabaseError when the host or port holds a part of the user-info."""
    try:
        parts = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError:
        return "an unparsable DSN", ""
    scheme, _, rest = dsn.partition("://")
    if scheme.lower() in ("postgres", "postgresql") and _user_info_spills(rest):
        raise ProgressorDatabaseError(
            "cannot reach the progressor database (PROGRESSOR_DSN): its password (or user name) holds an unencoded "
            "'@' or '/', percent-encode it (%40, %2F; its value is not shown)"
        )
    where = f"{parts.get('host') or 'localhost'}:{parts.get('port') or 5432}/"
    return where + (parts.get("dbname") or parts.get("user") or ""), parts.get("options", "")


def reason(exc: psycopg2.Error) -> str:
    """The server's message (without the statement it quotes), or libpq's lines without its indented hints."""
    if exc.pgcode and exc.diag.message_primary:
        return exc.diag.message_primary
    lines = [line.strip() for line in str(exc).splitlines() if line.strip() and not line[:1].isspace()]
    return "; ".join(lines) or type(exc).__name__


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
        """A bounded connection; a database error that ends the block is one ``ProgressorDatabaseError`` line."""
        statement_timeout = _clamp(self.statement_timeout, 1, 3600)
        # The session's bounds, then whatever options the DSN gives (which win where they overlap).
        bounds = f"-c statement_timeout={statement_timeout}s -c lock_timeout={_clamp(self.lock_timeout, 1, 3600)}s"
        where, options = _where(self.dsn)
        where = f"the progressor database at {where} (PROGRESSOR_DSN)"
        try:
            conn = psycopg2.connect(
                self.dsn,
                connect_timeout=_clamp(self.connect_timeout, 1, 300),
                application_name="groundskeeper",
                options=f"{bounds} {options}".strip(),
                tcp_user_timeout=TCP_USER_TIMEOUT_MS,
                **KEEPALIVES,
            )
        except psycopg2.OperationalError as exc:
            text = (str(exc).strip().splitlines() or ["unknown error"])[-1].strip()
            if text.startswith("Is the server running"):
                text = first_line(exc, None)
            raise ProgressorDatabaseError(f"cannot reach {where}: {text}") from None
        except psycopg2.Error:  # libpq's "invalid dsn: ..." quotes the DSN, password and all
            text = "not a valid connection string (its value is not shown)"
            raise ProgressorDatabaseError(f"cannot reach {where}: {text}") from None
        try:
            yield conn
        except psycopg2.OperationalError as exc:
            if conn.closed:
                line = f"lost {where}: {reason(exc)}"
            elif isinstance(exc, psycopg2.errors.QueryCanceled):
                line = f"a statement on {where} was cancelled: {reason(exc)} (statement_timeout {statement_timeout}s)"
            else:
                line = f"a statement on {where} failed: {reason(exc)}"
            raise ProgressorDatabaseError(line) from None
        finally:
            conn.close()


def progressor_database_from_env() -> ProgressorDatabase:
    return ProgressorDatabase(
        dsn=dg.EnvVar("PROGRESSOR_DSN"),
        metrics_namespace=os.environ.get("RUNS_FLEET_METRICS_NAMESPACE") or "RunsFleet",
    )
