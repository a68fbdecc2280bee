"""Databases for the progressor tests on the local PostgreSQL (127.0.0.1:5432), created and dropped here."""

from __future__ import annotations

import contextlib
import logging
import os
import uuid

import psycopg2

PG = {"host": "127.0.0.1", "port": 5432, "user": os.environ.get("PGUSER", "postgres")}


def admin_connection():
    conn = psycopg2.connect(dbname="postgres", connect_timeout=10, **PG)
    conn.autocommit = True
    return conn


@contextlib.contextmanager
def scratch_database(prefix: str = "gk_progressor"):
    """A new database (unique per call, so per xdist worker too); yields its libpq URL; dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = admin_connection()
    try:
        with admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        yield f"postgresql://{PG['user']}@{PG['host']}:{PG['port']}/{name}"
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def unique_namespace(label: str) -> str:
    return f"{label}/{uuid.uuid4().hex[:8]}"


class ListLog:
    """A ``log`` for the collector that keeps its lines."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self._logger = logging.getLogger("tests.progressor")

    def info(self, message: str) -> None:
        self.lines.append(("info", message))

    def warning(self, message: str) -> None:
        self.lines.append(("warning", message))

    def text(self, level: str | None = None) -> str:
        return "\n".join(m for lvl, m in self.lines if level in (None, lvl))
