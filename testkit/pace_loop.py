"""A supervisor's pace loop for tests, its engine a flag instead of a process."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from gpushare_tui.core.engines.pace_loop import PaceLoop
from gpushare_tui.core.registry.membership import Membership


def flagged_loop(
    me: Membership, clock: Callable[[], int], sleep_s: Callable[[float], object], **kw: Any
) -> tuple[PaceLoop, list[bool]]:
    """A pace loop for `me` on the test's clock (wall and monotonic alike) and sleep, whose engine is a flag:
    `stopped[0]`, set by its SIGSTOP. `kw`: PaceLoop's other arguments (`alive` defaults to always)."""
    stopped = [False]
    kw.setdefault("alive", lambda: True)
    loop = PaceLoop(
        me,
        quit_event=threading.Event(),
        stop=lambda: stopped.__setitem__(0, True),
        cont=lambda: stopped.__setitem__(0, False),
        stopped=lambda: stopped[0],
        lateness_us=deque(),
        clock_us=clock,
        mono_us=clock,
        sleep_s=sleep_s,
        **kw,
    )
    return loop, stopped
