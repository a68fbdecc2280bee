"""Progressor's PostgreSQL schema for one namespace: the state after progressor's four migrations. No Dagster.
Identifiers are quoted (``sql.Identifier``); values enter statements as ``sql.Literal`` (:meth:`Tables.sql`), never
as ``%s`` parameters, which psycopg2 would %-format into quoted names too (a namespace ``pct%s``)."""

import re
from dataclasses import dataclass

from psycopg2 import sql

from pipelines.common.params import ParamsError

SUFFIXES = ("processes", "tasks", "schedule", "running", "events")
MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: longer names are silently truncated
TASK_STATUSES = ("waiting", "running", "blocked", "error", "finished", "cancelled")
TIMER_TYPES = ("timeout", "remove")
_PERCENT_PLACEHOLDER = re.compile(r"%[s(]")


class NamespaceError(ParamsError):
    """The namespace parameter cannot be used (bad name, or its tables are missing)."""


def check_namespace(namespace: object) -> str:
    """The namespace id if progressor's quoted table names can be built from it, else NamespaceError."""
    if not isinstance(namespace, str) or not namespace:
        raise NamespaceError(f"namespace must be a non-empty string, got {namespace!r}")
    if '"' in namespace:
        raise NamespaceError(
            f"namespace {namespace!r} contains a double quote: its table names would need escaping, not just quoting"
        )
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in namespace):
        raise NamespaceError(f"namespace {namespace!r} contains a control character")
    longest = max(len(f"{namespace}_{suffix}".encode()) for suffix in SUFFIXES)
    if longest > MAX_IDENTIFIER_BYTES:
        raise NamespaceError(
            f"namespace {namespace!r} is too long: its table names would be {longest} bytes, "
            f"PostgreSQL truncates identifiers at {MAX_IDENTIFIER_BYTES}"
        )
    return namespace


@dataclass(frozen=True)
class Tables:
    """The five quoted table identifiers of one namespace."""

    namespace: str

    def name(self, suffix: str) -> str:
        return f"{self.namespace}_{suffix}"

    def ident(self, suffix: str) -> sql.Identifier:
        return sql.Identifier(self.name(suffix))

    def sql(self, template: str, *values: object, **extra: sql.Composable) -> sql.Composed:
        """``template`` with ``{processes}``, ``{tasks}``... as the quoted identifiers and each ``{}`` as the next
        of ``values``; execute it without parameters (a ``%s`` or ``%(name)s`` placeholder is refused)."""
        if _PERCENT_PLACEHOLDER.search(template):
            raise ValueError(f"statement template with a %-placeholder: pass values as {{}}, got {template!r}")
        return sql.SQL(template).format(
            *(v if isinstance(v, sql.Composable) else sql.Literal(v) for v in values),
            **{suffix: self.ident(suffix) for suffix in SUFFIXES},
            **extra,
        )


def tables_for(namespace: str) -> Tables:
    return Tables(check_namespace(namespace))


def require_tables(cur, tables: Tables) -> None:
    """NamespaceError unless the namespace's tables all exist (visible in the search path)."""
    names = [tables.name(s) for s in SUFFIXES]
    cur.execute(
        "SELECT relname FROM pg_class WHERE relname = ANY(%s) AND relkind IN ('r', 'p') AND pg_table_is_visible(oid)",
        (names,),
    )
    found = {row[0] for row in cur.fetchall()}
    missing = [name for name in names if name not in found]
    if len(missing) == len(SUFFIXES):
        raise NamespaceError(f"namespace {tables.namespace!r} has no progressor tables in this database")
    if missing:
        raise NamespaceError(f"namespace {tables.namespace!r} is missing the tables {', '.join(missing)}")


def process_columns(cur, tables: Tables) -> set[str]:
    """Column names of the processes table (migration 2 adds previous_status, status_changed_at)."""
    cur.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
        (tables.ident("processes").as_string(cur),),
    )
    return {row[0] for row in cur.fetchall()}
