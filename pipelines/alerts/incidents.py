"""Incidents, not events: one message per state change of an ``alert_key``, kept in per-sink outboxes
until a sink takes it (at least once, each with its state change's ``message_id``). No Dagster."""

import dataclasses
import datetime as dt
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Self

from pipelines.common import first_line, iso, printable
from pipelines.retry import STOP, RetryPolicy, RetryPolicyError

FIRING, RESOLVED = "firing", "resolved"
CLOSED = "closed"  # by hand (close_incident): stays closed until it fires again
ACKNOWLEDGED = "acknowledged"  # a message's state only: the incident is still firing
STATES = (FIRING, ACKNOWLEDGED, CLOSED, RESOLVED)  # a message's states, the most open first
SEVERITIES = ("critical", "warning", "info")
# every alert kind, each with its runbook docs/runbooks/<kind>.md (what each means: docs/alerts.md)
KINDS = (
    "run_failure",
    "check_failure",
    "tick_failure",
    "dead_letters",
    "progressor_overdue",
    "reclaim_errors",
    "heartbeat",
    "summary",
    "state_reset",
)
SUMMARY_CHARS = 300
LONGEST_WAIT_SECONDS = 900.0  # once the policy says STOP, a sink that is down is tried this often
MAX_KEPT_PER_SINK = 1000  # a sink down for so long that more wait: some give way (_giving_way), one line each
PARTS = {"incidents": dict, "outbox": dict, "history": list, "positions": dict, "took": list, "sinks": dict}


@dataclass(frozen=True)
class Signal:
    """One observation of one ``alert_key``: ``firing`` True when the problem is there now."""

    alert_key: str
    kind: str
    firing: bool
    severity: str = "critical"
    title: str = ""
    summary: str = ""
    capability: str = ""
    job: str | None = None
    run_id: str | None = None
    asset: str | None = None
    check: str | None = None
    url: str | None = None
    attempts: int | None = None
    unit: str | None = None  # a run failure's unit of work (job or assets, partition, target)
    action: str | None = None  # by hand (close_incident): "acknowledge" or "close"; ``summary`` says who and why
    at: float | None = None  # when it happened (a run's failure, a check's evaluation): the incident's first_seen;
    # an action's: when it was asked for (an incident opened after that is not the one it was asked for)

    def __post_init__(self) -> None:
        for what, value, known in (("alert kind", self.kind, KINDS), ("severity", self.severity, SEVERITIES)):
            if value not in known:
                raise ValueError(f"unknown {what} {value!r}: one of {', '.join(known)}")


FIELDS = (
    "alert_key",
    "state",
    "severity",
    "kind",
    "title",
    "summary",
    "capability",
    "job",
    "run_id",
    "asset",
    "check",
    "first_seen",
    "last_seen",
    "url",
    "runbook",
    "attempts",
    "reminder",
)
"""The message's fields (``docs/contracts.md``, "Alerts"), in this order."""


def runbook_link(kind: str, base_url: str | None) -> str:
    """A kind's runbook: under ``base_url`` (``ALERTS_RUNBOOK_BASE_URL``) when set, else its repository path."""
    return f"{base_url.rstrip('/')}/{kind}.md" if base_url else f"docs/runbooks/{kind}.md"


def message_id(message: Mapping[str, Any]) -> str:
    """One state change of one incident: the same change always has the same id."""
    suffix = f"#reminder@{message['last_seen']}" if message.get("reminder") else ""
    return f"{message['alert_key']}#{message['first_seen']}#{message['state']}{suffix}"


def text_of(message: Mapping[str, Any]) -> str:
    """The one line a chat message or an e-mail subject shows."""
    mark = "STILL FIRING" if message.get("reminder") else (message.get("state") or "").upper()
    severity = f" [{message['severity']}]" if message.get("state") == FIRING else ""
    summary = f": {message['summary']}" if message.get("summary") else ""
    return f"{mark}{severity} {message.get('title') or message['alert_key']}{summary}"


class Sink(Protocol):
    """Where messages go (SNS, a webhook...). ``send`` raises :class:`SinkError` when it did not take it."""

    name: str

    def send(self, message: Mapping[str, Any]) -> None: ...


