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

It composes one part per job: the engine's process group (process_group.py: signals, pidfds, escaped
descendants, continued time), the monitor (monitor.py: activity, DEMAND of sampled sources, busy, tok/s)
and the pace loop (pace_loop.py: a thin driver of the pacing policy, core/pacing/policy.py, which holds
every pacing rule); it keeps the engine's start, health, join, control socket and shutdown.

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
import socket
import subprocess
import threading
from collections import deque
from collections.abc import Callable

from ..host import paths, sockets
from ..host.clock import mono_us, wall_us
from ..host.errors import EngineError, Interrupted
from ..host.text import counted
from ..observe.accounting import InFlightClock
from ..observe.snapshot import own_peer
from ..pacing import edges
from ..pacing.control import ControlServer, SignalLateness, StatusReply, control_handlers
from ..pacing.governor import GovernorBounds, SloTarget
from ..registry import abi
from ..registry.membership import Membership
from ..registry.ownership import Owner
from . import activity, command, health, listener, spawn, watchdog
from .declaration import ActivitySpec, HealthSpec, check_class
from .kinds import LLAMA_SERVER
from .kinds import kind as kind_record
from .monitor import EngineStatus, GpuBusy, Monitor
from .pace_loop import STOP_LEAD_US, PaceLoop, lateness_summary
from .process_group import STOP_GRACE_S, EngineGroup
from .proxy_process import ProxyProcess
from .slo_keeper import SloKeeper
from .spawn import Progress
from .start import start as start_command

__all__ = ["STOP_GRACE_S", "STOP_LEAD_US", "EngineStatus", "GpuBusy", "Supervisor"]

