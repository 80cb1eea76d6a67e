"""The front proxy (core/engines/front_proxy.py) in a process of its own beside the supervisor: its event loop
shares no interpreter lock with the pace loop, whose window edges its relay would otherwise delay (measured
in bench/proxy.py --lateness), and its CPU is its own.

    proxy = ProxyProcess(listen, upstream, on_demand=..., seed_view=..., on_error=..., sock=..., engine_ready=False)
    proxy.start()            # bound now (ProxyError if the port is taken), or the socket handed down
    proxy.set_engine_ready()
    proxy.close()

The child is `python -m gpushare_tui.core.engines.proxy_process LISTEN_FD CONTROL_FD HOST PORT READY SEED`,
given the listening socket and one end of a socketpair; it ends at EOF on the pair (the supervisor closed it, or
died: PR_SET_PDEATHSIG too). Lines on the pair, child to parent: `demand 1` / `demand 0` (the moment the proxy
sees them), `seed` (asks for the engine's GPU entry), `error TEXT`, `latency JSON` (its latency figures, at most
every latency_link.LATENCY_SNAPSHOT_S, when they changed); parent to child: `ready`, `seed JSON`.
The interface is FrontProxy's: on_demand and on_error are called on a thread of the parent, seed_view too; the
latency figures are `latency` (the last snapshot received: latency_link.LatencySnapshot, None before one)."""

from __future__ import annotations

import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from ..host.errors import GpushareError
from . import spawn
from .front_proxy import FrontProxy, ProxyError, listen_socket
from .latency_link import LATENCY_SNAPSHOT_S, LatencySnapshot, parse_snapshot, snapshot_line

START_TIMEOUT_S = 30.0  # the child says it serves (imports, a loop) within this
STOP_TIMEOUT_S = 5.0
RESTART_DELAY_S = 0.5  # before a child that ended unasked is started again (connections wait in the backlog)
SEED_TIMEOUT_S = 5.0  # the parent answers a seed request within this (else the proxy says it cannot read it)
LINE_MAX_BYTES = 2**20  # a control line (a seed view of many peers is the longest)


class ProxyProcess:
    """FrontProxy's interface, its loop in a child process. `port`: the public port."""

    def __init__(
        self,
        listen: tuple[str, int],
        upstream: tuple[str, int],
        *,
        on_demand: Callable[[bool], None] | None = None,
        seed_view: Callable[[], dict] | None = None,
        on_error: Callable[[str], None] | None = None,
        sock: socket.socket | None = None,
        engine_ready: bool = True,
    ) -> None:
        self.listen, self.upstream = listen, upstream
        self._on_demand, self._seed_view, self._on_error = on_demand, seed_view, on_error
        self._sock = sock
        self._ready = engine_ready
        self._ctl: socket.socket | None = None
        self._lines: BinaryIO | None = None
        self._send_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._closing = False
        self._demand = False  # as the child last said
        self.latency: LatencySnapshot | None = None  # the child's figures, as last received
        self.proc: subprocess.Popen | None = None

    @property
    def port(self) -> int:
        assert self._sock is not None, "start() first"
        return self._sock.getsockname()[1]

    def start(self) -> ProxyProcess:
        """Bind (unless a socket was handed down), then start the child; ProxyError if either fails."""
        if self._sock is None:
            self._sock = listen_socket(self.listen)
        try:
            self._spawn()
        except ProxyError:
            self.close()
            raise
        self._reader = threading.Thread(target=self._read, name="gpushare-proxy-ctl", daemon=True)
        self._reader.start()
        return self

    def _spawn(self) -> None:
        """A child serving the socket, once it says so (ProxyError if it does not)."""
        assert self._sock is not None
        ours, theirs = socket.socketpair()
        argv = [sys.executable, "-m", __name__, str(self._sock.fileno()), str(theirs.fileno())]
        argv += [self.upstream[0], str(self.upstream[1]), str(int(self._ready)), str(int(self._seed_view is not None))]
        try:
            self.proc = spawn.spawn(
                argv, 2, pass_fds=(self._sock.fileno(), theirs.fileno()), parent_death=signal.SIGTERM
            )
        except OSError as e:
            ours.close()
            raise ProxyError(f"cannot start the front proxy: {e.strerror or e}") from None
        finally:
            theirs.close()
        self._ctl, self._lines = ours, ours.makefile("rb")
        ours.settimeout(START_TIMEOUT_S)
        try:  # until "serving": its loop runs (and may have taken a request waiting in the backlog: said first)
            while (first := self._lines.readline(LINE_MAX_BYTES)) not in (b"serving\n", b""):
                self._line(first)
        except OSError:
            first = b""
        if first != b"serving\n":
            ours.close()
            self._ctl = None
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            raise ProxyError("the front proxy process did not start (its error is in the log above)")
        ours.settimeout(None)
        if self._ready:  # told while it started
            self._send(b"ready")

    def set_engine_ready(self) -> None:
        self._ready = True
        self._send(b"ready")

    def close(self) -> None:
        """Stop the child (connections in progress are cut) and close our copy of the socket. Idempotent."""
        self._closing = True
        ctl, self._ctl = self._ctl, None
        if ctl is not None:
            try:
                ctl.shutdown(socket.SHUT_RDWR)  # the child's EOF: it closes and exits
            except OSError:
                pass
            ctl.close()
        if self.proc is not None:
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(STOP_TIMEOUT_S)
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, line: bytes) -> None:
        ctl = self._ctl
        if ctl is None:
            return
        with self._send_lock:
            try:
                ctl.sendall(line + b"\n")
            except OSError:
                pass

    def _read(self) -> None:
        """The child's lines, until it ends; one that ends unasked (a crash, a kill) is started again, from this
        thread (PR_SET_PDEATHSIG follows the thread that forks), after RESTART_DELAY_S."""
        while True:
            lines = self._lines
            assert lines is not None
            try:
                for line in lines:
                    self._line(line)
            except (OSError, ValueError):  # closed under us
                pass
            if self._closing:
                return
            code = self.proc.wait() if self.proc is not None else None
            if self._demand:  # its requests in flight ended with it
                self._line(b"demand 0\n")
            self._say(f"the front proxy process exited ({code}); starting it again")
            while not self._closing:
                time.sleep(RESTART_DELAY_S)
                try:
                    self._spawn()
                    break
                except ProxyError as e:
                    self._say(str(e))
            if self._closing:
                if self.proc is not None and self.proc.poll() is None:
                    self.proc.kill()
                return

    def _line(self, line: bytes) -> None:
        if line == b"demand 1\n" or line == b"demand 0\n":
            self._demand = line == b"demand 1\n"
            if self._on_demand is not None:
                self._on_demand(self._demand)
        elif line == b"seed\n":
            self._send(b"seed " + json.dumps(self._seed(), allow_nan=False).encode())
        elif line.startswith(b"latency "):
            snap = parse_snapshot(line[8:], time.monotonic())
            if snap is not None:
                self.latency = snap
        elif line.startswith(b"error "):
            self._say(line[6:].decode("utf-8", "replace").rstrip("\n"))

    def _say(self, why: str) -> None:
        if self._on_error is not None:
            self._on_error(why)

    def _seed(self) -> dict:
        try:
            assert self._seed_view is not None
            return self._seed_view()
        except Exception as e:  # a segment that cannot be read is said, not raised
            return {"error": f"cannot read the segment: {e}"}


