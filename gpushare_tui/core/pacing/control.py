"""Per-engine control socket: one JSON request line, one JSON reply line.

Socket (core/pacing/sockets.py): `<runtime dir>/<engine pid>.sock`, mode 0600, in the 0700 per-user runtime
directory (core/host/paths.py); besides the modes, every connection's peer must be our euid or root
(SO_PEERCRED, `peer_allowed`): any other is closed with no reply, before it takes a worker.
A process that serves several engines' sockets under one pid (two
`GpuShare` in one Python process) names the others `<pid>.<n>.sock` (n = 1, 2, ...: the lowest
number this process does not hold); each is reachable and closes alone. A client finds them all
by the pid (`socket_paths`); with more than one it picks the engine by its gpu key and slot
(`Target`), as the `status` replies say, and without a target it is told which there are.
Requests: {"cmd": "status"} | {"cmd": "set_weight", "weight": W} | {"cmd": "set_class", "class": C}
| {"cmd": "stop"} (C: "interactive" or "batch", spec §7).
Replies: {"ok": true, ...} or {"ok": false, "error": "..."}; the fields of a `status`
reply are those of StatusReply (every one present, null when unknown).

Limits (a local client must not be able to hurt the engine): a request line
holds at most MAX_REQUEST_BYTES (without its newline) and must arrive within
READ_TIMEOUT_S of the connection being accepted; at most MAX_CONNECTIONS are
served at once, and any more get {"ok": false, "error": "busy: ..."} at once (before their
request is read: a client may retry any command after a busy reply, `request(busy_retry_s=...)`).
"""

from __future__ import annotations

import functools
import json
import math
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass, replace
from typing import Protocol, get_args, get_origin, get_type_hints, runtime_checkable

from ..host import budgets
from ..host.errors import ControlError, GpushareError, UsageError
from ..host.paths import rename_in, runtime_dir, unlink_in
from ..observe.latency import LatencyReport
from ..registry import abi
from ..registry.abi import parse_weight
from ..registry.ownership import Owner
from .edges import EdgeReport
from .governor import SloReport
from .sockets import socket_index, socket_path, socket_paths

MAX_REQUEST_BYTES = 4096
READ_TIMEOUT_S = budgets.CONTROL_REQUEST_READ_S
MAX_CONNECTIONS = 16
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
    kind: str | None = None  # "llama-server" | "vllm" | "sglang" | "tgi" | "command" | "python" | "synth"
    activity: str | None = None  # a supervised engine's activity source (llama, metrics, cpu, gpu, always)
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
    edges: EdgeReport | None = None  # the windows of the last minute: what the engine ran of each (pacing/edges.py)
    # set when `gpushare-tui up` owns the engine (core/registry/ownership.py)
    owner: str | None = None  # "up"
    owner_pid: int | None = None
    config: str | None = None  # the file that declares it
    config_weight: float | None = None  # its weight there (the live weight may differ: a dashboard edit)
    restarts: int | None = None
    klass: str | None = None  # the latency class, "interactive" | "batch" (JSON key `class`, spec §7)
    # latency as clients see it, where a front proxy sees the engine's requests (core/observe/latency.py)
    latency: LatencyReport | None = None
    slo: SloReport | None = None  # its latency target and the governor's view of it (core/pacing/governor.py)
    # how often this member, kept waiting by PRIORITY, judged the holders over their budget (spec §7, HoldOffCheck)
    held_off_trips: int | None = None

    def to_json(self) -> dict:
        """Every field, in order (`klass` as `class`); None as null."""
        return {_JSON_KEYS.get(k, k): v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: object) -> StatusReply:
        """A reply as an engine sent it (any JSON value): a field that is missing or of the wrong
        type is None (a string stays the string it was, unsanitised; a number must be finite; a list
        holds at most STATUS_REPLY_LIST_MAX_ITEMS items, each of its type); other keys ("ok", unknown
        ones) are ignored. Never raises."""
        data = data if isinstance(data, dict) else {}
        return cls(**_typed_fields(cls, {name: data.get(key) for name, key in _JSON_KEYS.items()} | _unkeyed(data)))


