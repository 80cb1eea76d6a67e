"""`always`: a job that is working whenever it runs (training, batch inference)."""

from __future__ import annotations

from .base import ActivitySource, Tick


class AlwaysActivity(ActivitySource):
    name = "always"

    def poll(self, tick: Tick) -> None:
        self.in_flight = True
        self.last_us = tick.now_us