def _serve(listen_fd: int, ctl_fd: int, upstream: tuple[str, int], ready: bool, seeded: bool) -> None:
    """The child: a FrontProxy on the socket handed down, told and telling through the pair."""
    ctl = socket.socket(fileno=ctl_fd)
    lock = threading.Lock()
    seeds: queue.Queue[bytes] = queue.Queue()

    def send(line: str) -> None:
        with lock:
            try:
                ctl.sendall(line.encode() + b"\n")
            except OSError:
                pass

    def seed_view() -> dict:
        send("seed")
        return json.loads(seeds.get(timeout=SEED_TIMEOUT_S))

    sock = socket.socket(fileno=listen_fd)
    proxy = FrontProxy(
        sock.getsockname()[:2],
        upstream,
        on_demand=lambda demand: send(f"demand {int(demand)}"),
        seed_view=seed_view if seeded else None,
        on_error=lambda why: send("error " + " ".join(why.split())),
        sock=sock,
        engine_ready=ready,
    ).start()
    send("serving")
    done = threading.Event()
    threading.Thread(target=_send_latency, args=(proxy, send, done), name="gpushare-latency", daemon=True).start()
    try:
        for line in ctl.makefile("rb"):
            if line == b"ready\n":
                proxy.set_engine_ready()
            elif line.startswith(b"seed "):
                seeds.put(line[5:])
    finally:
        done.set()
        proxy.close()


def _send_latency(proxy: FrontProxy, send: Callable[[str], None], done: threading.Event) -> None:
    """The proxy's latency figures to the parent every LATENCY_SNAPSHOT_S, when they changed (off the loop's
    thread: measured 0.7 ms and a 5.5 KB line for a full minute of 50 streamed requests a second)."""
    last = b""
    while True:
        line = snapshot_line(proxy.latency, time.monotonic())
        if line != last:
            send(line.decode())
            last = line
        if done.wait(LATENCY_SNAPSHOT_S):
            return


def main(argv: list[str]) -> int:
    try:
        listen_fd, ctl_fd, host, port, ready, seeded = argv
        _serve(int(listen_fd), int(ctl_fd), (host, int(port)), ready == "1", seeded == "1")
    except (ValueError, OSError, GpushareError) as e:
        print(f"gpushare-tui: front proxy: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