_JSON_KEYS = {"klass": "class"}  # StatusReply fields whose JSON key differs (a Python keyword)


def _unkeyed(data: dict) -> dict:
    """`data` without the keys that name a field by its Python name where the JSON key differs."""
    return {k: v for k, v in data.items() if k not in _JSON_KEYS}


def _typed_fields(cls: type, data: dict) -> dict:
    """The fields of dataclass `cls` (each `T | None`) from `data`, each None unless it is a T."""
    return {name: _typed(data.get(name), kind) for name, kind in _field_kinds(cls).items()}


@functools.cache
def _field_kinds(cls: type) -> dict[str, type]:
    return {name: next(t for t in get_args(hint) if t is not type(None)) for name, hint in get_type_hints(cls).items()}


def _typed(value: object, kind: type) -> object:
    """`value` if it is a `kind` (an int is a float too, a bool is neither, a float must be finite; a
    `tuple[T, ...]` is a list of at most STATUS_REPLY_LIST_MAX_ITEMS Ts), else None."""
    if is_dataclass(kind):
        return kind(**_typed_fields(kind, value)) if isinstance(value, dict) else None
    if get_origin(kind) is tuple:
        if not isinstance(value, list) or len(value) > budgets.STATUS_REPLY_LIST_MAX_ITEMS:
            return None
        item = get_args(kind)[0]
        items = tuple(_typed(v, item) for v in value)
        return None if any(i is None for i in items) else items
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


_claims_lock = threading.Lock()
_claimed: set[tuple[int, int]] = set()  # (pid, index) of the sockets this process serves


def _claim_index(engine_pid: int) -> int:
    """The lowest index no server of this process holds for `engine_pid`, now held."""
    with _claims_lock:
        index = 0
        while (engine_pid, index) in _claimed:
            index += 1
        _claimed.add((engine_pid, index))
        return index


def _release_index(engine_pid: int, index: int) -> None:
    with _claims_lock:
        _claimed.discard((engine_pid, index))


Handler = Callable[[dict], dict]


@runtime_checkable
class ManagedEngine(Protocol):
    """What a control socket serves: a supervised llama-server (core/engines/supervisor.py), a Python
    engine (core/pacing/share.py's GpuShare) or a synthetic one (core/engines/synthetic.py)."""

    klass: str  # its latency class, "interactive" | "batch" (the status reply's `class`)

    def status(self) -> StatusReply:
        """The `status` reply, without the owner's fields (control_handlers adds them)."""
        ...

    def set_weight(self, weight: float) -> float:
        """Publish a valid weight (finite, > 0); the stored value."""
        ...

    def stop(self) -> str:
        """Ask the engine to end (thread-safe, returns at once); the state the reply reports."""
        ...

    def set_class(self, klass: str) -> str:
        """Publish a valid latency class ("interactive" | "batch", INTERACTIVE of spec §7); the class now."""
        ...


def control_handlers(engine: ManagedEngine, owner: Owner | None = None) -> dict[str, Handler]:
    """The control socket's handlers for `engine`; with `owner` (`up` owns the engine) its status
    fields are in every `status` reply and its hooks wrap `stop` and `set_weight` (Owner.wrap)."""

    def status(_req: dict) -> dict:
        reply = engine.status()
        reply = reply if reply.klass is not None else replace(reply, klass=engine.klass)
        return (replace(reply, **owner.status_fields()) if owner else reply).to_json()

    def set_weight(req: dict) -> dict:
        return {"weight": engine.set_weight(parse_weight(req.get("weight")))}

    def stop(_req: dict) -> dict:
        return {"state": engine.stop()}

    def set_class(req: dict) -> dict:
        return {"class": engine.set_class(abi.validate_class(req.get("class"), label="class"))}

    handlers = {"status": status, "set_weight": set_weight, "stop": stop, "set_class": set_class}
    return owner.wrap(handlers) if owner else handlers


