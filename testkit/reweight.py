"""A hostile group member that re-weights its slot every millisecond so that a joined engine's
window (slot 0) is always just behind "now" (issue 17, "Floor broken over time"), and the
measurements of that engine's achieved share: in-process (`GpuShare.pace`) and supervised
(`Supervisor`'s SIGSTOP/SIGCONT loop around a spinning child). Used by tests and bench/hostile_reweight.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from gpushare_tui.core.host.clock import mono_us, wall_us
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.schedule import v1 as schedule
from testkit.wait import wait_for

# The attacker: slot 1 beside the victim's slot 0 (weight 1). Its weight w sets the victim's share
# 1/(1+w), hence the period P = 40 ms * (1+w) in 80..400 ms; the victim's window is [0, 40 ms) of
# it. Every millisecond it picks the P that puts "now" outside that window with the longest wait.
REWEIGHTER = r"""
import sys, time
from gpushare_tui.core.registry import abi
from gpushare_tui.core.schedule import v1 as schedule
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.host.clock import wall_us
key = sys.argv[1]
by_period = {}  # period_us -> (our weight giving it, the end of the victim's window)
for p_ms in range(schedule.PERIOD_MIN_MS, schedule.PERIOD_MAX_MS + 1):
    w = abi.parse_weight(p_ms / 40 - 1)
    s = schedule.build_schedule([(0, 1.0), (1, w)])
    by_period[s.period_us] = (w, s.windows_us[0][1])
m = Membership(key, 1.0, "reweighter")
m.join()
print("joined", m.slot, flush=True)
while True:
    now = wall_us()
    best_w, best_wait = None, -1
    for period_us, (w, end_us) in by_period.items():
        pos = now % period_us
        if pos >= end_us + 1000 and period_us - pos > best_wait:
            best_w, best_wait = w, period_us - pos
    if best_w is not None:
        m.set_weight(best_w)
    m.mark_active()
    time.sleep(0.001)
"""


def start_reweighter(key: str) -> subprocess.Popen:
    """The attacker process (same uid: a member of our sharing group), joined once this returns."""
    p = subprocess.Popen(
        [sys.executable, "-c", REWEIGHTER, key],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.startswith("joined"):
        p.kill()
        raise RuntimeError(f"reweighter did not join: {line!r} {p.stderr.read() if p.stderr else ''}")
    return p


def stop(p: subprocess.Popen) -> None:
    p.terminate()
    try:
        p.wait(5)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def _two_members(key: str) -> bool:
    from gpushare_tui.core.registry.segment import Segment, shm_path

    with Segment.attach_readonly(shm_path(key)) as seg:
        return len(schedule.member_weights(seg.read_slots(), wall_us())) == 2


def pacer_share(key: str, seconds: float, step_s: float = 0.002, attacker: bool = True) -> float:
    """Fraction of wall time a `GpuShare` (slot 0, weight 1) spends running (not asleep in pace()),
    its `step_s` steps spinning the CPU, beside the reweighter (or alone)."""
    from gpushare_tui import GpuShare

    with GpuShare(weight=1.0, name="victim", gpu_key=key, control=False) as share:
        assert share.slot == 0
        share.pace()
        p = start_reweighter(key) if attacker else None
        try:
            if p is not None:
                wait_for(lambda: _two_members(key), 10, what="two members")
            t0, slept0 = mono_us(), share.slept_us
            while mono_us() - t0 < seconds * 1e6:
                end = time.perf_counter() + step_s
                while time.perf_counter() < end:
                    pass
                share.pace()
            elapsed = mono_us() - t0
            return 1.0 - (share.slept_us - slept0) / elapsed
        finally:
            if p is not None:
                stop(p)


class _TimedSupervisor:
    """A Supervisor (core/engines/supervisor.py) pacing a spinning child, counting the time it is continued."""

    def __init__(self, key: str) -> None:
        from gpushare_tui.core.engines import llama_server as ls
        from gpushare_tui.core.engines.supervisor import Supervisor

        outer = self

        class Timed(Supervisor):
            def _suspend(self) -> None:
                was = self._stopped
                super()._suspend()
                if not was:
                    outer.running_us += mono_us() - outer.since_us
                    outer.since_us = mono_us()

            def _resume(self, force: bool = False) -> None:
                was = self._stopped
                super()._resume(force)
                if was:
                    outer.since_us = mono_us()

        self.running_us = 0
        self.since_us = mono_us()
        args = ls.EngineArgs(argv=(), host="127.0.0.1", port=1, model=None, port_chosen=False)
        self.sup = Timed(args, gpu_key=key, weight=1.0, name="victim", log_path=os.devnull, say=lambda _: None)
        self.child = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        self.sup.proc = self.child
        self.sup.membership = Membership(key, 1.0, "victim", pid=self.child.pid)

    def close(self) -> None:
        self.sup._quit.set()
        os.killpg(self.child.pid, 18)  # SIGCONT: never leave it stopped
        self.child.kill()
        self.child.wait()
        if self.sup.membership is not None:
            self.sup.membership.leave()


def supervisor_share(key: str, seconds: float) -> tuple[float, float]:
    """(fraction of wall time the supervised child was continued, its CPU time over that of the
    same child unpaced for the same span just before) beside the reweighter."""
    import psutil

    t = _TimedSupervisor(key)
    try:
        m = t.sup.membership
        assert m is not None
        assert m.join() == 0
        m.mark_active()
        proc = psutil.Process(t.child.pid)

        def cpu() -> float:
            c = proc.cpu_times()
            return c.user + c.system

        c0, w0 = cpu(), time.monotonic()
        time.sleep(1.0)
        solo = (cpu() - c0) / (time.monotonic() - w0)
        p = start_reweighter(key)
        try:
            wait_for(lambda: _two_members(key), 10, what="two members")
            marker_stop = threading.Event()

            def keep_active() -> None:
                while not marker_stop.wait(0.2):
                    m.mark_active()

            marker = threading.Thread(target=keep_active, daemon=True)
            marker.start()
            loop = threading.Thread(target=t.sup._pace_loop, daemon=True)
            c0, t0 = cpu(), mono_us()
            t.running_us, t.since_us = 0, t0
            loop.start()
            time.sleep(seconds)
            t.sup._quit.set()
            loop.join(5)
            marker_stop.set()
            elapsed = mono_us() - t0
            running = t.running_us + (0 if t.sup._stopped else mono_us() - t.since_us)
            t.sup._resume(force=True)
            return running / elapsed, (cpu() - c0) / (elapsed / 1e6) / solo
        finally:
            stop(p)
    finally:
        t.close()
