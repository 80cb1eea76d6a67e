"""Per-engine control socket: one JSON request line, one JSON reply line.

Socket: `<runtime dir>/<engine pid>.sock`, mode 0600, in a 0700 per-user
directory (`$XDG_RUNTIME_DIR/gpushare-tui`, else `/tmp/gpushare-tui-<uid>`).
Requests: {"cmd": "status"} | {"cmd": "set_weight", "weight": W} | {"cmd": "stop"}.
Replies: {"ok": true, ...} or {"ok": false, "error": "..."}.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
from collections.abc import Callable

import psutil

MAX_REQUEST_BYTES = 4096


class ControlError(RuntimeError):
    pass


def runtime_dir() -> str:
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = os.path.join(base, "gpushare-tui") if base else f"/tmp/gpushare-tui-{os.getuid()}"
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ControlError(f"runtime directory {path} is not private to this user")
    return path


def state_dir() -> str:
    """Per-user state directory for supervisor logs."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    path = os.path.join(base, "gpushare-tui")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def socket_path(engine_pid: int) -> str:
    return os.path.join(runtime_dir(), f"{engine_pid}.sock")


Handler = Callable[[dict], dict]


class ControlServer:
    """Serves `handlers[cmd](request) -> reply fields` on a thread."""

    def __init__(self, engine_pid: int, handlers: dict[str, Handler]) -> None:
        self.path = socket_path(engine_pid)
        self._handlers = handlers
        outer = self

        class _Req(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline(MAX_REQUEST_BYTES)
                reply = outer.dispatch(line)
                self.wfile.write(json.dumps(reply, allow_nan=False).encode() + b"\n")

        if os.path.exists(self.path):
            os.unlink(self.path)  # a stale socket of a dead supervisor of the same pid
        old = os.umask(0o177)
        try:
            self._server = socketserver.ThreadingUnixStreamServer(self.path, _Req)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="gpushare-control", daemon=True)
        self._thread.start()

    def dispatch(self, line: bytes) -> dict:
        try:
            req = json.loads(line)
            cmd = req["cmd"]
        except (ValueError, KeyError, TypeError):
            return {"ok": False, "error": "bad request: expected one JSON object with a 'cmd'"}
        handler = self._handlers.get(cmd)
        if handler is None:
            return {"ok": False, "error": f"unknown command {cmd!r}"}
        try:
            return {"ok": True, **handler(req)}
        except (ValueError, ControlError) as e:
            return {"ok": False, "error": str(e)}
        except Exception as e:  # a handler bug must not drop the connection silently
            return {"ok": False, "error": f"internal error: {type(e).__name__}: {e}"}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def request(engine_pid: int, cmd: str, timeout_s: float = 3.0, **args: object) -> dict:
    """Send one request; ControlError with a user-facing reason on any failure."""
    path = socket_path(engine_pid)
    if not os.path.exists(path):
        raise ControlError(_why_unreachable(engine_pid))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(path)
            s.sendall(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
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
    return f"engine {pid} is not managed by gpushare-tui (a foreign peer: read-only)"