_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end of a connected Unix socket (SO_PEERCRED), or None."""
    try:
        _, uid, _ = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except (OSError, struct.error):
        return None
    return uid if uid >= 0 else None  # -1: no credentials (not a connected Unix socket)


def peer_allowed(conn: socket.socket) -> bool:
    """Whether a control connection may be served: its peer is our euid or root (SO_PEERCRED), checked
    besides the modes (socket 0600 in a 0700 directory), so a mode loosened by mistake lets no one in."""
    uid = peer_uid(conn)
    return uid is not None and uid in (os.geteuid(), 0)


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
        self.engine_pid = engine_pid
        self.index = _claim_index(engine_pid)  # a second server for this pid gets its own socket
        try:
            self.path = socket_path(engine_pid, self.index)
            self._start(handlers, max_connections, read_timeout_s)
        except BaseException:
            _release_index(engine_pid, self.index)
            raise

    def _start(self, handlers: dict[str, Handler], max_connections: int, read_timeout_s: float) -> None:
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
        """The listening socket, its name made only once it listens: bound under a name of the same length
        that no client looks for (`.part` for `.sock`), then renamed into place. A client that finds the name
        is never refused (bind makes the name, listen comes after: a connect between the two is refused)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        part = self.path[: -len(".sock")] + ".part"
        bound = False
        try:
            # stale: no server of this process holds the name (_claim_index), and no other live
            # process serves our engine's pid (a dead one of the same pid left it)
            unlink_in(self.path)
            unlink_in(part)
            old = os.umask(0o177)
            try:
                sock.bind(part)
                bound = True
            finally:
                os.umask(old)
            os.chmod(part, 0o600)
            sock.listen(LISTEN_BACKLOG)
            sock.setblocking(False)
            rename_in(part, os.path.basename(self.path))
        except BaseException as e:
            sock.close()
            if bound:
                unlink_in(part)
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
            if not peer_allowed(conn):  # another uid (the modes were loosened): closed, no reply, no worker
                conn.close()
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
        _release_index(self.engine_pid, self.index)  # after the unlink: a new server may bind the name now


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


@dataclass(frozen=True)
class Target:
    """Which of a pid's engines a request is for, when it serves several sockets: the one whose
    `status` reports this slot (and gpu key, when given)."""

    slot: int | None = None
    gpu_key: str | None = None

    def __str__(self) -> str:
        return f"slot {self.slot}" + (f" of {self.gpu_key}" if self.gpu_key is not None else "")


def request(
    engine_pid: int,
    cmd: str,
    timeout_s: float = 3.0,
    *,
    target: Target | None = None,
    busy_retry_s: float = 0.0,
    **args: object,
) -> dict:
    """Send one request; ControlError with a user-facing reason on any failure. With several
    sockets for the pid, `target` picks the engine. A "busy" reply (sent before the request is
    read, so no command ran) is retried for up to `busy_retry_s`, with a growing pause."""
    deadline = time.monotonic() + busy_retry_s
    path = _socket_for(engine_pid, target, timeout_s, deadline)
    return _ask(engine_pid, path, json.dumps({"cmd": cmd, **args}).encode() + b"\n", timeout_s, deadline)


def _ask(engine_pid: int, path: str, payload: bytes, timeout_s: float, busy_deadline: float) -> dict:
    pause_s = budgets.CONTROL_BUSY_BACKOFF_FIRST_S
    tried_s = time.monotonic()
    while True:
        reply = _exchange_reply(engine_pid, path, payload, timeout_s)
        error = reply.get("error")
        if reply.get("ok") or not (isinstance(error, str) and error.startswith("busy:")):
            break
        left = busy_deadline - time.monotonic()
        if left <= 0:
            if busy_deadline > tried_s:  # it was retried: say for how long
                raise ControlError(f"engine {engine_pid}: {error} (still busy after {busy_deadline - tried_s:.1f} s)")
            break
        time.sleep(min(pause_s, left))
        pause_s = min(pause_s * 2, budgets.CONTROL_BUSY_BACKOFF_MAX_S)
    if not reply.get("ok"):
        raise ControlError(f"engine {engine_pid}: {reply.get('error', 'request refused')}")
    return reply


