"""Clocks: the shared one, CLOCK_REALTIME µs (spec §3: peers compare them), and a monotonic one."""

from __future__ import annotations

import time
from collections.abc import Callable

ClockUs = Callable[[], int]


def wall_us() -> int:
    return time.time_ns() // 1000


def mono_us() -> int:
    """Monotonic µs: for intervals a process measures for itself (activity window, cadences,
    rate windows), which a step of the wall clock must not stretch or shrink (spec §4)."""
    return time.monotonic_ns() // 1000
