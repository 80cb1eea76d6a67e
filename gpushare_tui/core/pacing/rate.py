"""Tokens (steps) per second over windows of work, and the best rate reached alone ("solo")."""

from __future__ import annotations

from collections.abc import Callable

RATE_WINDOW_S = 1.0
ALONE_CHECK_S = 0.25  # within a window, `alone` is asked again at most this often (it reads the registry)
# A shared window faster than this × the solo reference shows the reference was no solo rate (measured
# while the host was loaded by something the registry does not show): it is dropped (speed vs solo "-").
SOLO_BEATEN_RATIO = 1.25  # above noise: rates on a loaded 2-core host wander ±20 % from one window to the next


class StepRate:
    """An engine's decode rate, fed a running step/token count while it works.

    `rate` is the count per second over the last complete window of at least `window_s` of work;
    None until one is complete (just started, or just resumed after `idle()`: an honest "not
    measured yet" rather than a 0 that would read as stalled), 0.0 once idle. `solo` is the best
    rate of a window during which this engine ran alone (`alone()` true when the window opened, when
    it closed and at every check in between, at most ALONE_CHECK_S apart while updates come): one
    measured while another engine ran, even for part of the window, would be a shared rate and make
    every later speed vs solo read high. A shared window more than SOLO_BEATEN_RATIO × `solo` drops it
    (None again): a shared rate cannot beat a true solo one, so that `solo` was measured slowed by
    something the registry does not show (another load on the host). None until there was one.
    """

    def __init__(self, window_s: float = RATE_WINDOW_S, alone_check_s: float = ALONE_CHECK_S) -> None:
        self.window_s = window_s
        self.alone_check_s = alone_check_s
        self.rate: float | None = None
        self.solo: float | None = None
        self._start: tuple[float, float] | None = None  # (t_s, count) where the window opened
        self._alone = False  # every check of the open window said alone
        self._checked_s = 0.0  # when `alone` was last asked

    def update(self, now_s: float, count: float, alone: Callable[[], bool]) -> bool:
        """Note the count at `now_s` (monotonic s) while working; True when a window closed (a new `rate`).
        `alone` is asked once at each window edge, and in between at most every `alone_check_s` while
        every earlier check of the window said alone."""
        start = self._start
        if start is None:  # (re)starting work: nothing measured in this spell yet
            self._start, self._alone, self._checked_s = (now_s, count), alone(), now_s
            self.rate = None
            return False
        t0, n0 = start
        if now_s - t0 < self.window_s:
            if self._alone and now_s - self._checked_s >= self.alone_check_s:
                self._alone, self._checked_s = alone(), now_s
            return False
        edge = alone()  # closes this window and opens the next
        self.rate = max(0, count - n0) / (now_s - t0)
        if self._alone and edge:
            self.solo = self.rate if self.solo is None else max(self.solo, self.rate)
        elif self.solo is not None and self.rate > SOLO_BEATEN_RATIO * self.solo:
            self.solo = None
        self._start, self._alone, self._checked_s = (now_s, count), edge, now_s
        return True

    def idle(self) -> None:
        """The engine stopped working: rate 0, and the idle time is not averaged into the next window."""
        self.rate = 0.0
        self._start = None
