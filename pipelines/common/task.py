"""The task contract, no Dagster (``docs/development.md``, "The task contract"). Run as a job, a task's
pass is called as ``run(context, None, params)``, ``context`` a :class:`TaskRun`."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pipelines.common.looks import Look
from pipelines.common.params import parse_params, specs

P = TypeVar("P")


@dataclass(frozen=True)
class Task(Generic[P]):
    """One task; ``look_clients``: the clients built for its look; ``looks_at``: what it reads, in words."""

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
        """The parameters and deprecation warnings, read as runs-fleet's messages always were: a null is
        the default, and a whole number may be a whole float (``7.0``)."""
        kinds = {name: spec.kind for spec in specs(self.params) for name in (spec.name, *spec.aliases)}
        given = {
            key: int(value) if isinstance(value, float) and value.is_integer() and kinds.get(key) is int else value
            for key, value in raw.items()
            if value is not None
        }
        return parse_params(self.params, given, what=f"{self.name} parameter")


@dataclass(frozen=True)
class TaskRun:
    """A pass's context when its task runs as a job: the run's log and id, its clients as attributes."""

    log: Any
    run_id: str
    clients: Mapping[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["clients"][name]
        except KeyError:
            raise AttributeError(name) from None
