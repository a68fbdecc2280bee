"""The task contract: one periodic task, declared once. No Dagster.

A :class:`Task` is a name, its parameters declared once (a frozen dataclass of
``pipelines.common.params``), the clients its pass works with, one bounded pass, and, for a task
that runs on a schedule, its look (``pipelines.common.looks``), the clients the look reads with,
its default cron and what the look reads (said in the schedule's description). A task that runs
as a job of its own names it (``job``, its one ``op``, ``tags``, ``description``), says what its
run summary counts (``what``, ``counters``) and which errors' message says it all (``failures``:
the run fails with that line alone, no stack trace); the one adapter, ``pipelines.common.defs.tasks``,
builds that job and its schedules, and ``pipelines.tasks.TASKS`` lists those tasks. The fleet's
housekeeping tasks are one list, ``pipelines.fleet.housekeeping.TASKS``, run by its dispatcher.

The pass and the look are called as ``run(context, request, params)`` and ``look(context, request,
params)``: ``context`` holds the capability's clients and names, ``request`` what the call is for
(its clock, whether it is a dry run), ``params`` the validated parameters (an instance of
``params``). The pass returns what it did (counts and details); the look returns a ``Look``. Run
as a job, ``context`` is a :class:`TaskRun` (its clients by name) and ``request`` is None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pipelines.common.looks import Look
from pipelines.common.params import parse_params, specs

P = TypeVar("P")


@dataclass(frozen=True)
class Task(Generic[P]):
    """One task. ``clients``: the context's clients the pass works with; ``look_clients``: those
    the look reads with (only these are built for it); ``cron``: the schedule's own cron;
    ``looks_at``: what the look reads, in words."""

    name: str
    params: type[P]
    run: Callable[[Any, Any, P], Any]
    clients: tuple[str, ...]
    look: Callable[[Any, Any, P], Look] | None = None
    look_clients: tuple[str, ...] = ()
    cron: str | None = None
    looks_at: str = ""
    job: str | None = None
    op: str = ""
    description: str = ""
    tags: Mapping[str, str] = field(default_factory=dict, compare=False)
    what: Callable[[P], str] | None = None
    counters: Callable[[Any], Mapping[str, int]] | None = None
    failures: tuple[type[Exception], ...] = ()

    def __post_init__(self) -> None:
        specs(self.params)  # every field is declared with pipelines.common.params.param
        if (self.look is None) != (not self.looks_at) or (self.look is None and self.cron is not None):
            raise ValueError(f"task {self.name}: a look, its cron and what it looks at go together")
        if not set(self.look_clients) <= set(self.clients):
            raise ValueError(f"task {self.name}: the look's clients {self.look_clients} are not the pass's")
        if self.job is not None and not (self.op and self.description and self.what and self.counters):
            raise ValueError(f"task {self.name}: a job of its own needs its op, description, what and counters")

    @property
    def param_names(self) -> frozenset[str]:
        """The keys the task accepts: its parameters and their old names."""
        return frozenset(name for spec in specs(self.params) for name in (spec.name, *spec.aliases))

    def parse(self, raw: Mapping[str, Any]) -> tuple[P, list[str]]:
        """The validated parameters and the deprecation warnings for old names used; bad values
        raise ``ParamsError`` with one line that names the key and the value. As runs-fleet's
        messages have always been read: a null parameter is its default, and a whole-number
        parameter may be written as a whole float (``7.0``)."""
        kinds = {name: spec.kind for spec in specs(self.params) for name in (spec.name, *spec.aliases)}
        given = {
            key: int(value) if _whole_float(value) and kinds.get(key) is int else value
            for key, value in raw.items()
            if value is not None
        }
        return parse_params(self.params, given, what=f"{self.name} parameter")


@dataclass(frozen=True)
class TaskRun:
    """A pass's context when its task runs as a job: the run's log and id, and its ``clients`` (the
    task's resources by name, a boto3 client for an AWS one; ``cloudwatch`` publishes metrics after
    a committed change) as attributes."""

    log: Any
    run_id: str
    clients: Mapping[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["clients"][name]
        except KeyError:
            raise AttributeError(name) from None


def _whole_float(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value == int(value)
