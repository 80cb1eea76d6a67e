"""`GpuShare` (public as `gpushare_tui.GpuShare`): the pacer for Python engines (a PyTorch inference or training loop).

    from gpushare_tui import GpuShare
    with GpuShare(weight=2, name="trainer", gpu=0) as share:   # or gpu_key="..."
        for batch in loader:
            step(batch); torch.cuda.synchronize()
            share.pace()          # sleeps until this engine's next window when outside it

It joins the GPU's registry (heartbeats, leaves on exit), marks the engine active at each
`pace()` (idle again 2 s after the last one), sleeps outside its windows, publishes its busy
fraction, and serves the same control socket as a supervised llama-server, so the dashboard
and `gpushare-tui weight/stop` can re-weight or stop it.

Registry Extension 1 (spec §7): it sets EXT1 and publishes DEMAND (work in flight): `pace()`
raises it, `share.idle()` drops it at once, `with share.busy():` holds it for a block (raise it
as work arrives, before the first step), and it drops DEMAND_TIMEOUT_S after the last `pace()`
of a loop that simply stops. While a priority (interactive) member runs, `pace()` waits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator

from ..host.clock import mono_us, wall_us
from ..host.lifecycle import termination_deferred
from ..registry import abi
from ..registry.membership import Membership
from ..registry.ownership import Owner
from . import edges
from .control import ControlServer, StatusReply, control_handlers
from .pacer import Pacer
from .sockets import socket_path

RATE_WINDOW_S = 1.0  # pace() calls are counted over windows this long for `steps_per_s`
SCHEDULE_REREAD_US = 10_000  # pace() re-reads the registry at most this often (windows are >= 40 ms;
# at every step while an INTERACTIVE peer is alive: a new priority member stops us within one step)
# DEMAND (spec §7) drops this long after pace() last returned, for loops that just stop calling it:
# longer than a decode step (5-50 ms) with the GIL contended, short beside a request's gap. A step
# longer than half of it stretches it (DEMAND_TIMEOUT_STEPS steps), up to the 2 s activity window.
DEMAND_TIMEOUT_S = 0.100
DEMAND_TIMEOUT_STEPS = 2
DEMAND_TIMEOUT_MAX_S = 2.0


class GpuShare:
    """One engine's share of one GPU (a control.ManagedEngine). Thread-safe: `pace()`,
    `set_weight()`, `stop()` and `close()` may be called from any thread; concurrent `pace()`
    calls outside the window all sleep until it opens.

    Busy: the time between a `pace()` returning and the next `pace()` call is work; the time
    `pace()` spends asleep (outside our windows) is not. The fraction over each ~1 s is published
    in the registry (the dashboard's "busy"). With `control=True` a control socket answers
    `status`, `set_weight` and `stop` (the methods of those names); `stop` sets `stop_requested`
    (and calls `on_stop`): the loop should check it and end. GpushareError (one clear line) if
    the key is bad, no slot is free, or the socket cannot be bound; nothing is left behind then.
    """

    _owner: Owner | None = None  # `up`, when it owns this engine (set by the synthetic engine's subclass)

    def __init__(
        self,
        weight: float = 1.0,
        name: str = "python",
        *,
        gpu: int | None = None,
        gpu_key: str | None = None,
        share_group: str | None = None,
        control: bool = True,
        kind: str = "python",
        model: str | None = None,
        on_stop: Callable[[], None] | None = None,
        klass: str = "batch",
    ) -> None:
        """`klass`: the latency class, "interactive" or "batch" (spec §7; see set_class)."""
        if gpu_key is None:
            from ..observe.gpu import gpu_key_for_index  # NVML only when a GPU index is asked for

            gpu_key = gpu_key_for_index(gpu or 0, key_hint='pass gpu_key="KEY"')
        self.klass = abi.validate_class(klass, label="klass")
        self.name = name
        self.kind = kind
        self.model = model
        self.stop_requested = threading.Event()
        self._on_stop = on_stop
        self._control = control
        self._membership = Membership(  # spec §7
            gpu_key, weight, name, share_group=share_group, ext1=True, interactive=self.klass == "interactive"
        )
        # §5.7 literally, no edge trim: on a quiet machine both split 2:1 within 2 % and the trim cost
        # 7-17 points of aggregate (bench.gpu_share --trim, 2 rounds each)
        self._pacer = Pacer(self._membership, reread_us=SCHEDULE_REREAD_US)
        self._lock = threading.Lock()  # the pacer's accounting, and its sleep (one sleeper wakes the rest in-window)
        self._server: ControlServer | None = None
        self._started_mono_us = mono_us()
        self._steps = 0
        self._rate_t0 = time.monotonic()
        self._rate_steps = 0
        self.steps_per_s = 0.0
        self.state = "new"
        self._demand_cv = threading.Condition()
        self._demand_until = 0.0  # time.monotonic() at which DEMAND drops unless pace() is called again
        self._busy_depth = 0  # `with share.busy():` blocks open (DEMAND held throughout)
        self._last_step_s = 0.0
        self._demand_thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------

    def open(self) -> GpuShare:
        """Join the registry and start serving the control socket. Returns self; a no-op when open
        (so `with GpuShare(...).open() as share:` holds one slot). A termination signal meanwhile
        (lifecycle.termination_deferred) takes effect once it is open, and `close()` registered."""
        if self.state == "running":
            return self
        if self._control:
            socket_path(os.getpid())  # an unusable runtime dir fails here, before joining
        # One section: a handler's exit raised half-way (between a thread's creation and its start, a
        # bind() and the assignment) would leave what close() cannot see, or join a thread never started.
        with termination_deferred():
            # each GpuShare of a process serves its own socket (`<pid>.sock`, then `<pid>.1.sock`, ...)
            self._membership.join()
            try:
                if self._control:
                    self._server = ControlServer(os.getpid(), control_handlers(self, self._owner))
            except BaseException:
                self._membership.leave()
                raise
            self._started_mono_us = mono_us()
            self.state = "running"
            self._demand_thread = threading.Thread(target=self._demand_loop, name="gpushare-demand", daemon=True)
            self._demand_thread.start()
            atexit.register(self.close)  # a loop that never calls close() leaves no socket file behind
        return self

    def close(self) -> None:
        """Stop serving, leave the registry. Idempotent."""
        with termination_deferred():
            if self._server is not None:
                self._server.close()
                self._server = None
            with self._demand_cv:
                self._demand_until = -1.0  # the watcher ends
                self._demand_cv.notify_all()
            thread = self._demand_thread
            if thread is not None and thread is not threading.current_thread() and thread.ident is not None:
                thread.join(timeout=2)  # (only a started thread can be joined)
            self._demand_thread = None
            self._membership.leave()
        atexit.unregister(self.close)
        if self.state != "new":
            self.state = "exited"

    def __enter__(self) -> GpuShare:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop ----------------------------------------------------------

    def pace(self, step_us: int | None = None) -> int:
        """Call after each step (once its GPU work is synchronised). Marks us active, raises DEMAND
        (spec §7: dropped by `idle()`, or DEMAND_TIMEOUT_S after the last pace() returned) and, when
        the step ended outside our window (or a priority member holds the device), sleeps until we
        may run. Returns the µs slept. `step_us`: the step's busy time, by default the time since
        `pace()` last returned. Before `open()` and after `close()` it returns 0 at once."""
        if self.state not in ("running", "exiting"):
            return 0
        with self._lock:
            t0 = time.monotonic()
            with self._demand_cv:  # DEMAND is held while pace() sleeps or waits (spec §7: a paced engine keeps it)
                self._busy_depth += 1
            try:
                slept = self._pacer.step_done(step_us)
            finally:
                with self._demand_cv:
                    self._busy_depth -= 1
            self._steps += 1
            now = time.monotonic()
            # the step's length stretches the timeout; without step_us, the time since the last pace() is
            # the step only while DEMAND was still held (else that gap was idle: the loop had stopped)
            held = self._last_return_s > 0 and t0 - self._last_return_s <= self._demand_timeout_s()
            step_s = (step_us / 1e6) if step_us is not None else (t0 - self._last_return_s if held else 0.0)
            self._last_step_s, self._last_return_s = step_s, now
            self._hold_demand(now)
            if now - self._rate_t0 >= RATE_WINDOW_S:
                self.steps_per_s = (self._steps - self._rate_steps) / (now - self._rate_t0)
                self._rate_t0, self._rate_steps = now, self._steps
        return slept

    _last_return_s = 0.0

    def _demand_timeout_s(self) -> float:
        return min(max(DEMAND_TIMEOUT_S, DEMAND_TIMEOUT_STEPS * self._last_step_s), DEMAND_TIMEOUT_MAX_S)

    def _hold_demand(self, now: float) -> None:
        timeout = self._demand_timeout_s()
        with self._demand_cv:
            wake = self._demand_until <= 0
            self._demand_until = now + timeout
            if wake:
                self._demand_cv.notify_all()

    def _demand_loop(self) -> None:
        """Drops DEMAND once its deadline passed with no pace() and no busy() block open."""
        with self._demand_cv:
            while self._demand_until >= 0:
                if self._demand_until == 0 or self._busy_depth:
                    self._demand_cv.wait()
                    continue
                left = self._demand_until - time.monotonic()
                if left > 0:
                    self._demand_cv.wait(left)
                    continue
                self._demand_until = 0.0
                self._membership.set_demand(False)

    def idle(self) -> None:
        """Our work ended: drop DEMAND (and `active`) at once, so the others run without us."""
        with self._demand_cv:
            if self._demand_until > 0:
                self._demand_until = 0.0
            if not self._busy_depth:
                self._membership.set_demand(False)
                self._membership.mark_idle()

    @contextlib.contextmanager
    def busy(self) -> Iterator[GpuShare]:
        """`with share.busy():` holds DEMAND for the block (work in flight, pace() called or not);
        it drops when the block ends, unless pace() was called within DEMAND_TIMEOUT_S."""
        with self._demand_cv:
            self._busy_depth += 1
            self._membership.set_demand(True)
        try:
            yield self
        finally:
            with self._demand_cv:
                self._busy_depth -= 1
                if not self._busy_depth and self._demand_until <= 0:
                    self._membership.set_demand(False)
                self._demand_cv.notify_all()

    def active(self) -> None:
        """Mark us active without pacing (a step run unpaced); it raises DEMAND like pace()."""
        self._membership.mark_active()
        self._membership.set_demand(True)
        self._hold_demand(time.monotonic())

    # -- state -------------------------------------------------------------

    @property
    def membership(self) -> Membership:
        return self._membership

    @property
    def gpu_key(self) -> str:
        return self._membership.key

    @property
    def slot(self) -> int | None:
        return self._membership.slot

    @property
    def weight(self) -> float:
        return self._membership.weight

    @property
    def steps(self) -> int:
        return self._steps

    @property
    def slept_us(self) -> int:
        return self._pacer.total_slept_us

    @property
    def control_path(self) -> str | None:
        return self._server.path if self._server else None

    def set_weight(self, weight: float) -> float:
        """Validate (finite, > 0) and publish; returns the stored (f32) value."""
        return self._membership.set_weight(weight)

    def set_class(self, klass: str) -> str:
        """Publish the latency class ("interactive" | "batch", spec §7 INTERACTIVE) at once; the class now."""
        self.klass = abi.validate_class(klass, label="klass")
        self._membership.set_interactive(self.klass == "interactive")
        return self.klass

    def stop(self) -> str:
        """Ask the loop to end (what the control socket's `stop` does): sets `stop_requested`,
        calls `on_stop`. Returns the state now reported, "exiting"."""
        self.state = "exiting"
        self.stop_requested.set()
        if self._on_stop is not None:
            self._on_stop()
        return "exiting"

    def status(self) -> StatusReply:
        """What the control socket's `status` answers."""
        from ..observe.snapshot import own_peer

        m = self._membership
        me = own_peer(m.key, m.read_slots(), m.slot, wall_us()) if m.slot is not None else None
        return StatusReply(
            engine_pid=os.getpid(),
            model=self.model,
            name=self.name,
            kind=self.kind,
            state=self.state,
            tok_s=self.steps_per_s,
            weight=m.weight,
            share_pct=me.share_pct if me else 0.0,
            busy_pct=me.busy_pct if me else 0.0,
            uptime_s=(mono_us() - self._started_mono_us) / 1e6,
            slot=m.slot,
            gpu_key=m.key,
            edges=edges.report(list(self._pacer.edges), mono_us()),
        )