def _exchange_reply(engine_pid: int, path: str, payload: bytes, timeout_s: float) -> dict:
    """The reply object on `path`; ControlError if there is none."""
    try:
        data = exchange(path, payload, timeout_s)
    except (ConnectionRefusedError, FileNotFoundError):
        raise ControlError(f"engine {engine_pid}: its supervisor is gone (stale socket)") from None
    except OSError as e:
        raise ControlError(f"engine {engine_pid}: control socket error: {e}") from None
    try:
        reply = json.loads(data)
    except (ValueError, RecursionError):
        raise ControlError(f"engine {engine_pid}: bad reply from supervisor") from None
    if not isinstance(reply, dict):
        raise ControlError(f"engine {engine_pid}: bad reply from supervisor")
    return reply


def _socket_for(engine_pid: int, target: Target | None, timeout_s: float, busy_deadline: float) -> str:
    """The socket of `engine_pid` a request goes to: its only one, else the one `target` names."""
    socket_path(engine_pid)  # an unusable runtime directory, or one too long for a socket: its one line
    paths = socket_index().get(engine_pid, [])
    if not paths:
        raise ControlError(_why_unreachable(engine_pid))
    if len(paths) == 1:
        return paths[0]
    found: list[tuple[str, StatusReply | None]] = []
    for path in paths:
        try:
            reply = _ask(engine_pid, path, b'{"cmd": "status"}\n', timeout_s, busy_deadline)
            found.append((path, StatusReply.from_json(reply)))
        except ControlError:
            found.append((path, None))
    if target is not None and (target.slot is not None or target.gpu_key is not None):
        hits = [
            path
            for path, r in found
            if r is not None
            and (target.slot is None or r.slot == target.slot)
            and (target.gpu_key is None or r.gpu_key == target.gpu_key)
        ]
        if len(hits) == 1:
            return hits[0]
        if not hits:
            listed = _listed(found)
            raise ControlError(f"engine {engine_pid}: none of its {len(paths)} engines is on {target} ({listed})")
        raise ControlError(f"engine {engine_pid}: {len(hits)} of its engines are on {target}; name the --gpu-key too")
    raise ControlError(
        f"engine {engine_pid} serves {len(paths)} engines ({_listed(found)}): name one with --slot (and --gpu-key)"
    )


def _listed(found: list[tuple[str, StatusReply | None]]) -> str:
    return ", ".join(
        f"slot {r.slot} of {r.gpu_key}" if r is not None else f"{os.path.basename(path)} not answering"
        for path, r in found
    )


NAME_STATUS_TIMEOUT_S = 1.0  # each managed engine's `status` while a name is looked up


class AmbiguousEngineError(UsageError, ControlError):
    """A name several managed engines answer to: the command line must say which (exit 2)."""


@dataclass(frozen=True)
class EngineRef:
    """An engine a command addresses: its pid (the socket's name) and, when that pid serves several
    engines, the Target that picks one (None: its only one, or let `request` say there are several)."""

    pid: int
    target: Target | None = None


