"""Results as UI metadata, and a failed check's note."""

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
    """Numbers, flags and text as such (rounded by :func:`rounded`), the rest as JSON, empties left out."""
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
    """``columns``: row key -> header, in order. The asset page shows at most 4 columns inline."""
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
"""What a failed check's description adds, by check (``make dev``'s demo); empty in production."""


def noted(
    check: dg.AssetCheckKey, passed: bool, description: str, notes: CheckNotes | None
) -> tuple[str, dict[str, str]]:
    """A failed ``check``'s description with its note, and ``{"demo": note}``; else as they are."""
    note = (notes or {}).get(check)
    if passed or not note:
        return description, {}
    return (f"{description} ({note})" if description else note), {"demo": note}
