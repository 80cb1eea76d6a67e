"""Tokens (steps) per second over windows of work, and the best rate reached alone ("solo")."""

from __future__ import annotations

from collections.abc import Callable

RATE_WINDOW_S = 1.0


class StepRate:
    """An engine's decode rate, fed a running step/token count while it works.

    `rate` is the count per second over the last complete window of at least `window_s` of work;
    None until one is complete (just started, or just resumed after `idle()`: an honest "not
    measured yet" rather than a 0 that would read as stalled), 0.0 once idle. `solo` is the best
    rate of a window that began and ended with this engine the schedule's only active member
    (share 100 %: nobody to share with); None until there was one.
    """

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self.rate: float | None = None
        self.solo: float | None = None
        self._start: tuple[float, float, bool] | None = None  # (t_s, count, alone) where the window opened

    def update(self, now_s: float, count: float, alone: Callable[[], bool]) -> bool:
        """Note the count at `now_s` (monotonic s) while working; True when a window closed (a new `rate`).
        `alone` is asked only at window edges."""
        start = self._start
        if start is None:  # (re)starting work: nothing measured in this spell yet
            self._start = (now_s, count, alone())
            self.rate = None
            return False
        t0, n0, alone0 = start
        if now_s - t0 < self.window_s:
            return False
        alone1 = alone()
        self.rate = max(0, count - n0) / (now_s - t0)
        if alone0 and alone1:
            self.solo = self.rate if self.solo is None else max(self.solo, self.rate)
        self._start = (now_s, count, alone1)
        return True

    def idle(self) -> None:
        """The engine stopped working: rate 0, and the idle time is not averaged into the next window."""
        self.rate = 0.0
        self._start = None