PROBE_MARGIN_US = 30_000  # don't start a probe this close to our window's end
MONITOR_JOIN_S = 5.0  # its longest step: building the HTTP client, or one probe (budgets.ENGINE_PROBE_DEADLINE_S)


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
        self.group = EngineGroup(say)  # the engine's process group: its signals, pidfds, escaped descendants
        self.group.ours = self._own_children
        self.membership: Membership | None = None
        self._control: ControlServer | None = None
        self._monitor: threading.Thread | None = None
        self._quit = quit_event if quit_event is not None else threading.Event()
        self.klass = check_class(klass)  # the latency class (spec §7): published at the join, then by set_class
        self._started_mono_us = mono_us()
        self.lateness_us: deque[int] = deque(maxlen=4096)
        self.edges = edges.ring()  # each window the engine ran in (pace_loop.PaceLoop records them)
        # proxied (llama-server, any HTTP engine: fronted.py): the engine listens on `upstream`; probes go there
        self.upstream: tuple[str, int] | None = args.upstream  # set by the kind's prepare (llama-server's)
        host, port = self.upstream or (args.host, args.port)
        self.base_url = sockets.http_url(host.split(",")[0], port) if port is not None else None
        self.proxy: ProxyProcess | None = None
        self.pacing: PaceLoop | None = None  # the pace loop, while run() runs
        self._slo_spec = slo
        self.slo: SloKeeper | None = None  # its governor, from the join on
        self._in_flight = InFlightClock()  # the time it had requests in flight (its governor's measure of use)

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
            self.proc = start_command(kind_record(self.kind), self.args, self.log_path)
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
                self.group.watchdog = watchdog.start(self.proc.pid, STOP_GRACE_S)
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
            # running before the control socket exists: a status asked as soon as it appears says so
            self.engine_status.state = "running"
            self._control = ControlServer(self.proc.pid, handlers)
        except BaseException:
            self.shutdown()
            raise
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

    def _own_children(self) -> tuple[int, ...]:
        """Our children that are no part of the engine: the front proxy's process."""
        proxy = self.proxy
        return (proxy.proc.pid,) if proxy is not None and proxy.proc is not None else ()

    def _slo_keeper(self, target: SloTarget, bounds: GovernorBounds) -> SloKeeper:
        """The governor of the engine's latency target, fed by the front proxy's figures (none without one)."""
        proxy = self.proxy
        if proxy is None:
            self._say("gpushare-tui: governor: no front proxy (--no-proxy, or no port to front): no figures, it holds")
        snapshot = (lambda: proxy.latency) if proxy is not None else (lambda: None)
        return SloKeeper(
            target, bounds, engine=self, snapshot=snapshot, usage=self._usage, log_path=self.log_path, say=self._say
        ).start()

    def _usage(self) -> tuple[int, float] | None:
        """The governor's view of what its share costs: the µs the engine had requests in flight (its front proxy's
        DEMAND: what its work asks of the device, whether it runs or waits; its busy_total_us counts all the time
        it was continued between activity marks up to 1.2 s apart, which a request a second fills), and the
        weights of the schedule's other members (spec §5's, now) summed; None before the join."""
        m = self.membership
        if m is None or m.slot is None:
            return None
        now = wall_us()
        others = sum(float(r.weight) for r in m.read_slots() if r.index != m.slot and r.is_member(now))
        return self._in_flight.total_us(mono_us()), others

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
        m, proc = self.membership, self.proc
        assert m is not None and proc is not None  # started and joined
        monitor = Monitor(
            m,
            proc,
            self.group,
            self.engine_status,
            activity_spec=self.activity_spec,
            base_url=self.base_url,
            gpu_busy=self._gpu_busy,
            proxied=self.upstream is not None,
            may_probe=self._may_probe,
            quit_event=self._quit,
            say=self._say,
        )
        self._monitor = threading.Thread(target=monitor.run, name="gpushare-monitor", daemon=True)
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
        self._in_flight.set(demand, mono_us())
        if self.membership is not None:
            self.membership.set_demand(demand)
        if demand and self.pacing is not None:
            self.pacing.demand_rose()  # re-read before the engine's first step outside its window (spec §7)

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
            edges=edges.report(list(self.edges), mono_us()),
            latency=self.proxy.latency.report if self.proxy is not None and self.proxy.latency is not None else None,
            slo=self.slo.report() if self.slo is not None else None,
            held_off_trips=self.pacing.policy.hold_off.tripped if self.pacing is not None else None,
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
                self.group.terminate()
            code = proc.wait()
            self.engine_status.exit_code = 128 - code if code < 0 else code
            self.engine_status.state = "exited"
            self.group.end_rest()
        if self.group.watchdog is not None:
            self.group.watchdog.close()
            self.group.watchdog = None
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

    # -- the engine's process group (process_group.EngineGroup) -------------

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.group.proc

    @proc.setter
    def proc(self, proc: subprocess.Popen | None) -> None:
        self.group.proc = proc

    @property
    def _stopped(self) -> bool:
        return self.group.stopped

    def _suspend(self) -> None:
        self.group.suspend()

    def _resume(self, force: bool = False) -> None:
        self.group.resume(force)

    def run_us(self) -> int:
        """The engine's total continued (not stopped) time so far, µs (monotonic)."""
        return self.group.run_us()

    # -- pacing (pace_loop.PaceLoop drives the pacing policy) ---------------

    def _pace_loop(self) -> None:
        """SIGCONT/SIGSTOP at the window edges, by the pacing policy (core/pacing/policy.py)."""
        m, proc = self.membership, self.proc
        assert m is not None and proc is not None
        self.pacing = PaceLoop(
            m,
            alive=lambda: proc.poll() is None,
            quit_event=self._quit,
            stop=self._suspend,
            cont=self._resume,
            stopped=lambda: self._stopped,
            lateness_us=self.lateness_us,
            edges=self.edges,
            read_threads=lambda with_wait: activity.engine_cpu_ns(proc.pid, with_wait),
            cores=activity.cores_of(proc.pid),
            demand_exact=self.upstream is not None,  # the front proxy publishes DEMAND at each request's start and end
        )
        self.pacing.run()

    def lateness_summary(self) -> dict:
        """p50/p99/max µs by which SIGCONT/SIGSTOP trailed their window edges."""
        return lateness_summary(self.lateness_us)

    def _may_probe(self) -> bool:
        """Not stopped, and not too near the end of the run in progress (a probe then would outlast it)."""
        if self._stopped:
            return False
        end = self.pacing.window_end_us if self.pacing is not None else None
        return end is None or end - wall_us() >= PROBE_MARGIN_US
