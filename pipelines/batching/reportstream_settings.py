"""Import ReportStream's receiver settings into the receivers table (docs/batching.md). No Dagster.
Settings files are untrusted (a safe loader, a size limit); writes are conditional (a rerun changes nothing)."""

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from botocore.exceptions import ClientError

from pipelines.batching import store
from pipelines.batching.schedule import RECEIVER_NAME, receiver_errors, shown
from pipelines.common import first_line, to_item
from pipelines.common.aws_batches import conditional_write, error_code

MAX_FILE_BYTES = 5_000_000
"""A settings file larger than this is refused (ReportStream's whole 2022 organizations.yml is 132 KB)."""
MAX_FILES = 1000
SETTINGS_SOURCE = "reportstream"
TIMING_KEYS = ("operation", "numberPerDay", "initialTime", "timeZone", "maxReportCount", "whenEmpty")
WHEN_EMPTY_KEYS = ("action", "onlyOncePerDay")
ADD, CHANGE, DISABLE, UNCHANGED, SKIPPED = "add", "change", "disable", "unchanged", "skipped"


class _SettingsLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that reads any tag (Jackson's ``!<HL7>``) as the plain node under it and
    does not read ``HH:MM`` as a base-60 integer (ReportStream's Jackson reads it as text)."""


def _plain(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)


def _text_if_base_60(construct):
    """YAML 1.1 reads ``12:30`` as the number 750; ReportStream's Jackson (YAML 1.2) reads the text."""
    return lambda loader, node: node.value if ":" in node.value else construct(loader, node)


_SettingsLoader.add_multi_constructor("", _plain)
_SettingsLoader.add_constructor("tag:yaml.org,2002:int", _text_if_base_60(yaml.SafeLoader.construct_yaml_int))
_SettingsLoader.add_constructor("tag:yaml.org,2002:float", _text_if_base_60(yaml.SafeLoader.construct_yaml_float))


def _is_settings_file(name: str) -> bool:
    return name.endswith((".yml", ".yaml"))


def read_sources(path: str, s3=None, root: str | None = None) -> tuple[list[tuple[str, str]], list[str]]:
    """``(source, text)`` of every settings file at ``path`` (a file, a folder, ``s3://bucket/key``
    or ``s3://bucket/prefix/``), and one line per file that could not be read. A local path is read under
    ``root`` only (``RECEIVER_SETTINGS_DIR``; None: none is): a run config names it."""
    texts: list[tuple[str, str]] = []
    problems: list[str] = []
    if path.startswith("s3://"):
        bucket, _, key = path[5:].partition("/")
        if s3 is None or not bucket:
            return [], [f"{path}: an s3:// URL needs a bucket and an S3 client"]
        found = (
            [key] if _is_settings_file(key) else [k for k in store.list_keys(s3, bucket, key) if _is_settings_file(k)]
        )
        for name in found[:MAX_FILES]:
            source = f"s3://{bucket}/{name}"
            try:
                head = s3.head_object(Bucket=bucket, Key=name)
                if head["ContentLength"] > MAX_FILE_BYTES:
                    problems.append(f"{source}: {head['ContentLength']} bytes, over the {MAX_FILE_BYTES} allowed")
                    continue
                body = s3.get_object(Bucket=bucket, Key=name)["Body"].read(MAX_FILE_BYTES + 1)
                texts.append((source, body.decode("utf-8")))
            except ClientError as exc:
                problems.append(f"{source}: cannot be read: {error_code(exc)}")
            except UnicodeDecodeError:
                problems.append(f"{source}: not UTF-8 text")
    else:
        if root is None:
            return [], [f"{path}: a local path is read only under RECEIVER_SETTINGS_DIR, which is not set"]
        base = Path(root).resolve()
        start = base / path  # a relative path is read under it; an absolute one must lead there
        if not start.resolve().is_relative_to(base):
            return [], [f"{path}: outside RECEIVER_SETTINGS_DIR ({base}): not read"]
        if start.is_dir():
            found = sorted(p for p in start.rglob("*") if p.is_file() and _is_settings_file(p.name))
        elif start.is_file():  # named by its extension, as an S3 key is: no other file is opened
            found = [start] if _is_settings_file(start.name) else []
        else:
            return [], [f"{path}: no such file or folder"]
        for file in found[:MAX_FILES]:
            try:
                if not file.resolve().is_relative_to(base):
                    problems.append(f"{file}: a link outside RECEIVER_SETTINGS_DIR: not read")
                    continue
                if file.stat().st_size > MAX_FILE_BYTES:
                    problems.append(f"{file}: {file.stat().st_size} bytes, over the {MAX_FILE_BYTES} allowed")
                    continue
                texts.append((str(file), file.read_bytes().decode("utf-8")))
            except OSError as exc:
                problems.append(f"{file}: cannot be read: {exc.strerror or exc}")
            except UnicodeDecodeError:
                problems.append(f"{file}: not UTF-8 text")
    if len(found) > MAX_FILES:
        problems.append(f"{path}: {len(found)} settings files, only the first {MAX_FILES} read")
    if not texts and not problems:
        problems.append(f"{path}: no .yml or .yaml settings file")
    return texts, problems


@dataclass
class Entry:
    """One receiver of the settings: its item, or why it cannot be imported."""

    receiver: str
    source: str
    item: dict[str, Any] | None = None
    problem: str | None = None
    notes: list[str] = field(default_factory=list)


def digest(item: dict[str, Any]) -> str:
    """What an import writes of a receiver, as one value (unchanged settings, unchanged digest)."""
    owned = {k: item.get(k) for k in ("organization", "timing", "customerStatus")}
    return hashlib.sha256(json.dumps(owned, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _timing_as_written(timing: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The keys of ReportStream's timing block that batching reads, as written; the rest noted."""
    out = {k: timing[k] for k in TIMING_KEYS if k in timing and timing[k] is not None}
    if isinstance(out.get("whenEmpty"), dict):
        out["whenEmpty"] = {k: v for k, v in out["whenEmpty"].items() if k in WHEN_EMPTY_KEYS and v is not None}
    between = timing.get("timeBetweenBatches")
    if between not in (None, 0):
        notes.append(
            f"timeBetweenBatches {shown(between)} is not honoured: a batch's files are written one after another"
        )
    other = sorted(str(k) for k in timing if k not in TIMING_KEYS and k != "timeBetweenBatches")
    if other:
        notes.append(f"timing keys not read by batching: {', '.join(other)}")
    return out


def entry_for(organization: str, receiver: Any, source: str) -> Entry:
    """The receiver item for one receiver of ReportStream's settings, or its problem."""
    if not isinstance(receiver, dict):
        return Entry(f"{organization}.?", source, problem=f"a receiver is a map, got {shown(receiver)}")
    if not isinstance(receiver.get("name"), str) or not receiver["name"]:
        return Entry(f"{organization}.?", source, problem=f"a receiver without a name: {shown(receiver)}")
    name, timing = f"{organization}.{receiver['name']}", receiver.get("timing")
    entry = Entry(name, source)
    if not RECEIVER_NAME.match(name):
        entry.problem = f"{name!r:.120} cannot be a receiver name (it must match {RECEIVER_NAME.pattern})"
    elif timing is None:
        entry.problem = "no timing block: ReportStream does not batch this receiver"
    elif not isinstance(timing, dict):
        entry.problem = f"timing must be a map, got {shown(timing)}"
    else:
        item = {
            "receiver": name,
            "organization": organization,
            "timing": _timing_as_written(timing, entry.notes),
            "customerStatus": receiver.get("customerStatus", "inactive"),  # ReportStream's default
            "settings_source": SETTINGS_SOURCE,
        }
        entry.problem = "; ".join(receiver_errors(item)) or None
        if entry.problem is None:
            if item["customerStatus"] == "inactive":
                entry.notes.append("customerStatus inactive: imported disabled (no batches)")
            entry.item = {**item, "settings_digest": digest(item)}
    return entry


def entries_of(sources: list[tuple[str, str]]) -> tuple[list[Entry], list[str], set[str]]:
    """The receivers of every settings file, one line per file or organization that cannot be
    read, and the organizations the files list."""
    entries: list[Entry] = []
    problems: list[str] = []
    organizations: set[str] = set()
    for source, text in sources:
        try:
            doc = yaml.load(text, Loader=_SettingsLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            problems.append(f"{source}: not valid YAML{where}: {problem}")
            continue
        except RecursionError:
            problems.append(f"{source}: not valid YAML (nested too deeply)")
            continue
        except Exception as exc:  # a value its tag cannot be (2024-02-30, !!bool maybe): any error of the load
            problems.append(f"{source}: not valid YAML: {type(exc).__name__}: {first_line(exc)}")
            continue
        orgs = doc if isinstance(doc, list) else [doc] if isinstance(doc, dict) else None
        if orgs is None:
            problems.append(f"{source}: a settings file is a list of organizations, got {type(doc).__name__}")
            continue
        for n, org in enumerate(orgs, 1):
            name = org.get("name") if isinstance(org, dict) else None
            if not isinstance(name, str) or not name:
                problems.append(f"{source}: organization #{n} has no name; its receivers are not read")
                continue
            receivers = org.get("receivers") or []
            if not isinstance(receivers, list):
                problems.append(f"{source}: organization {shown(name)}: receivers must be a list")
                continue
            organizations.add(name)
            entries.extend(entry_for(name, r, source) for r in receivers)
    seen: set[str] = set()
    for entry in entries:
        if entry.item is not None and entry.receiver in seen:
            entry.problem, entry.item = "listed again; the first one is imported", None
        elif entry.item is not None:
            seen.add(entry.receiver)
    return entries, problems, organizations


@dataclass
class Change:
    receiver: str
    action: str  # add | change | disable | unchanged | skipped
    detail: str = ""
    item: dict[str, Any] | None = None
    expected_digest: str | None = None
    outcome: str = ""  # after the import: done | conflict (another writer changed it) | would (dry run)

    def line(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.receiver}: {self.action}{detail}" + (f" -> {self.outcome}" if self.outcome else "")


def _differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What differs between a stored receiver and its settings, ``key old -> new`` each."""
    owned = ("organization", "customerStatus")
    before, after = ({**(i.get("timing") or {}), **{k: i.get(k) for k in owned}} for i in (old, new))
    parts = [
        f"{k} {shown(before.get(k))} -> {shown(after.get(k))}"
        for k in (*owned, *TIMING_KEYS)
        if before.get(k) != after.get(k)
    ]
    return ", ".join(parts) or "settings digest differs"


def plan(entries: list[Entry], organizations: set[str], current: Iterable[dict[str, Any]]) -> list[Change]:
    """What an import of ``entries`` does to the receivers table as ``current`` has it."""
    existing = {str(i.get("receiver")): i for i in current}
    changes: list[Change] = []
    importable: set[str] = set()
    for entry in entries:
        if entry.item is None:
            changes.append(Change(entry.receiver, SKIPPED, f"{entry.source}: {entry.problem}"))
            continue
        importable.add(entry.receiver)
        old = existing.get(entry.receiver)
        if old is not None and old.get("batching_enabled") is False:
            entry.notes.append("batching_enabled is false: an import never enables, set it to true to batch again")
        notes = "; ".join(entry.notes)
        if old is None:
            changes.append(Change(entry.receiver, ADD, notes, item=entry.item))
        elif old.get("settings_source") != SETTINGS_SOURCE:
            detail = "already in the receivers table, not from ReportStream settings; left alone"
            changes.append(Change(entry.receiver, SKIPPED, detail))
        elif old.get("settings_digest") == entry.item["settings_digest"]:
            changes.append(Change(entry.receiver, UNCHANGED, notes))
        else:
            detail = _differences(old, entry.item) + (f"; {notes}" if notes else "")
            changes.append(
                Change(entry.receiver, CHANGE, detail, item=entry.item, expected_digest=old.get("settings_digest"))
            )
    listed = {entry.receiver for entry in entries}
    for name, old in sorted(existing.items()):
        if (
            old.get("settings_source") == SETTINGS_SOURCE
            and old.get("organization") in organizations
            and name not in importable
            and old.get("batching_enabled", True) is not False
        ):
            why = (
                "its settings can no longer be honoured (its skipped line says why)"
                if name in listed
                else "no longer in its organization's settings with a timing block"
            )
            changes.append(Change(name, DISABLE, why, expected_digest=old.get("settings_digest")))
    return changes


def _write(dynamodb, table: str, change: Change) -> Any:
    """One change's conditional write: the response, or None when the item changed since the plan read it."""
    if change.action == ADD:
        item = to_item(change.item)
        return conditional_write(
            lambda: dynamodb.put_item(TableName=table, Item=item, ConditionExpression="attribute_not_exists(receiver)")
        )
    update, values = "SET batching_enabled = :f", {":f": {"BOOL": False}}
    if change.action == CHANGE:
        owned = ("organization", "timing", "customerStatus", "settings_digest")
        update = "SET " + ", ".join(f"{k} = :{k}" for k in owned)
        values = to_item({f":{k}": change.item[k] for k in owned})
    values |= {":src": {"S": SETTINGS_SOURCE}, ":old": {"S": change.expected_digest or ""}}
    condition = "settings_source = :src AND settings_digest = :old"
    return store.update_receiver(dynamodb, table, change.receiver, update, condition, values)


def import_settings(
    dynamodb, s3, *, table: str, path: str, dry_run: bool, root: str | None = None
) -> tuple[list[Change], list[str]]:
    """Read the settings at ``path`` (a local one under ``root``), plan against the receivers table, write unless
    ``dry_run``. Returns every change (with its outcome) and one line per file or organization not read."""
    sources, problems = read_sources(path, s3, root)
    entries, more, organizations = entries_of(sources)
    changes = plan(entries, organizations, store.scan_receivers(dynamodb, table))
    for change in (c for c in changes if c.action in (ADD, CHANGE, DISABLE)):
        if dry_run:
            change.outcome = "would"
        elif _write(dynamodb, table, change) is not None:
            change.outcome = "done"
        else:
            change.outcome = "conflict: the item changed since the plan read it; run the import again"
    return changes, problems + more
