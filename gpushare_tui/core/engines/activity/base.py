"""The one interface every activity source implements."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ...host.budgets import SAMPLED_PROBE_CPU_FRACTION
from ...registry import abi


@dataclass(frozen=True)
class Tick:
    """What the supervisor knows at one monitor step. Times are monotonic µs: `now_us`; `run_us`,
    the engine's total continued (not stopped) time so far, a counter (CPU use is measured against
    it: a paced engine's stopped spells must not dilute its reading); `running`: not stopped now;
    `active`: our slot's flag as it is now; `may_probe()`: whether an HTTP probe may go out now
    (continued, and not about to be stopped: a stopped engine answers nothing)."""

    now_us: int
    run_us: int
    running: bool
    active: bool
    may_probe: Callable[[], bool]


class ProbeCost:
    """The CPU time (this thread's) one probe costs, fetch and parse, smoothed over the last few;
    `interval_us(nominal_us)` stretches a probe interval so probes cost at most `fraction` of a core
    (budgets.SAMPLED_PROBE_CPU_FRACTION)."""

    def __init__(self, fraction: float = SAMPLED_PROBE_CPU_FRACTION) -> None:
        self.fraction = fraction
        self.cost_us: float | None = None
        self._t0_ns = 0

    def start(self) -> None:
        self._t0_ns = time.thread_time_ns()

    def stop(self) -> None:
        cost_us = (time.thread_time_ns() - self._t0_ns) / 1000
        self.cost_us = cost_us if self.cost_us is None else (self.cost_us + cost_us) / 2

    def interval_us(self, nominal_us: int) -> int:
        return nominal_us if self.cost_us is None else max(nominal_us, int(self.cost_us / self.fraction))


class ActivitySource:
    """One source. `last_us`: the latest monotonic µs the engine is known to have worked (None:
    never); `in_flight`: work in flight right now as last seen (a paced engine's work stays in
    flight while it is stopped)."""

    name = "?"

    def __init__(self) -> None:
        self.last_us: int | None = None
        self.in_flight = False

    def poll(self, tick: Tick) -> None:
        """Look at the engine (bounded: at most one probe's budget)."""

    def is_active(self, now_us: int) -> bool:
        return self.last_us is not None and now_us - self.last_us <= abi.ACTIVITY_WINDOW_US

    def take_work_total(self) -> float | None:
        """A counter of work done, fresh since the last call (None: nothing new, or no counter)."""
        return None

    @property
    def counts_work(self) -> bool:
        """Whether `take_work_total` ever gives one (else tok/s is unknown)."""
        return False

    def close(self) -> None:
        """Release what the source holds (an HTTP client)."""
