"""The shared clock: CLOCK_REALTIME microseconds (spec §3: peers compare them)."""

from __future__ import annotations

import time
from collections.abc import Callable

ClockUs = Callable[[], int]


def wall_us() -> int:
    return time.time_ns() // 1000
