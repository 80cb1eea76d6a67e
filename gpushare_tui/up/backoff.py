"""Restart delays: 1 s doubling to 60 s per consecutive failure, forgotten after 5 min healthy."""

from __future__ import annotations

from dataclasses import dataclass

FIRST_S = 1.0
MAX_S = 60.0
RESET_AFTER_S = 300.0
CRASH_LOOP_AT = 3  # consecutive failures reported as a crash loop


@dataclass
class Backoff:
    failures: int = 0  # consecutive, since the last 5 min healthy

    def on_exit(self, healthy_s: float) -> float:
        """The delay before the next start, after a run that was healthy for `healthy_s`."""
        if healthy_s >= RESET_AFTER_S:
            self.failures = 0
        self.failures += 1
        return min(MAX_S, FIRST_S * 2 ** (self.failures - 1))

    @property
    def crash_loop(self) -> bool:
        return self.failures >= CRASH_LOOP_AT