class SinkError(RuntimeError):
    """A sink did not take a message: one line, with no credential in it."""


def iso_seconds(seconds: float) -> str:
    return iso(dt.datetime.fromtimestamp(seconds, dt.UTC))


@dataclass
class Delivery:
    """What one :meth:`AlertBook.deliver` did, for the sensor's skip reason and log."""

    sent: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (sink, message id)
    failed: list[str] = dataclasses.field(default_factory=list)  # one line per sink that did not answer
    waiting: dict[str, int] = dataclasses.field(default_factory=dict)  # sink -> messages kept for later
    summarised: int = 0
    out_of_time: bool = False  # the tick's time budget was spent before everything due was sent

    def describe(self) -> str:
        parts = ["the tick's time budget is spent: the rest go next tick"] if self.out_of_time else []
        if self.sent:
            parts.append("sent " + ", ".join(f"{mid} to {sink}" for sink, mid in self.sent[:10]))
            if len(self.sent) > 10:
                parts.append(f"and {len(self.sent) - 10} more")
        if self.summarised:
            parts.append(f"{self.summarised} summarised in one message")
        parts += self.failed
        if kept := {sink: n for sink, n in self.waiting.items() if n}:
            parts.append("kept for a later tick: " + ", ".join(f"{n} for {sink}" for sink, n in kept.items()))
        return "; ".join(parts) or "nothing to send"


