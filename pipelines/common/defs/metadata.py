"""Results as UI metadata: :func:`metadata_from` (a result dict) and :func:`table_from` (rows as a
table); money (``*_usd``, ``*_usd_per_hour``) rounded to cents, percentages (``*_pct``) to one
decimal and durations (``seconds``, ``*_seconds``) to 0.1 s (:func:`rounded`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg


def rounded(key: str, value: Any) -> Any:
    """Money to cents, percentages to one decimal, seconds to 0.1 s (under a second, two significant
    digits: 0.035, not 0.0), by the key's suffix; NaN as None."""
    if isinstance(value, bool) or not isinstance(value, float):
        return value
    if math.isnan(value):
        return None
    if key.endswith(("_usd", "_usd_per_hour")):
        return round(value, 2)
    if key.endswith("_pct"):
        return round(value, 1)
    if key == "seconds" or key.endswith("_seconds"):
        return round(value, 1) if abs(value) >= 1 else float(f"{value:.2g}")
    return value


def metadata_from(values: Mapping[str, Any]) -> dict[str, Any]:
    """A result as UI metadata: numbers and flags as such (money and percentages rounded, see
    :func:`rounded`), text as text, the rest as JSON. Empty values are left out."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, bool):
            out[key] = dg.MetadataValue.bool(value)
        elif isinstance(value, int):
            out[key] = dg.MetadataValue.int(value)
        elif isinstance(value, float):
            out[key] = dg.MetadataValue.float(rounded(key, value))
        elif isinstance(value, str):
            out[key] = dg.MetadataValue.text(value)
        elif value:
            out[key] = dg.MetadataValue.json(value)
    return out


_COLUMN_TYPES = {bool: "bool", int: "int", float: "float"}


def table_from(rows: Iterable[Mapping[str, Any]], columns: Mapping[str, str]) -> dg.TableMetadataValue:
    """Rows as a ``dg.TableMetadataValue``. ``columns`` maps a row key to its header, in order;
    values are rounded by the key (:func:`rounded`). The asset page shows a table of at most 4
    columns inline, a wider one behind a link: keep the inline ones narrow."""
    records, kinds = [], dict.fromkeys(columns, "string")
    for row in rows:
        data = {}
        for key, header in columns.items():
            value = row.get(key)
            if hasattr(value, "item"):  # numpy scalars from pandas rows
                value = value.item()
            value = rounded(key, value)
            if value is not None and not isinstance(value, (bool, int, float, str)):
                value = str(value)
            kinds[key] = _COLUMN_TYPES.get(type(value), "string") if value is not None else kinds[key]
            data[header] = value
        records.append(dg.TableRecord(data=data))
    schema = dg.TableSchema(columns=[dg.TableColumn(header, kinds[key]) for key, header in columns.items()])
    return dg.TableMetadataValue(records=records, schema=schema)


CheckNotes = Mapping[dg.AssetCheckKey, str]
"""What a failed check's description adds, by check: given by the code location (``make dev``'s
demo says which failures it causes on purpose); empty in production."""


def noted(
    check: dg.AssetCheckKey, passed: bool, description: str, notes: CheckNotes | None
) -> tuple[str, dict[str, str]]:
    """A check's description, and metadata to add: for a failed ``check`` that ``notes`` has a note
    on, ``"<description> (<note>)"`` and ``{"demo": note}``; otherwise the description unchanged
    and nothing."""
    note = (notes or {}).get(check)
    if passed or not note:
        return description, {}
    return (f"{description} ({note})" if description else note), {"demo": note}
