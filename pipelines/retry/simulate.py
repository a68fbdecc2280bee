"""The simulator: what a policy means in wall-clock time."""

from dataclasses import dataclass

from pipelines.retry.policy import STOP, RetryPolicy


@dataclass(frozen=True)
class Step:
    """The wait before ``attempt`` (1-based), after ``attempt - 1`` attempts failed."""

    attempt: int
    delay: float  # nominal, without jitter
    low: float  # shortest delay jitter can give
    high: float  # longest delay jitter can give
    cumulative: float  # nominal time from the first failure's start to this attempt
    worst_case: float  # cumulative of ``high``


@dataclass(frozen=True)
class Timeline:
    steps: tuple[Step, ...]
    stopped: bool  # the policy said STOP (rather than the simulation running out of attempts)

    @property
    def attempts(self) -> int:
        return 1 + len(self.steps)

    @property
    def total(self) -> float:
        return self.steps[-1].cumulative if self.steps else 0.0

    @property
    def worst_case(self) -> float:
        return self.steps[-1].worst_case if self.steps else 0.0

    def sketch(self, width: int = 20) -> str:
        """The attempts on a line, ``●`` at each attempt's start (nominal, scaled to this policy's
        total time), ``…`` at the end when the simulation ran out before the policy stopped."""
        line = ["─"] * (width if self.steps else 1)
        for cumulative in (0.0, *(s.cumulative for s in self.steps)):
            line[round(cumulative / self.total * (width - 1)) if self.total else 0] = "●"
        return "".join(line) + ("" if self.stopped else "…")

    def to_markdown(self) -> str:
        head = "| attempt | wait before it | jitter range | cumulative | worst case |\n|---:|---:|---:|---:|---:|\n"
        rows = "| 1 | 0s (first run) | - | 0s | 0s |\n" + "".join(
            f"| {s.attempt} | {human(s.delay)} | {human(s.low)} - {human(s.high)} | "
            f"{human(s.cumulative)} | {human(s.worst_case)} |\n"
            for s in self.steps
        )
        tail = "" if self.stopped else f"| ... | (simulation stops at {self.attempts} attempts) | | | |\n"
        return head + rows + tail


def timeline(policy: RetryPolicy, attempts: int | None = None) -> Timeline:
    """Every wait, the cumulative time and the worst case with jitter, for up to ``attempts`` in all
    (default: ``max_attempts``, or 30 when unlimited). A failing delay function raises here."""
    limit = max(attempts if attempts is not None else (policy.max_attempts or 30), 1)
    steps: list[Step] = []
    cumulative = worst = 0.0
    for n in range(1, limit):
        if (nominal := policy.nominal(n)) is STOP or (bounds := policy.bounds(n)) is STOP:
            break
        low, high = bounds
        cumulative += nominal
        worst += high
        steps.append(Step(attempt=n + 1, delay=nominal, low=low, high=high, cumulative=cumulative, worst_case=worst))
    return Timeline(steps=tuple(steps), stopped=policy.nominal(len(steps) + 1) is STOP)


def human(seconds: float) -> str:
    """``95`` -> ``1m35s``; ``90061`` -> ``1d1h1m1s``; fractions kept below a minute."""
    if seconds == float("inf"):
        return "inf"
    if seconds < 60:
        return f"{seconds:.3g}s" if seconds != int(seconds) else f"{int(seconds)}s"
    total = int(round(seconds))
    amounts = (total // 86_400, total % 86_400 // 3600, total % 3600 // 60, total % 60)
    return "".join(f"{amount}{unit}" for amount, unit in zip(amounts, "dhms", strict=True) if amount)
