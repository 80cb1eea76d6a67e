"""GpuShare's DEMAND (spec §7): pace() raises it, idle() drops it at once, `with share.busy():` holds
it for the block, and it drops DEMAND_TIMEOUT_S after the last pace() of a loop that just stops."""

from __future__ import annotations

import threading
import time

from gpushare_tui.core.pacing.share import DEMAND_TIMEOUT_S, GpuShare
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.registry.segment import Segment
from testkit.shm import shm_file


def _flags(key: str, slot: int) -> int:
    with Segment.attach_readonly(shm_file(key)) as ro:
        return ro.read_slot(slot).flags


def _demand(key: str, slot: int | None) -> bool:
    assert slot is not None
    return bool(_flags(key, slot) & abi.FLAG_DEMAND)


def test_every_share_sets_ext1_and_pace_raises_demand_until_the_timeout(gpu_key: str) -> None:
    with GpuShare(1.0, "d", gpu_key=gpu_key, control=False) as share:
        assert _flags(gpu_key, share.slot) == abi.FLAG_EXT1  # type: ignore[arg-type]
        share.pace()
        t0 = time.monotonic()
        assert _demand(gpu_key, share.slot)
        while _demand(gpu_key, share.slot) and time.monotonic() - t0 < 5:
            time.sleep(0.005)
        dropped = time.monotonic() - t0
        assert DEMAND_TIMEOUT_S * 0.9 <= dropped <= DEMAND_TIMEOUT_S + 0.5, dropped


def test_idle_drops_demand_at_once(gpu_key: str) -> None:
    with GpuShare(1.0, "d", gpu_key=gpu_key, control=False) as share:
        share.pace()
        share.idle()
        assert not _demand(gpu_key, share.slot)
        assert not share.membership.active


def test_busy_holds_demand_for_the_block(gpu_key: str) -> None:
    with GpuShare(1.0, "d", gpu_key=gpu_key, control=False) as share:
        with share.busy():
            assert _demand(gpu_key, share.slot)  # before any pace(): the work arrived
            time.sleep(DEMAND_TIMEOUT_S * 2)
            assert _demand(gpu_key, share.slot)  # no timeout inside the block
        assert not _demand(gpu_key, share.slot)
        with share.busy():
            share.pace()
        assert _demand(gpu_key, share.slot)  # paced just now: the timeout drops it
        share.idle()
        assert not _demand(gpu_key, share.slot)


def test_pace_keeps_demand_while_it_waits_for_a_priority_member(gpu_key: str) -> None:
    with GpuShare(1.0, "batch", gpu_key=gpu_key, control=False) as share:
        prio = Membership(gpu_key, 1.0, "interactive", interactive=True)
        prio.join()
        try:
            prio.set_demand(True)
            done = threading.Event()
            slept: list[int] = []
            t = threading.Thread(target=lambda: (slept.append(share.pace(1_000)), done.set()))
            t.start()
            time.sleep(DEMAND_TIMEOUT_S * 3)
            assert not done.is_set() and _demand(gpu_key, share.slot)  # waiting, with its work in flight
            t_drop = time.monotonic()
            prio.set_demand(False)
            assert done.wait(5)
            assert time.monotonic() - t_drop < 0.5  # resumes within a re-read (WAIT_REREAD_US; loaded box)
            assert slept[0] >= DEMAND_TIMEOUT_S * 3 * 1e6 * 0.9
            t.join()
        finally:
            prio.leave()
