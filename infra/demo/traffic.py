"""One step of the local demo's traffic: each capability's demo module in turn. No Dagster.

- reclaim (``infra/demo/reclaim.py``): agendas move WAITING -> EXECUTING -> COMPLETE, and a
  few get stuck in EXECUTING (POP's agenda reclaimer);
- fleet (``infra/demo/fleet.py``): pools of tagged fleet instances run jobs; finished jobs send
  termination messages, a few of them malformed, and now and then a housekeeping message arrives;
  the pool audit's standing capacity stays in place (runs-fleet);
- batching (``infra/demo/batching.py``): receivers' records accumulate (ReportStream's batching).

Progressor's demo traffic is its own job (``infra/demo/progressor.py``). One random generator
serves the whole step, in that order: the same seed makes the same traffic.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from infra.demo.batching import RecordTraffic, receiver_traffic
from infra.demo.common import demo_step
from infra.demo.fleet import FleetTraffic, fleet_traffic, standing_instances_traffic
from infra.demo.reclaim import AgendaTraffic, agenda_traffic
from pipelines.common.params import ParamsError, param, parse_params

T = TypeVar("T")


@dataclass(frozen=True)
class DemoSeed:
    """The step's random seed (a key of the job's run config): one generator for every capability."""

    seed: int | None = param(
        None, description="Random seed, for repeatable traffic (tests); empty: different every step."
    )


DEMO_PARAMS: tuple[type, ...] = (AgendaTraffic, FleetTraffic, RecordTraffic, DemoSeed)
"""The declarations of the ``demo_traffic`` job's run config: its keys are their fields (no two share a name)."""


@dataclass(frozen=True)
class DemoConfig:
    """How much traffic one step makes, per capability. The defaults are what the job's schedule
    makes at each step under ``make dev``."""

    reclaim: AgendaTraffic = field(default_factory=AgendaTraffic)
    fleet: FleetTraffic = field(default_factory=FleetTraffic)
    batching: RecordTraffic = field(default_factory=RecordTraffic)
    seed: int | None = None

    @classmethod
    def from_flat(
        cls, raw: Mapping[str, Any], parse: Callable[[type[T], Mapping[str, Any]], T] | None = None
    ) -> DemoConfig:
        """The config of the job's flat run config ``raw``: each capability's keys parsed by
        ``parse`` against its declaration (default: ``parse_params``, which raises ``ParamsError``).
        A key no capability declares is a ``ParamsError``."""
        parse = parse or (lambda kind, values: parse_params(kind, values)[0])
        known = [f.name for kind in DEMO_PARAMS for f in dataclasses.fields(kind)]
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ParamsError(f"unknown parameter(s) {', '.join(unknown)}; known: {', '.join(known)}")

        def part(kind: type[T]) -> T:
            names = {f.name for f in dataclasses.fields(kind)}
            return parse(kind, {key: value for key, value in raw.items() if key in names})

        return cls(
            reclaim=part(AgendaTraffic),
            fleet=part(FleetTraffic),
            batching=part(RecordTraffic),
            seed=part(DemoSeed).seed,
        )


@dataclass(frozen=True)
class DemoTargets:
    """Where the traffic goes: the deployed tables and queues."""

    agenda_progress_table: str
    jobs_table: str
    pools_table: str
    termination_queue_url: str
    housekeeping_queue_url: str
    receivers_table: str
    records_table: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DemoTargets:
        """The names from the contract's environment variables (``docs/contracts.md``), as
        ``make dev`` writes them to ``local.env``; the one place that maps those variables to fields."""
        return cls(
            agenda_progress_table=env["AGENDA_PROGRESS_TABLE"],
            jobs_table=env["RUNS_FLEET_JOBS_TABLE"],
            pools_table=env["RUNS_FLEET_POOLS_TABLE"],
            termination_queue_url=env["RUNS_FLEET_TERMINATION_QUEUE_URL"],
            housekeeping_queue_url=env["RUNS_FLEET_HOUSEKEEPING_QUEUE_URL"],
            receivers_table=env["RECEIVERS_TABLE"],
            records_table=env["BATCH_RECORDS_TABLE"],
        )


def run_demo_traffic(
    *, dynamodb, ec2, ssm, sqs, targets: DemoTargets, cfg: DemoConfig, now: dt.datetime | None = None
) -> dict[str, int]:
    """One step of all demo traffic; returns what it did."""
    rng, now = demo_step(cfg.seed, now)
    counts: dict[str, int] = {}
    counts.update(agenda_traffic(dynamodb, targets.agenda_progress_table, cfg.reclaim, rng, now))
    counts.update(
        fleet_traffic(
            ec2,
            ssm,
            dynamodb,
            sqs,
            jobs_table=targets.jobs_table,
            pools_table=targets.pools_table,
            termination_queue_url=targets.termination_queue_url,
            housekeeping_queue_url=targets.housekeeping_queue_url,
            traffic=cfg.fleet,
            rng=rng,
            now=now,
        )
    )
    counts.update(standing_instances_traffic(ec2))
    counts.update(
        receiver_traffic(
            dynamodb,
            receivers_table=targets.receivers_table,
            records_table=targets.records_table,
            traffic=cfg.batching,
            rng=rng,
            now=now,
        )
    )
    return counts