def resolve_engine(text: str, target: Target | None = None, *, timeout_s: float = NAME_STATUS_TIMEOUT_S) -> EngineRef:
    """The engine `text` names: a pid when it is all digits (with `target` as given), else the one
    managed engine (a control socket in our runtime directory that answers `status`) whose name is
    exactly `text` (and which matches `target`'s slot/gpu key, when given) or, when none is, whose name
    as a view shows it is `text` (a name with format or control characters: escaped, `ab\\u202ecd`, or
    with U+FFFD, `ab\ufffdcd`). ControlError (exit 1) when none is, listing the managed engines as
    name=pid (escaped); AmbiguousEngineError (exit 2) when several are, listing them."""
    if text.isascii() and text.isdigit():
        return EngineRef(int(text), target)
    from ..host.text import printable

    runtime_dir()  # an unusable runtime directory: its own one line, not "no engine named ..."
    engines = managed_engines(timeout_s)
    wanted = target or Target()
    targeted = [
        e
        for e in engines
        if (wanted.slot is None or e.status.slot == wanted.slot)
        and (wanted.gpu_key is None or e.status.gpu_key == wanted.gpu_key)
    ]
    hits = [e for e in targeted if e.status.name == text]
    if not hits:  # a name with characters no view shows, as a view shows it (escaped, or with U+FFFD)
        hits = [e for e in targeted if e.status.name and text in _shown_forms(e.status.name)]
    shown = printable(text)
    if len(hits) == 1:
        return hits[0].ref if hits[0].ref.target is not None else EngineRef(hits[0].ref.pid, target)
    if hits:
        raise AmbiguousEngineError(
            f"{len(hits)} managed engines are named {shown!r} ({_named(hits)}): give the pid instead"
        )
    listed = _named(engines) if engines else "none is running"
    raise ControlError(f"no managed engine named {shown!r} (managed: {listed})")


def _shown_forms(name: str) -> tuple[str, ...]:
    """How the views show a name that holds characters they never print: escaped (the name lists below,
    `--once --json`) and with U+FFFD (the tables, `status`); () for a name shown as it is."""
    from ..host.text import escaped, printable

    return () if name.isprintable() else (escaped(name), printable(name))


@dataclass(frozen=True)
class ManagedEntry:
    """One engine behind a control socket of ours, as its `status` reply describes it."""

    ref: EngineRef
    status: StatusReply


def managed_engines(timeout_s: float = NAME_STATUS_TIMEOUT_S) -> list[ManagedEntry]:
    """Every engine whose control socket is in our runtime directory and answers `status` within
    `timeout_s` (one that does not, a stale socket, is left out), by pid then socket index. [] when
    the directory cannot be read. At most budgets.CONTROL_NAME_LOOKUP_MAX sockets are asked."""
    try:
        index = socket_index()
    except ControlError:
        return []
    found: list[ManagedEntry] = []
    asked = 0
    for pid in sorted(index):
        for path in index[pid]:
            if asked >= budgets.CONTROL_NAME_LOOKUP_MAX:
                return found
            asked += 1
            try:
                reply = _ask(pid, path, b'{"cmd": "status"}\n', timeout_s, 0.0)
            except ControlError:
                continue
            status = StatusReply.from_json(reply)
            several = len(index[pid]) > 1
            found.append(ManagedEntry(EngineRef(pid, Target(status.slot, status.gpu_key) if several else None), status))
    return found


NAMED_SHOWN_MAX = 20  # engines listed in one error line; the rest are counted


def _named(entries: list[ManagedEntry]) -> str:
    """`chat=123, batch=456` (a name escaped: safe to show, and what `resolve_engine` takes back; `?` for an
    engine that reports none), at most NAMED_SHOWN_MAX of them, then `and N more`."""
    from ..host.text import escaped

    shown = [f"{escaped(e.status.name) if e.status.name else '?'}={e.ref.pid}" for e in entries[:NAMED_SHOWN_MAX]]
    more = len(entries) - NAMED_SHOWN_MAX
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def is_managed(engine_pid: int) -> bool:
    """Whether `engine_pid` has a control socket."""
    return bool(socket_paths(engine_pid))


def _why_unreachable(pid: int) -> str:
    import psutil  # not on the --once path: only when an engine cannot be reached

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
    from ..host.clock import wall_us
    from ..observe.snapshot import SegmentReader

    reader = SegmentReader()
    try:
        gpus, _ = reader.read(wall_us())
    finally:
        reader.close()
    return any(p.pid == pid for g in gpus for p in g.peers)


def reported_log(pid: int, status: dict) -> str:
    """The log file named in engine `pid`'s `status` reply; GpushareError if it names none
    (a synthetic engine whose output goes to a terminal or a pipe)."""
    log = StatusReply.from_json(status).log
    if not log:
        raise GpushareError(f"engine {pid} reports no log file (its output goes to a terminal or a pipe)")
    return log
