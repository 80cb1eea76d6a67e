"""`gpushare-tui demo`: three real synthetic engines on a demo key, and the dashboard on them.

Works on any machine (no GPU, no model). The engines are real processes
(`gpushare-tui synth`) that join the registry, pace themselves and serve the
control socket, so every admin key works on them. On exit — `q`, Ctrl-C,
SIGTERM/SIGINT/SIGHUP, or an error — they are ended (by pid) and the demo
segment and engine logs are removed, unless live peers other than the demo's
engines use the segment (a --gpu-key shared with other engines). Engines that
end while the demo runs (`s` in the dashboard) are reaped at once. If the demo
itself is killed outright, the engines get SIGTERM from the kernel
(PR_SET_PDEATHSIG) and a janitor process, which notices the demo's end by the
close of a pipe, removes the segment and logs. Engines launched from the dashboard's `l` form
(`Demo.adopt`) are the demo's too: ended with it, by it or by the janitor, and their logs removed.

`start_demo` / `stop_demo` import no Textual; `run_demo` adds the dashboard.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from .core.engines.spawn import spawn, synth_argv
from .core.host.clock import wall_us
from .core.host.errors import GpushareError
from .core.host.lifecycle import on_signals, termination_deferred
from .core.host.logtail import tail_text
from .core.pacing.control import is_managed
from .core.registry.segment import Segment, SegmentError, shm_path

# (name, weight, --busy-idle): a little idle/busy variation so the plots move.
DEMO_ENGINES: tuple[tuple[str, float, str | None], ...] = (
    ("chat", 2.0, None),
    ("batch", 1.0, None),
    ("agent", 1.0, "25:10"),
)


class DemoError(GpushareError, RuntimeError):
    """The demo engines could not be started."""


@dataclass
class Demo:
    key: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    janitor: subprocess.Popen | None = None
    stopped: threading.Event = field(default_factory=threading.Event)
    launched: list[tuple[int, str]] = field(default_factory=list)  # (pid, log) of adopted engines
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def adopt(self, pid: int, log: str) -> None:
        """An engine the dashboard's launch form started (its supervisor or synthetic engine `pid`,
        writing `log`; any thread): it ends with the demo, and the janitor is told so at once."""
        with self._lock:
            self.launched.append((pid, log))
            if self.stopped.is_set():  # the demo ended meanwhile
                _end_launched([pid])
                return
            if self.janitor is not None and self.janitor.stdin is not None:
                try:
                    self.janitor.stdin.write(f"{pid}\t{log}\n".encode())
                    self.janitor.stdin.flush()
                except (OSError, ValueError):
                    pass  # gone: stop_demo ends it anyway


def default_key() -> str:
    return f"demo-{os.getpid()}"


def alive_peers(key: str) -> list[int]:
    """Pids of the live peers on `key` (read-only); [] if there is no readable segment."""
    try:
        with Segment.attach_readonly(shm_path(key)) as seg:
            now = wall_us()
            return [r.pid for r in seg.read_slots() if r.is_alive(now)]
    except (SegmentError, OSError):
        return []


def start_demo(key: str | None = None, *, engines=DEMO_ENGINES, step_ms: float = 5.0, timeout_s: float = 20.0) -> Demo:
    """Start the engines and wait until all are registered; on failure nothing is left running."""
    demo = Demo(key or default_key())
    try:
        for name, weight, busy_idle in engines:
            # mkstemp: a new file of ours (O_EXCL, 0600), handed over as it is: never reopened by name
            fd, log = tempfile.mkstemp(prefix=f"gpushare-demo-{demo.key}-{name}-", suffix=".log")
            demo.logs.append(log)
            # step_ms's work at the reference rate, as any synth's: their TOK/S and those of the form's compare
            argv = synth_argv(gpu_key=demo.key, name=name, weight=weight, busy_idle=busy_idle, step_ms=step_ms)
            try:
                with termination_deferred():  # started and recorded, or neither: stop_demo ends what is recorded
                    demo.procs.append(spawn(argv, fd, parent_death=signal.SIGTERM))
            finally:
                os.close(fd)
        with termination_deferred():
            demo.janitor = _start_janitor(demo)
        deadline = time.monotonic() + timeout_s
        # registered and serving their control sockets (the dashboard manages them at once)
        while not set(demo.pids) <= set(alive_peers(demo.key)) or not all(is_managed(p.pid) for p in demo.procs):
            for p, path in zip(demo.procs, demo.logs):
                if p.poll() is not None:
                    last = tail_text(path, 1) or "no output"
                    raise DemoError(f"demo engine {p.pid} exited (code {p.returncode}): {last}")
            if time.monotonic() > deadline:
                raise DemoError(f"demo engines did not register on {demo.key} within {timeout_s:g} s")
            time.sleep(0.05)
    except BaseException:
        stop_demo(demo)
        raise
    threading.Thread(target=_reap, args=(demo,), name="gpushare-demo-reap", daemon=True).start()
    return demo


REAP_EVERY_S = 0.5


def _reap(demo: Demo) -> None:
    """Wait for engines that end while the demo runs (stopped from the dashboard), so none stays <defunct>."""
    while not demo.stopped.wait(REAP_EVERY_S):
        for p in demo.procs:
            p.poll()


def _start_janitor(demo: Demo) -> subprocess.Popen:
    """A process that removes the segment and logs once this one is gone, even by SIGKILL: it
    reads a pipe whose only writer is this process, so the read ends when this process does."""
    argv = [sys.executable, "-c", "from gpushare_tui.demo import janitor_main; janitor_main()", demo.key]
    argv += [str(p) for p in demo.pids] + ["--", *demo.logs]
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not ended with the demo's terminal or process group
    )


def janitor_main() -> None:
    """`KEY PID... -- LOG...`: wait for EOF on stdin, then for the engines to end (SIGKILL after
    JANITOR_GRACE_S), then remove what they left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    args = sys.argv[1:]
    sep = args.index("--")
    key, pids, logs = args[0], [int(a) for a in args[1:sep]], args[sep + 1 :]
    adopted = [line.split("\t", 1) for line in sys.stdin.buffer.read().decode().splitlines() if "\t" in line]
    launched = [int(pid) for pid, _log in adopted if pid.isdigit()]
    _end_launched(launched)  # no PR_SET_PDEATHSIG for them: they started detached
    pids, logs = pids + launched, logs + [log for _pid, log in adopted]
    _kill_after(pids, JANITOR_GRACE_S)
    _remove_leftovers(key, pids, logs)