class AlertBook:
    """Incidents, per-sink outboxes and read positions, as one JSON-able ``state`` dict."""

    def __init__(self, state: Mapping[str, Any] | None = None) -> None:
        self.reset: str | None = None  # why a saved state could not be used (set by :meth:`load`)
        self.fresh = False  # no saved state could be used: it knows nothing yet (set by :meth:`load`)
        state = dict(state or {})
        self.incidents: dict[str, dict[str, Any]] = dict(state.get("incidents") or {})
        self.outbox: dict[str, list[dict[str, Any]]] = {k: list(v) for k, v in (state.get("outbox") or {}).items()}
        self.history: list[list[Any]] = list(state.get("history") or [])
        self.positions: dict[str, Any] = dict(state.get("positions") or {})
        self.took: list[str] = list(state.get("took") or [])  # sinks that took the last message tried
        self.sinks: dict[str, str] | None = state.get("sinks")  # name -> where it sent at the last tick

    @classmethod
    def load(cls, text: str | None, warn: Callable[[str], None] = lambda _: None) -> Self:
        """The book saved as ``text``; an unreadable one starts afresh, with one warning line."""
        book = cls()
        if text:
            try:
                state = json.loads(text)
                _check_shape(state)
                return cls(state)
            except (ValueError, TypeError, RecursionError) as exc:
                book.reset = first_line(exc, 200)
                warn(f"alert state unreadable ({book.reset}): starting afresh")
        book.fresh = True
        return book

    def dumps(self) -> str:
        return json.dumps({part: getattr(self, part) for part in PARTS}, sort_keys=True, default=str)

    # ------------------------------------------------------------------ incidents

    def observe(self, signal: Signal, now: float) -> dict[str, Any] | None:
        """Record one observation; returns the message of the state change it makes, or None."""
        incident = self.incidents.get(signal.alert_key)
        if signal.action:
            return self._act(incident, signal, now)
        if incident is not None and incident["state"] == CLOSED:
            if not signal.firing:  # the problem is gone: the next time it is there, it fires again
                incident.update(state=RESOLVED, last_seen=now)
                return None
            again = signal.kind == "run_failure" and signal.run_id and signal.run_id != incident.get("run_id")
            if not again:  # the same problem, still there: it stays closed
                incident["last_seen"] = now
                return None
        open_now = incident is not None and incident["state"] == FIRING
        if signal.firing and not open_now:
            fields = {name: getattr(signal, name) for name in FIELDS if hasattr(signal, name)}
            # first_seen: when it happened, when the source says (a run failure read again from the
            # instance's history after a state reset has the same first_seen, so the same message_id)
            first = min(signal.at, now) if signal.at is not None else now
            if incident is not None:  # a new opening, however close to the last (clocks apart): ids of its own
                first = max(first, incident["first_seen"] + 0.001)
            incident = {
                **fields,
                "title": printable(signal.title),
                "summary": first_line(signal.summary, SUMMARY_CHARS),
                "state": FIRING,
                "first_seen": first,
                "last_seen": now,
                "notified": now,
            }
            if signal.unit:
                incident["unit"] = signal.unit
            self.incidents[signal.alert_key] = incident
            self.history.append([now, FIRING])
            return _message(incident)
        if signal.firing and open_now:
            if signal.kind == "run_failure" and signal.run_id:  # another failed run: what a re-execution must redo
                incident["failed_run"] = signal.run_id
            rose = SEVERITIES.index(signal.severity) < SEVERITIES.index(incident["severity"])
            # as it is now (a queue's depth, the latest failed run) in its later messages; a rise of its severity
            # is sent, even when acknowledged, a fall is not
            title, summary = printable(signal.title), first_line(signal.summary, SUMMARY_CHARS)
            incident.update(last_seen=now, severity=signal.severity, title=title, summary=summary)
            incident.update({n: getattr(signal, n) for n in ("url", "run_id", "attempts") if getattr(signal, n)})
            if rose:  # in a reminder's form: a reminder falling due this tick is this message
                incident["notified"] = now
                return _message(incident, reminder=True)
            return None
        if not signal.firing and open_now:
            incident.update(state=RESOLVED, last_seen=now, resolved_by=first_line(signal.summary, SUMMARY_CHARS))
            # the resolving run's page, when there is one
            incident.update({name: getattr(signal, name) for name in ("run_id", "url") if getattr(signal, name)})
            self.history.append([now, RESOLVED])
            return _message(incident)
        return None

    def reminders(self, now: float, remind_seconds: float | None) -> list[dict[str, Any]]:
        """A reminder of each open incident, not acknowledged, whose last message is ``remind_seconds`` old or
        more, whether its source saw it again or not (a run failure is seen once); each with ``last_seen`` now."""
        if not remind_seconds:
            return []
        due = [
            incident
            for incident in self.open_incidents()
            if not incident.get("acknowledged")
            and now - incident.get("notified", incident["first_seen"]) >= remind_seconds
        ]
        for incident in due:
            incident.update(notified=now, last_seen=now)
        return [_message(incident, reminder=True) for incident in due]

    def _act(self, incident: dict[str, Any] | None, signal: Signal, now: float) -> dict[str, Any] | None:
        """An operator's acknowledge or close of an open incident; None when it is not open (any more), or
        opened after the action was asked for (``signal.at``)."""
        if incident is None or incident["state"] != FIRING or incident["first_seen"] > (signal.at or float("inf")):
            return None
        if signal.action == "close":
            incident.update(state=CLOSED, last_seen=now, resolved_by=first_line(signal.summary, SUMMARY_CHARS))
            self.history.append([now, CLOSED])
            return _message(incident)
        if incident.get("acknowledged"):
            return None
        incident["acknowledged"] = now
        message = _message(incident)
        message["state"] = ACKNOWLEDGED
        message["summary"] = f"{first_line(signal.summary, SUMMARY_CHARS)} (was: {incident.get('summary', '')})"
        return message

    def open_units(self) -> dict[str, str]:
        """alert_key -> unit of work of each open run failure (what a success of that unit resolves)."""
        # an incident opened before units were recorded: its key was run_failure:<job>[:<partition>]
        return {
            key: incident.get("unit") or key.removeprefix("run_failure:")
            for key, incident in self.incidents.items()
            if incident["state"] == FIRING and incident["kind"] == "run_failure"
        }

    def open_runs(self) -> dict[str, str]:
        """alert_key -> the run that failed last of each open run failure (what a re-execution must complete)."""
        return {
            key: incident.get("failed_run") or incident.get("run_id") or ""
            for key, incident in self.incidents.items()
            if incident["state"] == FIRING and incident["kind"] == "run_failure"
        }

    def open_incidents(self) -> list[dict[str, Any]]:
        return sorted((i for i in self.incidents.values() if i["state"] == FIRING), key=lambda i: i["first_seen"])

    def counts_since(self, since: float) -> dict[str, int]:
        states = [state for at, state in self.history if at >= since]
        return {"opened": states.count(FIRING), "resolved": len(states) - states.count(FIRING)}

    def prune(self, now: float) -> None:
        """Forget resolved incidents after a week and history older than a day."""
        self.incidents = {
            key: i for key, i in self.incidents.items() if i["state"] == FIRING or now - i["last_seen"] < 7 * 86400
        }
        self.history = [h for h in self.history if now - h[0] < 86400]

    # ------------------------------------------------------------------ delivery

    def add_sinks(self, sinks: Mapping[str, str], noise: frozenset[str] = frozenset()) -> list[str]:
        """A sink not configured at the last tick, or sending elsewhere since (``sinks``: name -> where it sends),
        gets the firing message of every open incident (it was not there when they opened) but those of the
        ``noise`` kinds (never sent). Returns :meth:`enqueue`'s lines."""
        last = self.sinks if self.sinks is not None else {n: w for n, w in sinks.items() if n in self.outbox}
        new = [name for name, where in sinks.items() if last.get(name) != where]
        self.sinks = dict(sinks)
        opened = [incident for incident in self.open_incidents() if incident["kind"] not in noise]
        for incident in [i for i in opened if i.get("gave_way")]:  # its firing goes to them again: the rest may too
            incident["gave_way"] = [name for name in incident["gave_way"] if name not in new]
        return [line for incident in opened for line in self.enqueue(_message(incident), new)]

    def enqueue(self, message: Mapping[str, Any], sinks: Iterable[str]) -> list[str]:
        """Put ``message`` in each sink's outbox; the same state change already there takes its fields.
        Returns one line per message dropped to keep an outbox at ``MAX_KEPT_PER_SINK``."""
        dropped = []
        incident = self.incidents.get(message["alert_key"]) or {}
        for sink in sinks:
            sent = message
            if sink in incident.get("gave_way", ()):  # its firing gave way: its end never goes alone,
                if message["state"] not in (FIRING, ACKNOWLEDGED):
                    continue
                incident["gave_way"].remove(sink)
                sent = _message(incident)  # and its next message while open goes as its firing, as it is now
            mid = message_id(sent)
            box = self.outbox.setdefault(sink, [])
            if same := [item for item in box if item["id"] == mid]:
                same[0]["message"] = dict(sent)
            else:
                box.append({"id": mid, "message": dict(sent), "attempts": 0, "next_try": 0.0})
            while len(box) > MAX_KEPT_PER_SINK:
                gone, why = _giving_way(box)
                ids = [item["id"] for item in gone]
                box[:] = [item for item in box if item["id"] not in ids]
                opened = self.incidents.get(gone[0]["message"]["alert_key"])
                if opened and opened["state"] == FIRING and message_id(_message(opened)) == ids[0]:
                    opened.setdefault("gave_way", []).append(sink)  # an open incident's firing: not its end alone
                dropped.append(f"{sink} has {MAX_KEPT_PER_SINK} messages waiting: dropped {why.format(', '.join(ids))}")
        return dropped

    def deliver(
        self,
        sinks: Iterable[Sink],
        now: float,
        *,
        policy: RetryPolicy,
        max_per_tick: int,
        save: Callable[[], None] = lambda: None,
        deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        runbook_url: str | None = None,
    ) -> Delivery:
        """Send what is due, sink by sink, each linking its runbook under ``runbook_url``: at most ``max_per_tick``
        messages each, the rest in one summary message. A refused message is tried again after ``policy``'s
        delay and holds back only its own incident's; two failures in a row stop that sink for this tick. ``save``
        runs after each message a sink took; none is begun at or after ``deadline`` (by ``clock``)."""
        done = Delivery()

        def out_of_time() -> bool:
            done.out_of_time = done.out_of_time or (deadline is not None and clock() >= deadline)
            return done.out_of_time

        def send(sink: Sink, item: dict[str, Any], replaces: list[dict[str, Any]] | None = None) -> bool:
            box = self.outbox.setdefault(sink.name, [])
            try:
                runbook = runbook_link(item["message"]["kind"], runbook_url)  # as the settings say now
                sink.send({**item["message"], "runbook": runbook, "message_id": item["id"]})  # the same change: id
            except Exception as exc:  # noqa: BLE001 (any failure of a sink is that sink's, never the tick's)
                if not isinstance(exc, SinkError):
                    exc = SinkError(f"{sink.name} failed: {type(exc).__name__}")  # its text may hold a credential
                stopped = ""
                for kept in replaces or [item]:
                    kept["attempts"] += 1
                    try:
                        wait = policy.delay(kept["attempts"])
                    except RetryPolicyError as error:  # a policy error: the policy stops
                        wait, stopped = STOP, f"; {first_line(error, SUMMARY_CHARS)}"
                    kept["next_try"] = now + (LONGEST_WAIT_SECONDS if wait is STOP else float(wait))
                    kept["last_error"] = first_line(exc, SUMMARY_CHARS)
                self.took = [name for name in self.took if name != sink.name]
                done.failed.append(
                    f"{sink.name} did not take {item['id']} (attempt {item['attempts'] or 1}): {exc}{stopped}"
                )
                return False
            self.took = sorted({*self.took, sink.name})
            gone = {item["id"]} | {r["id"] for r in replaces or []}
            self.outbox[sink.name] = [i for i in box if i["id"] not in gone]
            done.sent.append((sink.name, item["id"]))
            save()
            return True

        for sink in sinks:
            held: set[str] = set()  # incidents with a message waiting (not due, or refused): theirs wait behind it
            due = []
            for item in self.outbox.get(sink.name, []):
                if item["next_try"] > now or item["message"].get("alert_key") in held:
                    held.add(item["message"].get("alert_key"))
                else:
                    due.append(item)
            due, rest = due[:max_per_tick], due[max_per_tick:]
            in_a_row = 0
            for item in due:
                if out_of_time():  # the summary waits too (out_of_time stays so)
                    break
                if item["message"].get("alert_key") in held:
                    continue
                if send(sink, item):
                    in_a_row = 0
                    continue
                held.add(item["message"].get("alert_key"))
                in_a_row += 1
                if in_a_row >= 2:
                    rest = []  # the sink is down: the summary waits too
                    break
            rest = [item for item in rest if item["message"].get("alert_key") not in held]
            if rest and not out_of_time():
                summary = self._summary(rest, now)
                item = {"id": message_id(summary), "message": summary, "attempts": 0, "next_try": 0.0}
                if send(sink, item, replaces=rest):
                    done.summarised += len(rest)
            done.waiting[sink.name] = len(self.outbox.get(sink.name, []))
        return done

    def undeliverable(self, sinks: Iterable[str]) -> list[str]:
        """The sinks with messages waiting whose last attempt failed (or none was made yet)."""
        return [name for name in sinks if self.outbox.get(name) and name not in self.took]

    def _summary(self, rest: list[dict[str, Any]], now: float) -> dict[str, Any]:
        # every one of them, however long (at most MAX_KEPT_PER_SINK)
        shown = ", ".join(f"{first_line(i['message']['alert_key'], None)} {i['message']['state']}" for i in rest)
        states = [i["message"]["state"] for i in rest]
        held = ", ".join(f"{states.count(state)} {state}" for state in STATES if state in states)
        # the most open state it holds; the worst severity of what fires in it (nothing firing: info)
        state = min(states, key=STATES.index)
        firing = [i["message"].get("severity") or "info" for i in rest if i["message"]["state"] == FIRING]
        severity = min(firing, key=SEVERITIES.index, default="info")
        title = f"{len(rest)} more alerts this tick ({held})"
        return {**notice("summary", title, shown, now, severity), "state": state}


