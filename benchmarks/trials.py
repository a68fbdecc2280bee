"""Repeated, interleaved, verified measurements: how every benchmark here times its variants.

A benchmark names its variants and gives one function that runs a variant once from fresh work and
returns a :class:`Run`: the seconds it took, the work **verified** done (read back, never what the
variant reported), what is missing, and its API calls. :func:`interleaved` runs ``repeat`` rounds;
each round runs every variant once, and the order rotates by one each round (round r starts with
variant r mod n), so that no variant always runs first, last or beside the same neighbour on a
shared machine. Figures are then, per variant, the min / median / max seconds over the rounds, the
median rate (work verified / seconds), and the ratio to a baseline variant taken **per round**
(each variant against the baseline run of its own round, minutes apart at most), reported as its
median and range. A run that left work undone makes its variant fail (``ok`` false); its rounds
still show, and no ratio is taken from them.

:func:`machine_line` and :func:`loadavg` give the header every result carries: the command, the
date, the cores, and the load average before and after (the machine is shared: read the ratios).
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class Run:
    """One run of one variant: ``done`` is the work verified done; ``problems`` what was not."""

    seconds: float
    done: int
    problems: list[str] = field(default_factory=list)
    calls: int | None = None
    detail: dict = field(default_factory=dict)  # calls by operation, or other counts
    note: str = ""
    extra: dict = field(default_factory=dict)  # anything else a benchmark reports (phases, e2e, ...)
    round: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0


def order(variants: Sequence[str], round_index: int) -> list[str]:
    """The variants in round ``round_index``'s order: rotated by one per round."""
    k = round_index % len(variants)
    return [*variants[k:], *variants[:k]]


def interleaved(
    variants: Sequence[str],
    repeat: int,
    run_once: Callable[[str, int], Run],
    *,
    label: str = "",
    log=None,
) -> dict[str, list[Run]]:
    """Run every variant ``repeat`` times, in rotating order; returns each variant's runs by round.

    ``run_once(variant, round)`` prepares fresh work, runs the variant, verifies what it did and
    returns the :class:`Run`. An exception from it is recorded as a failed run (its message is the
    problem), so one crash does not lose the other variants' figures."""
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    results: dict[str, list[Run]] = {v: [] for v in variants}
    for r in range(repeat):
        for variant in order(variants, r):
            try:
                run = run_once(variant, r)
            except Exception as exc:  # noqa: BLE001 (recorded as a failed run)
                run = Run(seconds=0.0, done=0, problems=[f"raised {type(exc).__name__}: {str(exc)[:200]}"])
            run.round = r
            results[variant].append(run)
            state = "ok" if run.ok else "FAILED: " + "; ".join(run.problems)
            calls = f", {run.calls:,} calls" if run.calls is not None else ""
            log(f"  {label}{variant} round {r + 1}/{repeat}: {run.done:,} verified, {run.seconds:.2f}s{calls}; {state}")
    return results


@dataclass
class Spread:
    low: float
    median: float
    high: float

    def fmt(self, digits: int = 2) -> str:
        return f"{self.median:.{digits}f} ({self.low:.{digits}f}-{self.high:.{digits}f})"


def spread(values: Sequence[float]) -> Spread | None:
    values = list(values)
    if not values:
        return None
    return Spread(min(values), statistics.median(values), max(values))


def ok(runs: Sequence[Run]) -> bool:
    return bool(runs) and all(r.ok for r in runs)


def ratios(results: dict[str, list[Run]], variant: str, baseline: str) -> list[float]:
    """``variant``'s rate over ``baseline``'s, round by round (rounds where both did all their work)."""
    base = {r.round: r for r in results.get(baseline, []) if r.ok and r.rate}
    return [r.rate / base[r.round].rate for r in results[variant] if r.ok and r.round in base]


def calls_per_item(runs: Sequence[Run]) -> str:
    per = sorted({round(r.calls / r.done, 3) for r in runs if r.calls is not None and r.done})
    if not per:
        return "n/a"
    return f"{per[0]:.3f}" if len(per) == 1 else f"{per[0]:.3f}-{per[-1]:.3f}"


def table(
    results: dict[str, list[Run]],
    *,
    baseline: str | None,
    unit: str,
    labels: dict[str, str] | None = None,
    digits: int = 2,
) -> list[str]:
    """A markdown table: per variant the runs, work verified per run, seconds min / median / max, median
    rate, the per-round ratio to ``baseline`` (median and range), calls per item and the check."""
    labels = labels or {}
    base_label = labels.get(baseline, baseline) if baseline else None
    out = [
        f"| variant | runs | verified per run | s min | s median | s max | {unit}/s (median) | "
        f"vs {base_label or 'baseline'}: median (range), per round | calls per item | check |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for variant, runs in results.items():
        seconds = spread([r.seconds for r in runs if r.ok]) or spread([r.seconds for r in runs])
        rates = spread([r.rate for r in runs if r.ok])
        done = sorted({r.done for r in runs})
        done_s = f"{done[0]:,}" if len(done) == 1 else f"{done[0]:,}-{done[-1]:,}"
        if baseline is None:
            ratio = ""
        elif variant == baseline:
            ratio = "1.00"
        else:
            rs = spread(ratios(results, variant, baseline))
            ratio = rs.fmt() if rs else "n/a"
        failed = [f"round {r.round + 1}: " + "; ".join(r.problems) for r in runs if not r.ok]
        check = "ok" if not failed else "**FAILED**: " + " / ".join(failed)
        out.append(
            f"| {labels.get(variant, variant)} | {len(runs)} | {done_s} | {seconds.low:.{digits}f} | "
            f"{seconds.median:.{digits}f} | {seconds.high:.{digits}f} | "
            f"{(rates.median if rates else 0):,.1f} | {ratio} | {calls_per_item(runs)} | {check} |"
        )
    return out


def all_ok(*result_sets: dict[str, list[Run]]) -> bool:
    return all(ok(runs) for results in result_sets for runs in results.values())


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg gives them."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_line(script: str, argv: Sequence[str] | None = None) -> str:
    """``Command: ...; date; cores; load average before`` for the head of a benchmark's output."""
    argv = sys.argv[1:] if argv is None else argv
    command = " ".join([".venv/bin/python", f"benchmarks/{script}", *argv])
    return (
        f"Command: `{command}`; {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; "
        f"load average before: {loadavg()}"
    )


def after_line() -> str:
    return f"load average after: {loadavg()} ({dt.datetime.now(dt.UTC):%H:%M} UTC)"
