"""Per-engine control socket: one JSON request line, one JSON reply line.

Socket: `<runtime dir>/<engine pid>.sock`, mode 0600, in the 0700 per-user runtime
directory (core/paths.py).
Requests: {"cmd": "status"} | {"cmd": "set_weight", "weight": W} | {"cmd": "stop"}.
Replies: {"ok": true, ...} or {"ok": false, "error": "..."}; the fields of a `status`
reply are those of StatusReply (every one present, null when unknown).

Limits (a local client must not be able to hurt the engine): a request line
holds at most MAX_REQUEST_BYTES (without its newline) and must arrive within
READ_TIMEOUT_S of the connection being accepted; at most MAX_CONNECTIONS are
served at once, and any more get {"ok": false, "error": "busy: ..."} at once.
"""

from __future__ import annotations

import functools
import json
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass, replace
from typing import Protocol, get_args, get_type_hints, runtime_checkable

import psutil

from .abi import parse_weight
from .errors import ControlError, GpushareError
from .ownership import Owner
from .paths import runtime_dir, runtime_dir_path, unlink_in

MAX_REQUEST_BYTES = 4096
READ_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 16
SUN_PATH_MAX = 107  # bytes of an AF_UNIX path, without the NUL (sun_path is 108 on Linux)
PID_DIGITS_MAX = 7  # the largest Linux pid_max, 4194304
LISTEN_BACKLOG = 64
ACCEPT_BACKOFF_S = 0.05  # out of fds (EMFILE/ENFILE): wait for some to close instead of spinning
CLOSE_GRACE_S = 1.0  # close() waits this long for replies already being written (a `stop` reply)

_BAD_REQUEST = "bad request: expected one JSON object with a 'cmd'"


@dataclass(frozen=True)
class SignalLateness:
    """How late (µs) a supervisor's SIGCONT/SIGSTOP went out after their window edges."""

    n: int | None = None
    p50_us: int | None = None
    p99_us: int | None = None
    max_us: int | None = None


