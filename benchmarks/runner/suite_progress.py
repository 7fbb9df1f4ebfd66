"""Progress across a suite: why its runs go one at a time or side by side, which run of how many
has ended, the time so far and an estimate of the time left (``benchmarks.run_suite`` closes with
the total).

The estimate is what the runs computed so far took: a run left takes the mean of the finished
runs of its strategy and dataset, else of every run finished (then the estimate is a lower bound,
said "at least"), and ``workers`` runs go at once. Runs found finished take no time and teach
nothing. Nothing here changes a run or its result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from benchmarks.runner.run_spec import RunSpec


def duration(seconds: float) -> str:
    """``42 s``, ``7 min``, ``2 h 05 min``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def why_workers(
    count: int, setting: object, named: str | None, device: str, idle: int | None, runs: int
) -> str:
    """Why the suite's runs go ``count`` at a time: the launcher the command names, the workers it
    or the suite asks for (``setting``: a number or "auto"), and for "auto" the idle cores
    (``idle``) or the device. One clause, for the start line."""
    at_once = "one run at a time" if count == 1 else f"{count} runs at once in local worker processes"
    if named == "inline":
        return f"{at_once} (--launcher inline)"
    if setting == "auto":
        if device != "cpu":
            return f"{at_once} (workers = auto: one on {device}; --workers N or --gpus to run more)"
        if idle is None:
            reason = "one per idle core"
        elif idle < 1:
            reason = "no core is idle now (other processes keep them busy), so one"
        else:
            reason = f"one per idle core, {idle} idle" + (
                f", capped by the {runs} run(s)" if idle > runs else ""
            )
        return f"{at_once} (workers = auto: {reason})"
    if count == 1:
        return f'{at_once} (workers = {setting}; --workers N or workers = "auto" in the suite to share cores)'
    return f"{at_once} (workers = {setting})"


@dataclass
class SuiteProgress:
    """The clock of one command over ``runs``, ``workers`` at a time: ``ended`` after each run
    gives the tail of the line that says so."""

    runs: list[RunSpec]
    workers: int = 1
    started: float = -1.0  # time.monotonic() when made, unless given
    seconds: dict[str, float] = field(default_factory=dict)  # run key -> seconds, the runs computed here
    ended_keys: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.started < 0:
            self.started = time.monotonic()

    def ended(self, spec: RunSpec, seconds: float | None) -> str:
        """Record that ``spec`` ended (``seconds``: how long it computed here; None: found finished,
        or computed elsewhere) and say where the suite stands: ``run 3 of 10, 4 min so far, about
        12 min left``."""
        key = str(spec.key)
        if key not in self.ended_keys:
            self.ended_keys.append(key)
        if seconds is not None:
            self.seconds[key] = seconds
        left, guessed = self.left(), self.unseen_kinds()
        estimate = ""
        if left:  # a run of a strategy and dataset not yet timed may take any time: a lower bound
            estimate = f", {'at least' if guessed else 'about'} {duration(left)} left"
        return f"run {len(self.ended_keys)} of {len(self.runs)}, {duration(self.elapsed())} so far{estimate}"

    def unseen_kinds(self) -> bool:
        """Whether a run left is of a strategy and dataset that no run computed here has timed."""
        timed = {(s.strategy, s.dataset) for s in self.runs if str(s.key) in self.seconds}
        return any(
            (s.strategy, s.dataset) not in timed for s in self.runs if str(s.key) not in self.ended_keys
        )

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float | None:
        """Seconds the runs not yet ended take, ``workers`` at a time; None before any run computed."""
        if not self.seconds:
            return None
        by_kind: dict[tuple[str, str], list[float]] = {}
        for spec in self.runs:
            if str(spec.key) in self.seconds:
                by_kind.setdefault((spec.strategy, spec.dataset), []).append(self.seconds[str(spec.key)])
        overall = sum(self.seconds.values()) / len(self.seconds)
        total = 0.0
        for spec in self.runs:
            if str(spec.key) not in self.ended_keys:
                samples = by_kind.get((spec.strategy, spec.dataset))
                total += sum(samples) / len(samples) if samples else overall
        return total / self.workers
