"""Supervisor: weighted TDM for an unmodified engine process, from outside.

It owns one registry slot on behalf of the engine (slot pid = engine pid) and
enforces the schedule with SIGCONT at the window start and SIGSTOP at its end,
sent to the engine's whole process group (it is the group's leader: workers it
starts are paced with it). An idle engine, a lone engine, or one whose peers are
all idle is never stopped. Whether it is working comes from its activity source
(core/engines/activity/), when it is ready from its health source (engines/health.py):
the supervisor never knows which engine it paces. Every exit path continues the
group; if the supervisor is SIGKILLed, the kernel sends the engine SIGTERM
(PR_SET_PDEATHSIG) and the watchdog (engines/watchdog.py) continues its whole tree,
then ends it (SIGTERM, SIGKILL after 10 s): nothing of it is left stopped, nor
running on unpaced and unseen.

A llama-server (unless started with --no-proxy) listens on an internal port; a front proxy
(core/engines/front_proxy.py, in a process of its own: proxy_process.py) on the public --host/--port
forwards to it and publishes DEMAND (spec §7) the moment a request arrives and when the last one
ends. The proxy serves before the engine is started (its port bound, or a listening socket handed
down by `up` or systemd: `listen_socket`): requests that come while the model loads wait for it
(budgets.PROXY_ENGINE_WAIT_S), and are sent once the engine is healthy and joined (DEMAND has a
slot to go to). It is closed first at shutdown.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..host import paths, sockets
from ..host.budgets import ESCAPED_DESCENDANTS_MAX
from ..host.clock import mono_us, wall_us
from ..host.errors import EngineError, Interrupted
from ..host.text import counted, printable
from ..observe.accounting import BusyFromMarks
from ..observe.snapshot import own_peer, runs_alone
from ..pacing.control import ControlServer, SignalLateness, StatusReply, control_handlers
from ..pacing.governor import GovernorBounds, SloTarget
from ..pacing.pacer import BUSY_WINDOW_US, RegistryReader
from ..pacing.rate import StepRate
from ..registry import abi
from ..registry.membership import Membership
from ..registry.ownership import Owner
from ..registry.segment import SegmentError
from ..schedule import ext1 as schedule_ext1
from ..schedule import ext2 as schedule_ext2
from ..schedule import v1 as schedule
from . import activity, command, health, listener, spawn, watchdog
from . import llama_server as ls
from .declaration import LLAMA_SERVER, ActivitySpec, HealthSpec, check_class
from .proxy_process import ProxyProcess
from .slo_keeper import SloKeeper
from .spawn import Progress

RECHECK_US = 20_000  # re-read the registry at least this often
UNTHROTTLED_POLL_S = 0.025  # each wake-up disturbs the engine's threads
STOP_LEAD_US = 500  # stop this long before our window ends (see run_until)
MONITOR_TICK_S = 0.050
PROBE_MARGIN_US = 30_000  # don't start a probe this close to our window's end
STOP_GRACE_S = 10.0  # SIGTERM to SIGKILL, ending the engine: here, and by its watchdog if we die
BUSY_MARK_GAP_US = 1_200_000  # activity marks this close count the continued time between (probes: 1 Hz)
MONITOR_JOIN_S = 5.0  # its longest step: building the HTTP client, or one probe (budgets.ENGINE_PROBE_DEADLINE_S)
GpuBusy = Callable[[Sequence[int], int], float | None]  # (the tree's pids, since wall µs) -> summed SM % or None


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
        args: command.EngineArgs,
        *,
        gpu_key: str,
        weight: float,
        name: str,
        log_path: str,
        kind: str = LLAMA_SERVER,
        activity_spec: ActivitySpec = ActivitySpec(),
        health_spec: HealthSpec = HealthSpec(),
        load_timeout_s: float = 600.0,
        gpu_busy: GpuBusy | None = None,
        say: Callable[[str], None] = print,
        share_group: str | None = None,
        owner: Owner | None = None,
        quit_event: threading.Event | None = None,
        klass: str = "batch",
        load_progress: Progress | None = None,
        seed_view: Callable[[int | None], dict] | None = None,
        listen_socket: socket.socket | None = None,
        slo: tuple[SloTarget, GovernorBounds] | None = None,
    ) -> None:
        """`args`: the command as it is started (llama_server.prepare_args for llama-server, whose
        sources' URLs left None are on its port; else command.prepare); `kind`, `activity_spec`,
        `health_spec`: declaration.resolve_sources'. `gpu_busy`: NVML utilisation of the tree (busy
        fraction; the `gpu` source). `quit_event`: set (by a signal handler, say) to stop; one set
        before `start()` starts nothing. `load_progress`: called while the engine loads (health.wait_ready's
        `progress`). `seed_view`: the engine's GPU entry given its slot (serve.peers.engine_view), which the
        front proxy serves as `/gpu/peers` and adds to `/props` (spec §5); None: neither. `listen_socket`:
        the public port's listening socket, handed down (the proxy serves it instead of binding). `slo`: a latency
        target and its governor's bounds (slo_keeper.py: the governor runs once the engine has joined)."""
        self.args = args
        self.kind = kind
        self.activity_spec = activity_spec
        self.health_spec = health_spec
        self.owner = owner
        self.share_group = share_group
        self.gpu_key = abi.validate_gpu_key(gpu_key)
        self.weight = abi.parse_weight(weight)
        self.name = name
        self.log_path = log_path
        self.load_timeout_s = load_timeout_s
        self._gpu_busy = gpu_busy
        self._say = say
        self._load_progress = load_progress
        self._seed_view = seed_view
        self._listen_socket = listen_socket
        self.engine_status = EngineStatus()
        self.proc: subprocess.Popen | None = None
        self.membership: Membership | None = None
        self._control: ControlServer | None = None
        self._monitor: threading.Thread | None = None
        self._quit = quit_event if quit_event is not None else threading.Event()
        self.klass = check_class(klass)  # the latency class (spec §7): published at the join, then by set_class
        self._sig_lock = threading.Lock()
        self._stopped = False
        # descendants that left the engine's process group (setsid, setpgid): pid -> its pidfd (signals
        # through it never reach a reused pid); paced and ended with the group (issue 26 item 10)
        self._escaped: dict[int, int] = {}
        self._continued = threading.Condition()  # notified at each continue (the monitor's due probe waits for it)
        self._continues = 0
        self._window_end_us: int | None = None
        self._started_mono_us = mono_us()
        self.lateness_us: deque[int] = deque(maxlen=4096)
        # proxied (llama-server, any HTTP engine: fronted.py): the engine listens on `upstream`; probes go there
        self.upstream: tuple[str, int] | None = getattr(args, "upstream", None)
        host, port = self.upstream or (args.host, args.port)
        self.base_url = sockets.http_url(host.split(",")[0], port) if port is not None else None
        self.proxy: ProxyProcess | None = None
        self._watchdog: watchdog.Watchdog | None = None
        self._run_us = 0  # the engine's continued time, up to _resumed_us (see run_us)
        self._resumed_us = mono_us()
        self.in_flight = False  # work in flight, as last published (DEMAND): the proxy's, else the activity source's
        self.hold_off = schedule_ext1.HoldOffCheck()  # how long priority stopped us: over budget, not believed
        self._registry = RegistryReader()  # the pace loop's (its slots and their users: the monitor's budget)
        self.decision: schedule_ext1.Decision | None = None  # the schedule in force (and why): the pace loop's last
        self._slo_spec = slo
        self.slo: SloKeeper | None = None  # its governor, from the join on

    # -- public ------------------------------------------------------------

    def start(self) -> None:
        """Start the engine, wait until healthy, join, serve control. EngineError on failure; Interrupted
        when `quit_event` is set meanwhile (the engine is stopped then)."""
        if self._quit.is_set():
            raise Interrupted("interrupted before the engine was started")
        spec = shown = self.health_spec
        if spec.kind == "http" and spec.url is None:
            spec = shown = HealthSpec("http", url=f"{self.base_url}/health")  # llama-server's, on the port it is given
            if self.upstream is not None and self.args.port is not None:  # a person is told the public port
                shown = HealthSpec("http", url=sockets.http_url(self.args.host, self.args.port, "/health"))
        log_ready = None
        if spec.kind == "log":  # followed from its end before the engine writes to it
            os.close(paths.open_log(self.log_path))
            log_ready = health.LogReady(self.log_path, spec.log_regex or "")
        try:
            spawn.adopt_orphans()  # before the engine starts: its orphans come to us, not to init
            self._start_proxy()
            if self.kind == LLAMA_SERVER:
                self.proc = ls.start(self.args, self.log_path)
            else:
                self.proc = command.start(self.args.argv, self.log_path)
        except BaseException:
            if log_ready is not None:
                log_ready.close()
            if self.proxy is not None:
                self.proxy.close()
                self.proxy = None
            raise
        try:
            try:
                # before any SIGSTOP (the engine leads its group); it ends the tree if we die
                self._watchdog = watchdog.start(self.proc.pid, STOP_GRACE_S)
            except OSError as e:
                raise EngineError(f"cannot start the engine's watchdog: {e.strerror or e}") from None
            ready = health.ready_check(spec, log_ready=log_ready)
            owned = self._port_check(spec)
            health.wait_ready(
                self.proc,
                ready,
                self.log_path,
                self.load_timeout_s,
                what=health.describe(spec),
                quit_event=self._quit,
                progress=self._load_progress,
                waiting_for=health.waiting_for(shown, self.args.argv[0]),
                owned=owned.ready if owned is not None else None,
            )
            self.membership = Membership(
                self.gpu_key,
                self.weight,
                self.name,
                pid=self.proc.pid,
                share_group=self.share_group,
                ext1=True,
                interactive=self.klass == "interactive",
            )
            slot = self.membership.join()
            if self.proxy is not None:
                self.proxy.set_engine_ready()  # the requests waiting go to the engine
            handlers = control_handlers(self, self.owner)
            if self._slo_spec is not None:
                keeper = self.slo = self._slo_keeper(*self._slo_spec)
                handlers = keeper.wrap(handlers)  # a person's edit pauses it, up's restarts it
            self._control = ControlServer(self.proc.pid, handlers)
        except BaseException:
            self.shutdown()
            raise
        self.engine_status.state = "running"
        self._say(
            f"gpushare-tui: joined /{abi.SEGMENT_PREFIX}{self.gpu_key} slot {slot} "
            f"(weight {self.weight:g}, {counted(self.membership.peers_alive(), 'peer')} alive)"
        )
        if self.proxy is not None and self.upstream is not None:
            serving = sockets.host_port(self.args.host, self.proxy.port)
            self._say(
                f"gpushare-tui: serving {serving} through the front proxy"
                f" (engine on {sockets.host_port(*self.upstream)}; --no-proxy to serve it directly)"
            )

    def _start_proxy(self) -> None:
        """The front proxy on the public port (ProxyError if it cannot be bound), before the engine starts:
        requests wait for it to load."""
        if self.upstream is None or self.args.port is None:
            return
        seed = self._seed_view
        # the slot at each read (a re-claim may move it); read only once the engine is ready (requests wait)
        view = (lambda: seed(self.membership.slot if self.membership else None)) if seed is not None else None
        self.proxy = ProxyProcess(  # a process of its own: its loop never holds the pace loop's interpreter lock
            (self.args.host, self.args.port),
            self.upstream,
            on_demand=self._proxy_demand,
            seed_view=view,
            on_error=lambda why: self._say(f"gpushare-tui: front proxy: {why}"),
            sock=self._listen_socket,
            engine_ready=False,
        ).start()

    def _slo_keeper(self, target: SloTarget, bounds: GovernorBounds) -> SloKeeper:
        """The governor of the engine's latency target, fed by the front proxy's figures (none without one)."""
        proxy = self.proxy
        if proxy is None:
            self._say("gpushare-tui: governor: no front proxy (--no-proxy, or no port to front): no figures, it holds")
        snapshot = (lambda: proxy.latency) if proxy is not None else (lambda: None)
        return SloKeeper(target, bounds, engine=self, snapshot=snapshot, log_path=self.log_path, say=self._say).start()

    def _port_check(self, spec: HealthSpec) -> listener.PortCheck | None:
        """Who listens where the readiness probe goes (http, tcp): ready only once it is the engine's tree."""
        assert self.proc is not None
        where = listener.url_address(spec.url or "") if spec.kind == "http" else None
        if spec.kind == "tcp" and spec.port is not None:
            where = (health.HOST_DEFAULT, spec.port)
        if where is None:
            return None
        return listener.PortCheck(*where, activity.ProcessTree(self.proc.pid, refresh_s=0).pids)

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

    def _proxy_demand(self, demand: bool) -> None:
        """The proxy's DEMAND (its thread): the first request in flight arrived, or the last one ended."""
        self.in_flight = demand
        if self.membership is not None:
            self.membership.set_demand(demand)

    def set_weight(self, weight: float) -> float:
        """Publish a new weight (joined only); the stored (f32) value."""
        assert self.membership is not None  # joined in start(), before the control socket is served
        self.weight = self.membership.set_weight(weight)
        return self.weight

    def set_class(self, klass: str) -> str:
        """Publish the latency class ("interactive" | "batch", spec §7 INTERACTIVE) at once (joined only)."""
        assert self.membership is not None  # joined in start(), before the control socket is served
        self.klass = check_class(klass)
        self.membership.set_interactive(self.klass == "interactive")
        return self.klass

    def status(self) -> StatusReply:
        """What the control socket's `status` answers (less the owner's fields)."""
        m = self.membership
        me = own_peer(m.key, m.read_slots(), m.slot, wall_us()) if m else None
        return StatusReply(
            engine_pid=self.proc.pid if self.proc else None,
            port=self.args.port,
            model=self.args.model,
            name=self.name,
            kind=self.kind,
            activity=self.activity_spec.source,
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
            latency=self.proxy.latency.report if self.proxy is not None and self.proxy.latency is not None else None,
            slo=self.slo.report() if self.slo is not None else None,
        )

    def shutdown(self) -> None:
        """Continue the engine, stop the monitor, leave, end it (TERM, then KILL after 10 s), close. Idempotent.

        The monitor is joined before leaving: it writes our slot, and a thread still inside OpenSSL (its
        HTTP client loads the CA store, GIL released) when the process exits crashes it (SIGSEGV/SIGABRT
        in OPENSSL_cleanup, run by exit()). The slot is left before the engine is waited for: an engine
        busy streaming can take the whole 10 s to exit (its HTTP threads wait for their clients), and it
        holds no share meanwhile."""
        self._quit.set()
        if self.slo is not None:  # first: it sets the weight
            self.slo.close()
        proc = self.proc
        if proc is not None:
            self._resume(force=True)  # first: a probe in flight may take budgets.ENGINE_PROBE_DEADLINE_S to end
        if self.proxy is not None:  # before the engine is ended (its clients are cut: it exits sooner), still joined
            self.proxy.close()
            self.proxy = None
        self._join_monitor()
        if self.membership is not None:
            self.membership.leave()
        if proc is not None:
            if proc.poll() is None:
                self._terminate(proc)
            code = proc.wait()
            self.engine_status.exit_code = 128 - code if code < 0 else code
            self.engine_status.state = "exited"
            self._continue_orphans(proc)
            self._end_escaped()
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None
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
        _pidfd_signal(list(self._escaped.values()), sig)

    def _track_escaped(self, pids: Sequence[int]) -> None:
        """Monitor thread, at each look at the tree (`pids`: the engine first): a descendant outside the
        engine's process group is paced and ended with it from now on (one line says so), and its
        watchdog ends it too if we die. Ones that exited are dropped. Descendants re-parented to us
        (we are a subreaper: spawn.adopt_orphans; a double fork) count too, and are reaped."""
        proc = self.proc
        assert proc is not None
        adopted = self._adopted()
        for pid in [*pids[1:], *adopted]:
            if pid in self._escaped or len(self._escaped) >= ESCAPED_DESCENDANTS_MAX:
                continue
            try:
                if os.getpgid(pid) == proc.pid:
                    continue
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # gone (or no fd left: the monitor says EMFILE elsewhere)
            with self._sig_lock:
                self._escaped[pid] = fd
                if self._stopped:  # it joins the group's state
                    signal.pidfd_send_signal(fd, signal.SIGSTOP)
            if self._watchdog is not None:
                self._watchdog.track(pid)
            self._say(
                f"gpushare-tui: pid {pid} ({_comm(pid)}) left the engine's process group {proc.pid}:"
                " paced and ended with the engine"
            )
        for pid, fd in list(self._escaped.items()):
            if _exited(fd):
                with self._sig_lock:
                    del self._escaped[pid]
                os.close(fd)
        _reap(adopted)

    def _adopted(self) -> list[int]:
        """Our descendants other than the engine's tree, the watchdog and the front proxy: the engine's orphans,
        re-parented to us (and theirs)."""
        proc, dog, proxy = self.proc, self._watchdog, self.proxy
        skip = {proc.pid if proc else 0, dog.pid if dog else 0}
        skip.add(proxy.proc.pid if proxy is not None and proxy.proc is not None else 0)  # ours, never paced
        kids = [p for p in activity.ProcessTree.children_of(os.getpid()) if p not in skip]
        return [*kids, *(d for k in kids for d in activity.ProcessTree(k, refresh_s=0).pids()[1:])]

    def _end_escaped(self) -> None:
        """After the engine ended: its escaped descendants too (continued, SIGTERM, SIGKILL after
        STOP_GRACE_S), so nothing of it outlives `run`."""
        with self._sig_lock:
            escaped, self._escaped = self._escaped, {}
        fds = list(escaped.values())
        _pidfd_signal(fds, signal.SIGCONT, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        alive = [fd for fd in fds if not _exited(fd)]
        while alive and time.monotonic() < deadline:
            select.select(alive, [], [], max(0.0, deadline - time.monotonic()))  # a pidfd reads ready on exit
            alive = [fd for fd in alive if not _exited(fd)]
        _pidfd_signal(alive, signal.SIGCONT, signal.SIGKILL)
        for fd in fds:
            os.close(fd)

    def _suspend(self) -> None:
        with self._sig_lock:
            if not self._stopped:
                self._stopped = True  # before the signal: the monitor must not probe now
                self._run_us += mono_us() - self._resumed_us
                # engine_status.state stays "running": a pause outside its TDM window is pacing, many
                # times a second, not a stopped engine (the dashboard's timeline shows who runs)
                self._signal(signal.SIGSTOP)

    def _resume(self, force: bool = False) -> None:
        with self._sig_lock:
            continued = self._stopped or force
            if continued:
                self._signal(signal.SIGCONT)
            if self._stopped:
                self._resumed_us = mono_us()
            self._stopped = False
        if continued:
            with self._continued:
                self._continues += 1
                self._continued.notify_all()

    def _wait_continued(self, timeout_s: float) -> None:
        """Until the engine is next continued (a SIGCONT, or shutdown's), or `timeout_s`."""
        with self._continued:
            seen = self._continues
            self._continued.wait_for(lambda: self._continues != seen, timeout_s)

    def run_us(self) -> int:
        """The engine's total continued (not stopped) time so far, µs (monotonic)."""
        with self._sig_lock:
            return self._run_us + (0 if self._stopped else mono_us() - self._resumed_us)

    def _continue_orphans(self, proc: subprocess.Popen) -> None:
        """The group's leader is gone; its workers may live on in the group: continue them (they
        were continued with it before it was ended; this covers a leader that died by itself)."""
        try:
            os.killpg(proc.pid, signal.SIGCONT)
        except OSError:
            pass

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
        reader = self._registry = RegistryReader()
        owed_us = 0  # run time still owed since the last stopped spell
        busy = BusyFromMarks(BUSY_MARK_GAP_US)
        stopped_mono_us = last_mono_us = mono_us()
        waited = False  # the last round stopped the engine for a priority member
        wait_since_us = last_mono_us  # ... since then
        while not self._quit.is_set() and proc.poll() is None:
            if m.say_lost_once():  # the segment is beyond repair (Membership.recover): the engine runs unpaced
                self._window_end_us = None
                self._resume()
                time.sleep(UNTHROTTLED_POLL_S)
                continue
            now, mono = wall_us(), mono_us()
            if not self._stopped:
                owed_us = max(0, owed_us - (mono - last_mono_us))
                busy.continued(last_mono_us, mono)
            m.add_busy_us(busy.mark(m.last_active_us))  # busy_total_us (spec §7): continued while working
            last_mono_us = mono
            slot = m.slot
            try:
                decision = reader.read(seg, now, mono)  # §5, Extension 1's (spec §7) or Extension 2's (§8)
                if reader.sync_users_bit(m, now):  # our USERS bit changed (§8.2): decide on what we now publish
                    decision = reader.read(seg, now, mono, force=True)
            except SegmentError as e:  # shrunk under us by a group member: re-extended and re-claimed, or lost
                reader = RegistryReader()
                m.recover(e)
                continue
            # the holders' budget, verified (`waited`: the last round stopped us for priority)
            believed = self.hold_off.judge(decision, m.slot, reader.slots, now, mono, waited=waited)
            decision = schedule_ext2.judged(decision, believed)
            self.decision = decision
            if decision.waits(m.slot) and not waited:
                wait_since_us = mono
            waited = decision.waits(m.slot)
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
                wait_us = schedule_ext1.wait_slice_us(mono - wait_since_us)  # to resume: 4 ms, up to 20 ms
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
        """Activity (the source: is there work now), DEMAND, busy and tok/s. The llama source probes
        /metrics every 50 ms while idle, so `active` rises within ~100 ms of the first decode, and
        once a second while active (each probe costs the engine throughput; its CPU time carries
        "still decoding" between); other sources: core/engines/activity/. Stopped spells (at most
        (1 - share) * 400 ms) are bridged by the 2 s activity window.

        No dependency of it ends it silently (issue 26 item 5): an OSError in a step (EMFILE with
        the fd limit reached, a /proc file gone) skips that step, says so in one line (and once
        more when steps succeed again), and the next tick tries again; pacing never waits for it.
        Any other exception is a bug: one line, and the supervisor stops (the engine is ended in order)."""
        m, proc = self.membership, self.proc
        assert m is not None and proc is not None
        state: _MonitorState | None = None
        failing: str | None = None  # the error steps fail with, as said
        try:
            while not self._quit.is_set() and proc.poll() is None:
                try:
                    if state is None:  # built here: an HTTP client is made (it may need fds too)
                        state = self._monitor_state(m, proc.pid)
                    self._monitor_step(m, state)
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
                if state is not None and state.probe_refused:
                    self._wait_continued(MONITOR_TICK_S)
                else:
                    time.sleep(MONITOR_TICK_S)
        except Exception as e:  # a bug: said in one line, and the engine is ended in order
            self._say(f"gpushare-tui: monitor thread failed ({type(e).__name__}: {e}): stopping the engine")
            self._quit.set()
        finally:
            if state is not None:
                state.source.close()

    def _monitor_state(self, m: Membership, pid: int) -> _MonitorState:
        tree = activity.ProcessTree(pid)
        source = activity.make_source(
            self.activity_spec, tree=tree, base_url=self.base_url, gpu_util=self._gpu_busy, say=self._say
        )
        try:
            cpu_stats = activity.CpuMeter(tree, min_span_us=0)
            cpu_stats.cores(mono_us())
        except BaseException:
            source.close()
            raise
        mono = mono_us()
        next_stats_us = mono + BUSY_WINDOW_US
        return _MonitorState(
            tree,
            source,
            StepRate(),
            cpu_stats,
            tree.cores(),
            next_stats_us,
            m.busy_total_us,
            mono,
            schedule_ext1.BusyMeter(BUSY_WINDOW_US),
            m.busy_total_us,
        )

    def _monitor_step(self, m: Membership, st: _MonitorState) -> None:
        source, rate, tree = st.source, st.rate, st.tree
        mono = mono_us()  # activity and cadences: monotonic; a wall-clock step must not keep it active
        t = mono / 1e6
        st.probe_refused = False

        def may_probe() -> bool:
            ok = self._may_probe()
            st.probe_refused = st.probe_refused or not ok
            return ok

        source.poll(activity.Tick(mono, self.run_us(), not self._stopped, m.active, may_probe))
        # DEMAND (spec §7). Proxied (llama-server), the proxy publishes it at each request's start
        # and end, counting through stops. A sampled source (a gauge, CPU readings) cannot see the
        # end of work exactly: a reading between two back-to-back requests reads 0 (measured: 40 %
        # of a loaded 2:1 pair's samples lost DEMAND, and the pair ran 1.06:1), so its DEMAND
        # follows its activity window, as v1's `active` does; kept while stopped (§7).
        demand = source.is_active(mono)
        if self.upstream is None and demand != self.in_flight and (demand or not self._stopped):
            self.in_flight = demand
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
            self.engine_status.tok_s = rate.rate if m.active else 0.0
            self.engine_status.solo_tok_s = rate.solo
        # The priority budget is judged at every tick too, on the last second's device time (a bucketed
        # meter): an interactive engine that overstays its budget clears its bit within a tick, not up to a
        # second later, so a waiting member's check of the budget (HoldOffCheck) never trips on it
        now_total_us, now_mono_us = m.busy_total_us, mono_us()
        st.device.add(now_mono_us, now_total_us - st.device_total_us)
        st.device_total_us = now_total_us
        if m.interactive and m.slot is not None and m.priority:
            ppm = st.device.ppm(now_mono_us)
            share = self._registry.own_share(m.read_slots(), m.slot, m.weight, wall_us())  # §7 rule 2, §8.3
            if not schedule_ext1.next_priority(True, ppm, share):
                m.set_priority(False, ppm)
        if mono < st.next_stats_us:
            return
        st.next_stats_us = mono + BUSY_WINDOW_US
        since_us = wall_us() - BUSY_WINDOW_US  # NVML samples carry wall-clock stamps
        pids = tree.pids()
        self._track_escaped(pids)
        busy = self._gpu_busy(pids, since_us) if self._gpu_busy else None
        used = st.cpu_stats.cores(mono_us())
        frac = busy / 100 if busy is not None else min(1.0, (used or 0.0) / st.cores)
        self.engine_status.busy_pct = 100 * frac
        m.set_busy_ppm(int(frac * 1_000_000))
        # The priority budget (spec §7) is judged on device time: the engine's continued time while
        # working (busy_total_us) over the last second. Its CPU fraction of the machine's cores
        # cannot be: a 1-thread engine on 2 cores reads at most 50 %, and at weight 1:1 (S = 0.5)
        # never overran (measured: a flooding interactive engine kept 92-100 % of the steps).
        total_us, at_us = m.busy_total_us, mono_us()
        device_ppm = min(1_000_000, (total_us - st.busy_total_us) * 1_000_000 // max(1, at_us - st.busy_at_us))
        st.busy_total_us, st.busy_at_us = total_us, at_us
        if m.interactive and m.slot is not None:  # the PRIORITY hysteresis, published with that busy
            share = self._registry.own_share(m.read_slots(), m.slot, m.weight, wall_us())  # §7 rule 2, §8.3
            m.set_priority(schedule_ext1.next_priority(m.priority, device_ppm, share), device_ppm)


@dataclass
class _MonitorState:
    """What the monitor keeps between its steps (built once, in its thread)."""

    tree: activity.ProcessTree
    source: activity.ActivitySource
    rate: StepRate
    cpu_stats: activity.CpuMeter
    cores: int
    next_stats_us: int  # monotonic µs of the next busy/priority tick
    busy_total_us: int  # device time at the last stats tick
    busy_at_us: int
    device: schedule_ext1.BusyMeter  # device time over the last second, bucketed: the priority budget
    device_total_us: int  # device time at the last tick
    probe_refused: bool = False  # this step's due probe was refused (the engine stopped, or about to be)


def _pidfd_signal(pidfds: Sequence[int], *sigs: int) -> None:
    """Each signal in turn to each process (one that exited is skipped: pruned at the next tree look)."""
    for sig in sigs:
        for fd in pidfds:
            try:
                signal.pidfd_send_signal(fd, sig)
            except OSError:
                pass


def _reap(pids: Sequence[int]) -> None:
    """Reap those of `pids` that are our exited children (adopted orphans: nobody else waits for them)."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _exited(pidfd: int) -> bool:
    """Whether the process of `pidfd` exited (its pidfd reads ready; a zombie counts)."""
    return bool(select.select([pidfd], [], [], 0)[0])


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return printable(f.read().strip())
    except OSError:
        return "?"


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