JANITOR_GRACE_S = 5.0
LAUNCHED_GRACE_S = 15.0  # a launched supervisor gives its engine 10 s after SIGTERM


def _end_launched(pids: list[int]) -> None:
    """SIGCONT + SIGTERM each (a supervisor then ends its engine)."""
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGTERM):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (an orphaned engine waits for init to reap it)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _remove_leftovers(key: str, pids: list[int], logs: list[str]) -> None:
    """Remove the segment (unless live peers other than `pids` use it) and the logs."""
    if not set(alive_peers(key)) - set(pids):
        try:
            os.unlink(shm_path(key))
        except FileNotFoundError:
            pass
    for path in logs:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def stop_demo(demo: Demo, grace_s: float = 3.0) -> None:
    """End every engine (SIGTERM, then SIGCONT+SIGKILL by pid), remove the segment and logs. Idempotent.

    The segment stays if live peers other than the demo's engines use it (a --gpu-key shared
    with real engines): unlinking it would put later joiners in a second registry. A termination
    signal meanwhile takes effect once it is done (lifecycle.termination_deferred)."""
    with termination_deferred():
        _stop_demo(demo, grace_s)


def _stop_demo(demo: Demo, grace_s: float) -> None:
    demo.stopped.set()
    for p in demo.procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGCONT)
                p.terminate()
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for p in demo.procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                p.send_signal(signal.SIGCONT)
                p.kill()
            except ProcessLookupError:
                pass
            p.wait()
    with demo._lock:
        launched = list(demo.launched)
    _end_launched([pid for pid, _ in launched])
    _kill_after([pid for pid, _ in launched], LAUNCHED_GRACE_S)
    _remove_leftovers(demo.key, demo.pids + [pid for pid, _ in launched], demo.logs + [log for _, log in launched])
    demo.logs.clear()
    if demo.janitor is not None:
        demo.janitor.kill()  # nothing left for it to do
        demo.janitor.wait()
        if demo.janitor.stdin is not None:  # (always: it is started with stdin=PIPE)
            demo.janitor.stdin.close()
        demo.janitor = None


def run_demo(
    *, interval_s: float = 1.0, readonly: bool = False, key: str | None = None, history_s: float | None = None
) -> None:
    """Start the engines, run the dashboard on them, clean up however it ends. DemoError if the
    engines could not be started."""
    state: dict = {"app": None}

    def on_signal(signum: int) -> None:
        app = state["app"]
        loop = getattr(app, "_loop", None) if app is not None else None
        if loop is not None and loop.is_running():  # each time: an exception raised inside its loop is a traceback
            loop.call_soon_threadsafe(app.exit)  # leave the terminal tidy; `finally` cleans up
            return
        raise SystemExit(128 + signum)

    restore_signals = on_signals(on_signal)
    demo = None
    try:
        print("gpushare-tui demo: starting 3 synthetic engines (weights 2/1/1)…", file=sys.stderr, flush=True)
        demo = start_demo(key)
        from .app import DashboardApp
        from .widgets.launch_form import launch_in_worker

        adopt = demo.adopt

        def launch(spec):  # what the `l` form starts is the demo's: it ends with the demo
            return launch_in_worker(spec, started=adopt)

        app = DashboardApp(
            gpu_key=demo.key,
            interval_s=interval_s,
            readonly=readonly,
            history_s=history_s,
            launch_runner=launch,
            demo=True,
        )
        state["app"] = app
        app.run()
    finally:
        if demo is not None:
            stop_demo(demo)
        restore_signals()


def _kill_after(pids: list[int], grace_s: float) -> None:
    """Wait up to `grace_s` for `pids` to exit, then continue and kill the ones still running."""
    deadline = time.monotonic() + grace_s
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if _running(pid):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