@dataclass(frozen=True)
class StatusReply:
    """The fields of a `status` reply, the same for every kind of engine. None: unknown or
    not applicable (a synthetic engine has no port, log or signal lateness)."""

    engine_pid: int | None = None
    port: int | None = None
    model: str | None = None
    name: str | None = None
    kind: str | None = None  # "llama-server" | "synth"
    state: str | None = None  # loading / running / stopped / exiting / exited ...
    tok_s: float | None = None  # over the last complete rate window (~1 s) of work; 0.0 when idle
    solo_tok_s: float | None = None  # the best tok_s reached as the schedule's only active member
    weight: float | None = None
    share_pct: float | None = None
    busy_pct: float | None = None
    uptime_s: float | None = None
    slot: int | None = None
    gpu_key: str | None = None
    log: str | None = None
    signal_lateness: SignalLateness | None = None
    # set when `gpushare-tui up` owns the engine (core/ownership.py)
    owner: str | None = None  # "up"
    owner_pid: int | None = None
    config: str | None = None  # the file that declares it
    config_weight: float | None = None  # its weight there (the live weight may differ: a dashboard edit)
    restarts: int | None = None

    def to_json(self) -> dict:
        """Every field, in order; None as null."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> StatusReply:
        """A reply as an engine sent it (any JSON value): a field that is missing or of the wrong
        type is None (a string stays the string it was, unsanitised; a number must be finite);
        other keys ("ok", unknown ones) are ignored. Never raises."""
        return cls(**_typed_fields(cls, data if isinstance(data, dict) else {}))


def _typed_fields(cls: type, data: dict) -> dict:
    """The fields of dataclass `cls` (each `T | None`) from `data`, each None unless it is a T."""
    return {name: _typed(data.get(name), kind) for name, kind in _field_kinds(cls).items()}


@functools.cache
def _field_kinds(cls: type) -> dict[str, type]:
    return {name: next(t for t in get_args(hint) if t is not type(None)) for name, hint in get_type_hints(cls).items()}


def _typed(value: object, kind: type) -> object:
    """`value` if it is a `kind` (an int is a float too, a bool is neither, a float must be finite), else None."""
    if is_dataclass(kind):
        return kind(**_typed_fields(kind, value)) if isinstance(value, dict) else None
    if kind is str:
        return value if isinstance(value, str) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if kind is int:
        return value if isinstance(value, int) else None
    try:
        return float(value) if math.isfinite(value) else None
    except OverflowError:  # an int beyond any float
        return None


def _check_length(path: str) -> None:
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise ControlError(
            f"control socket path {path} is longer than {SUN_PATH_MAX} bytes (the AF_UNIX limit); "
            "set XDG_RUNTIME_DIR to a shorter private directory"
        )


def socket_path(engine_pid: int) -> str:
    """`<runtime dir>/<pid>.sock`; ControlError if the directory is unusable or the path too long to bind."""
    path = os.path.join(runtime_dir_path(), f"{engine_pid}.sock")
    _check_length(path)  # before runtime_dir(): no directory is created for a path that cannot work
    runtime_dir()
    return path


def check_socket_dir() -> str:
    """The runtime directory, if a socket for any pid fits in it; else ControlError (fail fast
    before an engine is started whose pid is not known yet)."""
    _check_length(os.path.join(runtime_dir_path(), "9" * PID_DIGITS_MAX + ".sock"))
    return runtime_dir()


Handler = Callable[[dict], dict]


@runtime_checkable
class ManagedEngine(Protocol):
    """What a control socket serves: a supervised llama-server (core/supervisor.py), a Python
    engine (core/share.py's GpuShare) or a synthetic one (core/engines/synthetic.py)."""

    def status(self) -> StatusReply:
        """The `status` reply, without the owner's fields (control_handlers adds them)."""
        ...

    def set_weight(self, weight: float) -> float:
        """Publish a valid weight (finite, > 0); the stored value."""
        ...

    def stop(self) -> str:
        """Ask the engine to end (thread-safe, returns at once); the state the reply reports."""
        ...


def control_handlers(engine: ManagedEngine, owner: Owner | None = None) -> dict[str, Handler]:
    """The control socket's handlers for `engine`; with `owner` (`up` owns the engine) its status
    fields are in every `status` reply and its hooks wrap `stop` and `set_weight` (Owner.wrap)."""

    def status(_req: dict) -> dict:
        reply = engine.status()
        return (replace(reply, **owner.status_fields()) if owner else reply).to_json()

    def set_weight(req: dict) -> dict:
        return {"weight": engine.set_weight(parse_weight(req.get("weight")))}

    def stop(_req: dict) -> dict:
        return {"state": engine.stop()}

    handlers = {"status": status, "set_weight": set_weight, "stop": stop}
    return owner.wrap(handlers) if owner else handlers


class ControlServer:
    """Serves `handlers[cmd](request) -> reply fields`: one accept thread, and one worker
    thread per connection, at most MAX_CONNECTIONS at once. Every request gets one reply
    line, an error for anything malformed. ControlError if the socket cannot be set up."""

    def __init__(
        self,
        engine_pid: int,
        handlers: dict[str, Handler],
        *,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.path = socket_path(engine_pid)
        self._handlers = handlers
        self._max_connections = max_connections
        self._read_timeout_s = read_timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)  # notified whenever a connection ends
        self._conns: dict[socket.socket, bool] = {}  # open connections -> reply being written
        self._closed = False
        try:
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # wakes the accept loop on close()
        except OSError as e:
            raise ControlError(f"control socket {self.path}: {e.strerror}") from None
        try:
            self._sock = self._bind()
            try:
                self._thread = threading.Thread(target=self._accept_loop, name="gpushare-control", daemon=True)
                self._thread.start()
            except BaseException:  # incl. a SystemExit from a signal handler: no socket file left behind
                self._sock.close()
                self._unlink()
                raise
        except BaseException:
            os.close(self._wake_r)
            os.close(self._wake_w)
            raise

    def _bind(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bound = False
        try:
            unlink_in(self.path)  # a stale socket of a dead supervisor of the same pid
            old = os.umask(0o177)
            try:
                sock.bind(self.path)
                bound = True
            finally:
                os.umask(old)
            os.chmod(self.path, 0o600)
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
        except BaseException as e:
            sock.close()
            if bound:
                self._unlink()
            if isinstance(e, OSError):
                raise ControlError(f"control socket {self.path}: {e.strerror or e}") from None
            raise
        return sock

    def _unlink(self) -> None:
        unlink_in(self.path)  # relative to the checked directory: never through a swapped one

    # -- serving -----------------------------------------------------------

    def _accept_loop(self) -> None:
        poller = select.poll()
        poller.register(self._sock.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while not self._closed:
            poller.poll()
            if self._closed:
                return
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, ConnectionAbortedError):
                continue
            except OSError:
                # EMFILE/ENFILE/ENOBUFS: the connection stays queued and poll() keeps saying
                # so; wait for descriptors to be freed instead of spinning on it.
                self._pause(ACCEPT_BACKOFF_S)
                continue
            if not self._slots.acquire(blocking=False):
                self._refuse(conn, f"busy: {self._max_connections} control connections open, try again")
                continue
            with self._lock:
                self._conns[conn] = False
            try:
                threading.Thread(target=self._serve, args=(conn,), name="gpushare-control-conn", daemon=True).start()
            except RuntimeError:  # can't start new thread
                self._end(conn)
                self._pause(ACCEPT_BACKOFF_S)

    def _pause(self, seconds: float) -> None:
        """Sleep, but wake at once on close()."""
        wake = select.poll()
        wake.register(self._wake_r, select.POLLIN)
        wake.poll(seconds * 1000)

    @staticmethod
    def _refuse(conn: socket.socket, error: str) -> None:
        """An error reply without a thread: never blocks (the reply fits in an empty socket buffer)."""
        try:
            conn.setblocking(False)
            conn.send(_encode({"ok": False, "error": error}))
        except OSError:
            pass
        finally:
            conn.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            line, reply = self._read_request(conn)
            with self._lock:
                if self._closed:
                    return
                self._conns[conn] = True
            if reply is None:
                reply = self.dispatch(line)
            conn.settimeout(self._read_timeout_s)
            conn.sendall(_encode(reply))
        except OSError:
            pass  # the client went away
        finally:
            self._end(conn)

    def _read_request(self, conn: socket.socket) -> tuple[bytes, dict | None]:
        """(line, None), or (b"", an error reply) for a request too long or too slow.
        A request ends at its newline or, without one, where the client stops sending."""
        deadline = time.monotonic() + self._read_timeout_s
        buf = bytearray()
        while True:
            end = buf.find(b"\n")
            if end > MAX_REQUEST_BYTES or (end < 0 and len(buf) > MAX_REQUEST_BYTES):
                return b"", {"ok": False, "error": f"request too large (more than {MAX_REQUEST_BYTES} bytes)"}
            if end >= 0:
                return bytes(buf[:end]), None
            left = deadline - time.monotonic()
            if left <= 0:
                return b"", {"ok": False, "error": f"timeout: no request line within {self._read_timeout_s:g} s"}
            conn.settimeout(left)
            try:
                chunk = conn.recv(MAX_REQUEST_BYTES + 2 - len(buf))
            except TimeoutError:
                continue
            if not chunk:
                return bytes(buf), None
            buf += chunk

    def _end(self, conn: socket.socket) -> None:
        with self._lock:
            del self._conns[conn]
            self._ended.notify_all()
        conn.close()
        self._slots.release()

    def dispatch(self, line: bytes) -> dict:
        """The reply to one request line; never raises."""
        try:
            req = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: deeply nested arrays/objects
            return {"ok": False, "error": _BAD_REQUEST}
        if not isinstance(req, dict) or "cmd" not in req:
            return {"ok": False, "error": _BAD_REQUEST}
        cmd = req["cmd"]
        if not isinstance(cmd, str):
            return {"ok": False, "error": "bad request: 'cmd' must be a string"}
        handler = self._handlers.get(cmd)
        if handler is None:
            return {"ok": False, "error": f"unknown command {cmd!r}"}
        try:
            return {"ok": True, **handler(req)}
        except (ValueError, GpushareError) as e:
            return {"ok": False, "error": str(e)}
        except Exception as e:  # a handler bug must not drop the connection silently
            return {"ok": False, "error": f"internal error: {type(e).__name__}: {e}"}

    def close(self) -> None:
        """Stop serving and remove the socket file. Connections still waiting for their
        request are closed; replies being written get up to CLOSE_GRACE_S. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        os.write(self._wake_w, b"x")
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._sock.close()
        self._unlink()
        deadline = time.monotonic() + CLOSE_GRACE_S
        with self._lock:
            for conn, replying in self._conns.items():  # under the lock: none of them is closed yet
                if not replying:
                    try:
                        conn.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            while any(self._conns.values()) and (left := deadline - time.monotonic()) > 0:
                self._ended.wait(left)
        os.close(self._wake_r)
        os.close(self._wake_w)


def _encode(reply: dict) -> bytes:
    try:
        return json.dumps(reply, allow_nan=False).encode() + b"\n"
    except (ValueError, TypeError, RecursionError) as e:  # a handler returned NaN or a non-JSON value
        return json.dumps({"ok": False, "error": f"internal error: reply not JSON: {e}"}).encode() + b"\n"


def exchange(path: str, payload: bytes, timeout_s: float) -> bytes:
    """Send `payload` on a new connection to the socket at `path` and read the reply line
    (b"" when the server closed without one). OSError on failure."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(path)
        try:
            s.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the request was read ("busy", too large): the reply is still there to read
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def request(engine_pid: int, cmd: str, timeout_s: float = 3.0, **args: object) -> dict:
    """Send one request; ControlError with a user-facing reason on any failure."""
    path = socket_path(engine_pid)
    if not os.path.exists(path):
        raise ControlError(_why_unreachable(engine_pid))
    try:
        data = exchange(path, json.dumps({"cmd": cmd, **args}).encode() + b"\n", timeout_s)
    except (ConnectionRefusedError, FileNotFoundError):
        raise ControlError(f"engine {engine_pid}: its supervisor is gone (stale socket)") from None
    except OSError as e:
        raise ControlError(f"engine {engine_pid}: control socket error: {e}") from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise ControlError(f"engine {engine_pid}: bad reply from supervisor") from None
    if not reply.get("ok"):
        raise ControlError(f"engine {engine_pid}: {reply.get('error', 'request refused')}")
    return reply


def is_managed(engine_pid: int) -> bool:
    try:
        return os.path.exists(socket_path(engine_pid))
    except ControlError:
        return False


def _why_unreachable(pid: int) -> str:
    try:
        proc = psutil.Process(pid)
        uid = proc.uids().real
    except psutil.NoSuchProcess:
        return f"no process {pid}"
    except psutil.Error:
        return f"process {pid} cannot be inspected"
    if uid != os.getuid():
        return f"engine {pid} belongs to another user (uid {uid}); only its owner can manage it"
    if not _is_registry_peer(pid):
        return f"process {pid} is not a gpushare-tui engine (no registry slot, no control socket)"
    return f"engine {pid} is not managed by gpushare-tui (a foreign peer: read-only)"


def _is_registry_peer(pid: int) -> bool:
    """Whether `pid` holds a slot in any segment on this host (alive or not)."""
    from .clock import wall_us
    from .snapshot import SegmentReader

    reader = SegmentReader()
    try:
        gpus, _ = reader.read(wall_us())
    finally:
        reader.close()
    return any(p.pid == pid for g in gpus for p in g.peers)
