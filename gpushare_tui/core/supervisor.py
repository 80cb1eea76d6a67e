"""Supervisor: weighted TDM for an unmodified engine process, from outside.

It owns one registry slot on behalf of the engine (slot pid = engine pid) and
enforces the schedule with SIGCONT at the window start and SIGSTOP at its end.
An idle engine, a lone engine, or one whose peers are all idle is never
stopped. Every exit path continues the engine; if the supervisor is SIGKILLed,
the kernel sends the engine SIGCONT (PR_SET_PDEATHSIG) so it is never left
stopped — it then runs on unpaced until someone stops it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import psutil

from . import abi, schedule, schedule_ext1
from .activity import EngineActivity
from .clock import mono_us, wall_us
from .control import ControlServer, SignalLateness, StatusReply, control_handlers
from .engines import llama_server as ls
from .errors import EngineError
from .ownership import Owner
from .pacer import BUSY_WINDOW_US, RegistryReader
from .rate import StepRate
from .registry import Membership
from .snapshot import own_peer, sole_member

RECHECK_US = 20_000  # re-read the registry at least this often
UNTHROTTLED_POLL_S = 0.025  # each wake-up disturbs the engine's threads
STOP_LEAD_US = 500  # stop this long before our window ends (see run_until)
MONITOR_TICK_S = 0.050
CPU_ACTIVE_CORES = 0.25  # engine CPU use (in cores) that counts as decoding
PROBE_TIMEOUT_S = 0.25
PROBE_MARGIN_US = 30_000  # don't start a probe this close to our window's end
STOP_GRACE_S = 10.0
MONITOR_JOIN_S = 5.0  # its longest step: building the HTTP client, or one probe (PROBE_TIMEOUT_S)


@dataclass
class EngineStatus:
    state: str = "loading"  # loading / running / exited (paced pauses are not a state: see _suspend)
    tok_s: float | None = None  # see core.rate.StepRate
    solo_tok_s: float | None = None
    busy_pct: float = 0.0
    exit_code: int | None = None


class Supervisor:
    def __init__(
        self,
        args: ls.EngineArgs,
        *,
        gpu_key: str,
        weight: float,
        name: str,
        log_path: str,
        load_timeout_s: float = 600.0,
        gpu_busy: Callable[[int, int], float | None] | None = None,
        say: Callable[[str], None] = print,
        share_group: str | None = None,
        owner: Owner | None = None,
        quit_event: threading.Event | None = None,
    ) -> None:
        """`quit_event`: set (by a signal handler, say) to stop; one set before `start()` starts nothing."""
        self.args = args
        self.owner = owner
        self.share_group = share_group
        self.gpu_key = abi.validate_gpu_key(gpu_key)
        self.weight = abi.parse_weight(weight)
        self.name = name
        self.log_path = log_path
        self.load_timeout_s = load_timeout_s
        self._gpu_busy = gpu_busy
        self._say = say
        self.engine_status = EngineStatus()
        self.proc: subprocess.Popen | None = None
        self.membership: Membership | None = None
        self._control: ControlServer | None = None
        self._monitor: threading.Thread | None = None
        self._quit = quit_event if quit_event is not None else threading.Event()
        self._sig_lock = threading.Lock()
        self._stopped = False
        self._window_end_us: int | None = None
        self._started_mono_us = mono_us()
        self.lateness_us: deque[int] = deque(maxlen=4096)
        self.decision: schedule_ext1.Decision | None = None  # the schedule in force (and why): the pace loop's last
        self.base_url = f"http://{args.host}:{args.port}"

    # -- public ------------------------------------------------------------

    def start(self) -> None:
        """Start the engine, wait until healthy, join, serve control. EngineError on failure."""
        if self._quit.is_set():
            raise EngineError("interrupted before the engine was started")
        self.proc = ls.start(self.args, self.log_path)
        try:
            ls.wait_healthy(self.proc, self.base_url, self.log_path, self.load_timeout_s, quit_event=self._quit)
            self.membership = Membership(
                self.gpu_key, self.weight, self.name, pid=self.proc.pid, share_group=self.share_group, ext1=True
            )
            slot = self.membership.join()
            self._control = ControlServer(self.proc.pid, control_handlers(self, self.owner))
        except BaseException:
            self.shutdown()
            raise
        self.engine_status.state = "running"
        self._say(
            f"gpushare-tui: joined /{abi.SEGMENT_PREFIX}{self.gpu_key} slot {slot} "
            f"(weight {self.weight:g}, {self.membership.peers_alive()} peers alive)"
        )

    def run(self) -> int:
        """Pace until the engine exits or a stop is requested; returns the exit code."""
        self._monitor = threading.Thread(target=self._monitor_loop, name="gpushare-monitor", daemon=True)
        self._monitor.start()
        try:
            self._pace_loop()
        finally:
            self.shutdown()
        return self.engine_status.exit_code if self.engine_status.exit_code is not None else 1

    def stop(self) -> str:
        """Thread- and signal-safe: ends `run()`, which then stops the engine. "stopping"."""
        self._quit.set()
        return "stopping"

    def set_weight(self, weight: float) -> float:
        """Publish a new weight (joined only); the stored (f32) value."""
        assert self.membership is not None  # joined in start(), before the control socket is served
        self.weight = self.membership.set_weight(weight)
        return self.weight

    def status(self) -> StatusReply:
        """What the control socket's `status` answers (less the owner's fields)."""
        m = self.membership
        me = own_peer(m.key, m.read_slots(), m.slot, wall_us()) if m else None
        return StatusReply(
            engine_pid=self.proc.pid if self.proc else None,
            port=self.args.port,
            model=self.args.model,
            name=self.name,
            kind="llama-server",
            state=self.engine_status.state,
            tok_s=self.engine_status.tok_s,
            solo_tok_s=self.engine_status.solo_tok_s,
            weight=m.weight if m else self.weight,
            share_pct=me.share_pct if me else 0.0,
            busy_pct=self.engine_status.busy_pct,
            uptime_s=(mono_us() - self._started_mono_us) / 1e6,
            slot=m.slot if m else None,
            gpu_key=self.gpu_key,
            log=self.log_path,
            signal_lateness=SignalLateness(**self.lateness_summary()),
        )

    def shutdown(self) -> None:
        """Continue the engine, stop the monitor, leave, end it (TERM, then KILL after 10 s), close. Idempotent.

        The monitor is joined before leaving: it writes our slot, and a thread still inside OpenSSL (its
        HTTP client loads the CA store, GIL released) when the process exits crashes it (SIGSEGV/SIGABRT
        in OPENSSL_cleanup, run by exit()). The slot is left before the engine is waited for: an engine
        busy streaming can take the whole 10 s to exit (its HTTP threads wait for their clients), and it
        holds no share meanwhile."""
        self._quit.set()
        proc = self.proc
        if proc is not None:
            self._resume(force=True)  # first: a probe in flight may take PROBE_TIMEOUT_S to end
        self._join_monitor()
        if self.membership is not None:
            self.membership.leave()
        if proc is not None:
            if proc.poll() is None:
                self._terminate(proc)
            code = proc.wait()
            self.engine_status.exit_code = 128 - code if code < 0 else code
            self.engine_status.state = "exited"
        if self._control is not None:
            self._control.close()
            self._control = None

    def _join_monitor(self) -> None:
        monitor = self._monitor
        if monitor is None or monitor is threading.current_thread():
            return
        monitor.join(MONITOR_JOIN_S)
        if monitor.is_alive():  # not expected: each of its steps is bounded; say so rather than hang the exit
            self._say(f"gpushare-tui: monitor thread still running after {MONITOR_JOIN_S:g} s")
        else:
            self._monitor = None

    # -- signals -----------------------------------------------------------

    def _signal(self, sig: int) -> None:
        proc = self.proc
        assert proc is not None  # signals go out only once start() started the engine
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def _suspend(self) -> None:
        with self._sig_lock:
            if not self._stopped:
                self._stopped = True  # before the signal: the monitor must not probe now
                # engine_status.state stays "running": a pause outside its TDM window is pacing, many
                # times a second, not a stopped engine (the dashboard's timeline shows who runs)
                self._signal(signal.SIGSTOP)

    def _resume(self, force: bool = False) -> None:
        with self._sig_lock:
            if self._stopped or force:
                self._signal(signal.SIGCONT)
            self._stopped = False

    def _terminate(self, proc: subprocess.Popen) -> None:
        self._signal(signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)

    # -- pacing ------------------------------------------------------------

    def _pace_loop(self) -> None:
        """SIGCONT/SIGSTOP at the window edges. The share floor holds over time whatever other
        members write (see schedule.longest_sleep_us): a stopped spell ends after (1 - f) * period
        at the latest, and the run then owed (schedule.owed_run_us) is run before the next stop."""
        _raise_priority()
        m, proc = self.membership, self.proc
        assert m is not None and proc is not None
        seg = m.segment
        prev: schedule.Schedule | None = None
        reader = RegistryReader()
        owed_us = 0  # run time still owed since the last stopped spell
        stopped_mono_us = last_mono_us = mono_us()
        while not self._quit.is_set() and proc.poll() is None:
            if m.lost is not None:  # shrunk under us by another user (SegmentError): run() shuts down
                raise m.lost
            now, mono = wall_us(), mono_us()
            if not self._stopped:
                owed_us = max(0, owed_us - (mono - last_mono_us))
            last_mono_us = mono
            slot = m.slot
            decision = reader.read(seg, now, mono)  # §5, or Extension 1's (spec §7)
            self.decision = decision
            sched = decision.schedule
            at_edge = sched is prev  # not a membership change, which acts at once, off any edge
            prev = sched
            # while an INTERACTIVE peer is alive, re-read every REREAD_US: a new priority member stops us within 5 ms
            recheck_us = min(RECHECK_US, schedule_ext1.REREAD_US) if decision.interactive_alive else RECHECK_US
            if decision.waits(slot):  # a priority member holds the device: stopped until that changes
                self._window_end_us = None
                if not self._stopped:
                    self._suspend()
                    stopped_mono_us = mono
                owed_us = 0  # §5's floor over time: waiting for priority owes nothing (its budget bounds it)
                stopped_mono_us = mono  # nor does the wait count as a §5 stopped spell afterwards
                wait_us = schedule_ext1.WAIT_REREAD_US  # only to resume: stopping is what must be fast
            elif sched is None or slot is None or slot not in sched.slots:
                self._window_end_us = None
                self._resume()
                owed_us = 0
                poll_us = int(UNTHROTTLED_POLL_S * 1e6)
                fast = decision.interactive_alive and m.demand  # running with work: a priority member stops it at once
                wait_us = min(poll_us, schedule_ext1.REREAD_US) if fast else poll_us
            else:
                run, edge_us = run_until(sched, slot, now)
                scheduled = run
                if self._stopped:
                    spell_us = mono - stopped_mono_us
                    if run or spell_us >= schedule.longest_sleep_us(sched):
                        owed_us = schedule.owed_run_us(sched, spell_us)
                        if not run:  # stopped for as long as the floor allows: run what is owed
                            run, edge_us = True, now + owed_us
                elif not run and owed_us > 0:  # owed run first, whatever the schedule says now
                    run, edge_us = True, now + owed_us
                if run:
                    self._window_end_us = edge_us
                    if self._stopped:
                        self._resume()
                        if at_edge and scheduled:
                            self._note_lateness(sched, slot, edge=0)
                else:
                    self._window_end_us = None
                    if not self._stopped:
                        self._suspend()
                        stopped_mono_us = mono
                        if at_edge:
                            self._note_lateness(sched, slot, edge=1)
                wait_us = min(edge_us - now, recheck_us)
                if self._stopped:
                    wait_us = min(wait_us, stopped_mono_us + schedule.longest_sleep_us(sched) - mono)
            time.sleep(max(wait_us, 0) / 1e6)

    def _note_lateness(self, sched: schedule.Schedule, slot: int, edge: int) -> None:
        """How late after its edge (0: window start, 1: window end less the stop lead) a signal went out."""
        window = sched.window_of(slot)
        assert window is not None  # at a window edge: a member
        boundary = window[edge] - (STOP_LEAD_US if edge else 0)
        self.lateness_us.append((wall_us() - boundary) % sched.period_us)

    def lateness_summary(self) -> dict:
        """p50/p99/max µs by which SIGCONT/SIGSTOP trailed their window edges."""
        xs = sorted(self.lateness_us)
        if not xs:
            return {"n": 0, "p50_us": None, "p99_us": None, "max_us": None}
        return {
            "n": len(xs),
            "p50_us": xs[len(xs) // 2],
            "p99_us": xs[min(len(xs) - 1, len(xs) * 99 // 100)],
            "max_us": xs[-1],
        }

    # -- activity, busy, tok/s --------------------------------------------

    def _may_probe(self) -> bool:
        if self._stopped:
            return False
        end = self._window_end_us
        return end is None or end - wall_us() >= PROBE_MARGIN_US

    def _monitor_loop(self) -> None:
        """Activity, busy and tok/s. While idle, /metrics is probed every 50 ms so
        `active` rises within ~100 ms of the first decode. While active, every
        probe costs the engine throughput (answered by its inference loop), so
        probes drop to 1 Hz and the engine's CPU time (free to read) carries the
        "still decoding" signal between them (see EngineActivity). Stopped spells
        (at most (1 - share) * 400 ms) are bridged by the 2 s activity window."""
        m, proc = self.membership, self.proc
        assert m is not None and proc is not None
        activity = EngineActivity()
        rate = StepRate()
        n_decode: float | None = None  # the last probe's n_decode_total (a Prometheus counter)

        def alone() -> bool:
            return sole_member(m.read_slots(), m.slot, wall_us())

        cpu_stats = _CpuBusy(proc.pid)
        cpu_tick = _CpuBusy(proc.pid)
        next_stats = time.monotonic()
        with httpx.Client(timeout=PROBE_TIMEOUT_S) as client:
            while not self._quit.is_set() and proc.poll() is None:
                mono = mono_us()  # activity and cadences: monotonic; a wall-clock step must not keep it active
                t = mono / 1e6
                busy_cpu = cpu_tick.fraction() * cpu_tick.cores >= CPU_ACTIVE_CORES
                activity.on_cpu(mono, busy_cpu and not self._stopped, m.active)
                if activity.probe_due(mono, m.active) and self._may_probe():
                    activity.probe_sent(mono)
                    try:
                        met = ls.parse_metrics(client.get(self.base_url + "/metrics").text)
                    except httpx.HTTPError:
                        met = None
                    if met is not None:
                        activity.on_probe(mono_us(), met.n_decode_total, met.requests_processing)
                        n_decode = met.n_decode_total
                if activity.is_active(mono):
                    m.mark_active(activity.last_us)
                    m.set_demand(True)  # i20-sched: DEMAND from the activity window (until issue 19's in-flight)
                    if n_decode is not None:  # rate windows span work only: idle time is not averaged in
                        rate.update(t, n_decode, alone)
                        n_decode = None
                elif m.active:
                    m.mark_idle()
                    rate.idle()
                if not activity.is_active(mono) and not self._stopped:
                    m.set_demand(False)  # i20-sched: ... kept while stopped (§7: a paced engine keeps DEMAND)
                self.engine_status.tok_s = rate.rate if m.active else 0.0  # None: working, first window not complete
                self.engine_status.solo_tok_s = rate.solo
                if t >= next_stats:
                    next_stats = t + BUSY_WINDOW_US / 1e6
                    since_us = wall_us() - BUSY_WINDOW_US  # NVML samples carry wall-clock stamps
                    busy = self._gpu_busy(proc.pid, since_us) if self._gpu_busy else None
                    frac = busy / 100 if busy is not None else cpu_stats.fraction()
                    self.engine_status.busy_pct = 100 * frac
                    m.set_busy_ppm(int(frac * 1_000_000))
                    if m.interactive and m.slot is not None:  # i20-sched: PRIORITY hysteresis (spec §7) on that busy
                        share = schedule_ext1.plain_share(m.read_slots(), m.slot, m.weight, wall_us())
                        m.set_priority(schedule_ext1.next_priority(m.priority, int(frac * 1e6), share), int(frac * 1e6))
                time.sleep(MONITOR_TICK_S)


def run_until(sched: schedule.Schedule, slot: int, now_us: int, stop_lead_us: int = STOP_LEAD_US) -> tuple[bool, int]:
    """(whether `slot`'s engine may run now, the absolute µs of its next edge).

    Its run ends `stop_lead_us` before its window does. A SIGSTOP takes effect only
    once the engine's own thread runs to take it; sent at the edge, that thread
    competes for the cores with the engine just continued, and both ran together
    for 13-18% of the time on 2 vCPUs (0% with a 500 µs lead)."""
    if schedule.may_run(sched, slot, now_us):
        end = schedule.window_end_us(sched, slot, now_us)
        if now_us < end - stop_lead_us:
            return True, end - stop_lead_us
        return False, schedule.next_window_start_us(sched, slot, end)
    return False, schedule.next_window_start_us(sched, slot, now_us)


def _raise_priority() -> None:
    """Real-time priority for the calling (pacing) thread where permitted (root or
    RLIMIT_RTPRIO): window edges then stay sharp even when every core is busy."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (OSError, AttributeError):
        pass


class _CpuBusy:
    """Engine CPU time as a fraction of the machine's cores since the last call."""

    MIN_SPAN_S = 0.040

    def __init__(self, pid: int) -> None:
        self._proc = psutil.Process(pid)
        self.cores = os.cpu_count() or 1
        self._last = self._sample()

    def _sample(self) -> tuple[float, float]:
        try:
            t = self._proc.cpu_times()
            return time.monotonic(), t.user + t.system
        except psutil.Error:
            return time.monotonic(), 0.0

    def fraction(self) -> float:
        """0.0 until MIN_SPAN_S has passed: CPU time comes in 10 ms ticks, so shorter
        spans read as bursts."""
        now = self._sample()
        (t0, c0), (t1, c1) = self._last, now
        if t1 - t0 < self.MIN_SPAN_S:
            return 0.0
        self._last = now
        return max(0.0, min(1.0, (c1 - c0) / ((t1 - t0) * self.cores)))