def _giving_way(box: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """What a full outbox drops, and how to say it: an incident that opened and ended while its messages
    waited (all of them: its receiver hears nothing of it, never of its end alone), else a reminder or an
    acknowledgement, else the oldest with its incident's later messages."""
    episodes: dict[tuple[str, Any], list[dict[str, Any]]] = {}  # one opening of an incident: its messages
    for item in box:
        episodes.setdefault((item["message"]["alert_key"], item["message"].get("first_seen")), []).append(item)
    for theirs in episodes.values():
        first, last = theirs[0]["message"], theirs[-1]["message"]
        if first["state"] == FIRING and not first.get("reminder") and last["state"] in (RESOLVED, CLOSED):
            return theirs, "{}, an incident that opened and ended while they waited"
    if passed := [i for i in box if i["message"].get("reminder") or i["message"]["state"] == ACKNOWLEDGED][:1]:
        return passed, "{}, a reminder or an acknowledgement"
    return episodes[(box[0]["message"]["alert_key"], box[0]["message"].get("first_seen"))], "the oldest, {}"


def notice(kind: str, title: str, summary: str, now: float, severity: str = "warning") -> dict[str, Any]:
    """A message of no incident (``summary``, ``state_reset``): sent once, keyed ``<kind>@<time>``."""
    what = {"kind": kind, "title": title, "summary": summary, "severity": severity, "capability": "alerts"}
    seen = {"state": FIRING, "first_seen": now, "last_seen": now}
    return _message({**what, **seen, "alert_key": f"{kind}@{iso_seconds(now)}"})


def _message(incident: Mapping[str, Any], *, reminder: bool = False) -> dict[str, Any]:
    message = {name: incident.get(name) for name in FIELDS}
    message["runbook"] = runbook_link(incident["kind"], None)  # sent under the runbook base URL of its tick
    message["first_seen"] = iso_seconds(incident["first_seen"])
    message["last_seen"] = iso_seconds(incident["last_seen"])
    message["reminder"] = reminder
    if incident["state"] in (RESOLVED, CLOSED) and incident.get("resolved_by"):
        message["summary"] = f"{incident['resolved_by']} (was: {incident.get('summary', '')})"
    return message


def _number(value: Any) -> bool:  # a time (or a count) from year 1 to year 9999, which a date can show
    return isinstance(value, int | float) and not isinstance(value, bool) and -62135596800 <= value < 253402300800


def _check_shape(state: Any) -> None:
    """Raises ValueError naming the first part of a saved state that the book cannot use."""
    if not isinstance(state, dict):
        raise ValueError("not an object")
    parts = {part: empty() if state.get(part) is None else state[part] for part, empty in PARTS.items()}
    incidents, outbox, history, positions, took, sinks = parts.values()
    if not isinstance(took, list) or not all(isinstance(name, str) for name in took):
        raise ValueError("its sinks that took their last message are not a list of names")
    if not isinstance(sinks, dict) or not all(isinstance(where, str) for where in sinks.values()):
        raise ValueError("its sinks of the last tick are not names of destinations")
    if not isinstance(incidents, dict) or not all(
        isinstance(i, dict)
        and i.get("state") in (FIRING, RESOLVED, CLOSED)
        and i.get("kind") in KINDS
        and _number(i.get("first_seen"))
        and _number(i.get("last_seen"))
        for i in incidents.values()
    ):
        raise ValueError("its incidents are not incidents")
    if not isinstance(outbox, dict) or not all(
        isinstance(box, list)
        and all(
            isinstance(item, dict)
            and isinstance(item.get("id"), str)
            and isinstance(item.get("message"), dict)
            and isinstance(item["message"].get("alert_key"), str)
            and item["message"].get("state") in STATES
            and item["message"].get("kind") in KINDS
            and _number(item.get("attempts"))
            and _number(item.get("next_try"))
            for item in box
        )
        for box in outbox.values()
    ):
        raise ValueError("its outboxes are not lists of messages")
    if not isinstance(history, list) or not all(
        isinstance(h, list) and len(h) == 2 and _number(h[0]) and h[1] in (FIRING, RESOLVED, CLOSED) for h in history
    ):
        raise ValueError("its history is not a list of [time, state]")
    if (
        not isinstance(positions, dict)
        or not all(
            isinstance(v, int) or (isinstance(v, dict) and all(isinstance(n, int) for n in v.values()))
            for k, v in positions.items()
            if k not in ("awaiting_retry", "checks_ahead")
        )
        or not isinstance(ahead := positions.get("checks_ahead", {}), dict)
        or not all(isinstance(ids, list) and all(isinstance(i, int) for i in ids) for ids in ahead.values())
        or not isinstance(positions.get("awaiting_retry", {}), dict)
        or not all(
            isinstance(item, dict) and _number(item.get("at")) and _number(item.get("by"))
            for item in positions.get("awaiting_retry", {}).values()
        )
        or not isinstance(positions.get("checks", {}), dict)
    ):
        raise ValueError("its read positions are not storage ids")
