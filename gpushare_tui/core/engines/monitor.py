"""The supervisor's monitor: what an engine is doing, read at a slow cadence in a thread of its own.

Activity (the source: is there work now, core/engines/activity/), DEMAND for an engine without the front
proxy, `active`, tok/s, the busy fraction it shows (NVML utilisation of its tree, else its CPU share), the
busy_ppm a batch engine publishes, and the escaped descendants of its tree (process_group). It measures no
device time: that is the pace loop's (the engine's continued time while working, pace_loop.py), and an
interactive engine's busy_ppm is its PRIORITY budget's, published by the pacing policy with its bit."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..host.clock import mono_us, wall_us
from ..observe.snapshot import runs_alone
from ..pacing.policy import BUSY_WINDOW_US
from ..pacing.rate import StepRate
from ..registry.membership import Membership
from . import activity
from .declaration import ActivitySpec
from .process_group import EngineGroup

MONITOR_TICK_S = 0.050
# A proxied engine's DEMAND is its proxy's, exact; while it is active the monitor only keeps `active` (2 s window)
# and the rates fresh, so it ticks slower: each tick costs ~300 µs of CPU with the caches cold beside busy engines
# (measured on 2 vCPUs: 21-23 wake-ups a second, 7.4 ms of CPU a second), taken from the engines on a CPU box.
MONITOR_PROXIED_ACTIVE_TICK_S = 0.250
GpuBusy = Callable[[Sequence[int], int], float | None]  # (the tree's pids, since wall µs) -> summed SM % or None


@dataclass
class EngineStatus:
    state: str = "loading"  # loading / running / exited (paced pauses are not a state: see EngineGroup.suspend)
    tok_s: float | None = None  # see core.rate.StepRate
    solo_tok_s: float | None = None
    busy_pct: float = 0.0
    exit_code: int | None = None


@dataclass
class _MonitorState:
    """What the monitor keeps between its steps (built once, in its thread)."""

    tree: activity.ProcessTree
    source: activity.ActivitySource
    rate: StepRate
    cpu_stats: activity.CpuMeter
    cores: int
    next_stats_us: int  # monotonic µs of the next busy tick
    probe_refused: bool = False  # this step's due probe was refused (the engine stopped, or about to be)


class Monitor:
    """`run` in its thread until `quit` is set or the engine exits. `proxied`: the front proxy publishes
    DEMAND (else the activity source does, here). `may_probe`: whether the engine may be probed now (not
    stopped, not too near its window's end)."""

    def __init__(
        self,
        membership: Membership,
        proc: subprocess.Popen,
        group: EngineGroup,
        status: EngineStatus,
        *,
        activity_spec: ActivitySpec,
        base_url: str | None,
        gpu_busy: GpuBusy | None,
        proxied: bool,
        may_probe: Callable[[], bool],
        quit_event: threading.Event,
        say: Callable[[str], None],
    ) -> None:
        self._m, self._proc, self._group, self._status = membership, proc, group, status
        self._spec, self._base_url, self._gpu_busy = activity_spec, base_url, gpu_busy
        self._proxied, self._may_probe, self._quit, self._say = proxied, may_probe, quit_event, say
        self._in_flight = False  # DEMAND as last published here (not proxied)

    def run(self) -> None:
        """Activity, DEMAND, busy and tok/s. The llama source probes /metrics every 50 ms while idle, so
        `active` rises within ~100 ms of the first decode, and once a second while active (each probe costs
        the engine throughput; its CPU time carries "still decoding" between); other sources:
        core/engines/activity/. Stopped spells (at most (1 - share) * 400 ms) are bridged by the 2 s
        activity window.

        No dependency of it ends it silently: an OSError in a step (EMFILE with the fd limit reached, a
        /proc file gone) skips that step, says so in one line (and once more when steps succeed again),
        and the next tick tries again; pacing never waits for it. Any other exception is a bug: one line,
        and the supervisor stops (the engine is ended in order)."""
        state: _MonitorState | None = None
        failing: str | None = None  # the error steps fail with, as said
        try:
            while not self._quit.is_set() and self._proc.poll() is None:
                try:
                    if state is None:  # built here: an HTTP client is made (it may need fds too)
                        state = self._state()
                    self._step(state)
                    if failing is not None:
                        self._say("gpushare-tui: monitor: readings resumed (pacing went on meanwhile)")
                        failing = None
                except OSError as e:
                    if failing is None:
                        failing = f"{type(e).__name__}: {e}"
                        self._say(
                            f"gpushare-tui: monitor: {failing}; activity and busy readings skipped until it"
                            " clears (pacing goes on)"
                        )
                # A probe refused (stopped, or too near the window's end) goes out as the engine is next
                # continued: ticking blindly, a short window (a 1:2 peer's 40 ms leaves 9.5 ms to start one)
                # was probed about once a second, and a gauge read between requests then let its activity
                # lapse (both ran unpaced)
                tick_s = MONITOR_PROXIED_ACTIVE_TICK_S if self._proxied and self._m.active else MONITOR_TICK_S
                if state is not None and state.probe_refused:
                    self._group.wait_continued(tick_s)
                else:
                    self._quit.wait(tick_s)  # a stop is not kept waiting for the tick
        except Exception as e:  # a bug: said in one line, and the engine is ended in order
            self._say(f"gpushare-tui: monitor thread failed ({type(e).__name__}: {e}): stopping the engine")
            self._quit.set()
        finally:
            if state is not None:
                state.source.close()

    def _state(self) -> _MonitorState:
        tree = activity.ProcessTree(self._proc.pid)
        source = activity.make_source(
            self._spec, tree=tree, base_url=self._base_url, gpu_util=self._gpu_busy, say=self._say
        )
        try:
            cpu_stats = activity.CpuMeter(tree, min_span_us=0)
            cpu_stats.cores(mono_us())
        except BaseException:
            source.close()
            raise
        return _MonitorState(tree, source, StepRate(), cpu_stats, tree.cores(), mono_us() + BUSY_WINDOW_US)

    def _step(self, st: _MonitorState) -> None:
        m, source, rate, tree = self._m, st.source, st.rate, st.tree
        mono = mono_us()  # activity and cadences: monotonic; a wall-clock step must not keep it active
        t = mono / 1e6
        st.probe_refused = False

        def may_probe() -> bool:
            ok = self._may_probe()
            st.probe_refused = st.probe_refused or not ok
            return ok

        stopped = self._group.stopped
        source.poll(activity.Tick(mono, self._group.run_us(), not stopped, m.active, may_probe))
        # DEMAND (spec §7). Proxied (llama-server), the proxy publishes it at each request's start
        # and end, counting through stops. A sampled source (a gauge, CPU readings) cannot see the
        # end of work exactly: a reading between two back-to-back requests reads 0 (measured: 40 %
        # of a loaded 2:1 pair's samples lost DEMAND, and the pair ran 1.06:1), so its DEMAND
        # follows its activity window, as v1's `active` does; kept while stopped (§7).
        demand = source.is_active(mono)
        if not self._proxied and demand != self._in_flight and (demand or not self._group.stopped):
            self._in_flight = demand
            m.set_demand(demand)
        n_work = source.take_work_total()
        if source.is_active(mono):
            m.mark_active(source.last_us)
            if n_work is not None:  # rate windows span work only: idle time is not averaged in
                rate.update(t, n_work, lambda: runs_alone(m.read_slots(), m.slot, wall_us()))
        elif m.active:
            m.mark_idle()
            rate.idle()
        if source.counts_work:  # None: working, first window not complete
            self._status.tok_s = rate.rate if m.active else 0.0
            self._status.solo_tok_s = rate.solo
        if mono < st.next_stats_us:
            return
        st.next_stats_us = mono + BUSY_WINDOW_US
        since_us = wall_us() - BUSY_WINDOW_US  # NVML samples carry wall-clock stamps
        pids = tree.pids()
        self._group.track_escaped(pids)
        busy = self._gpu_busy(pids, since_us) if self._gpu_busy else None
        used = st.cpu_stats.cores(mono_us())
        frac = busy / 100 if busy is not None else min(1.0, (used or 0.0) / st.cores)
        self._status.busy_pct = 100 * frac
        if not m.interactive:  # an interactive engine's busy_ppm is its PRIORITY budget's (the pacing policy)
            m.set_busy_ppm(int(frac * 1_000_000))
