"""The HTTP server of `serve`: GET /metrics, /gpu/peers[?gpu_key=K], /healthz. Read-only.

Bounded against hostile clients: at most MAX_CONNECTIONS requests are served at once (more get
503 at once and are closed); one request per connection; each connection is shut down
REQUEST_DEADLINE_S after it was accepted whatever it is doing (slow senders, slow readers), and
every read waits at most READ_TIMEOUT_S. Bad requests get a JSON error; nothing prints a traceback.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlsplit

from ..core.errors import GpushareError
from .exporter import Exporter
from .exposition import CONTENT_TYPE, render_metrics
from .peers import peers_reply

MAX_CONNECTIONS = 16
READ_TIMEOUT_S = 2.0
REQUEST_DEADLINE_S = 5.0
REAP_EVERY_S = 0.25
MAX_QUERY_CHARS = 1024
_BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 18\r\n\r\n"
_BUSY += b'{"error": "busy"}\n'


class Handler(BaseHTTPRequestHandler):
    server: ExporterServer
    protocol_version = "HTTP/1.0"  # one request per connection: no idle keep-alive connections to hold
    default_request_version = "HTTP/1.0"  # an unparseable request line still gets a status line and headers
    timeout = READ_TIMEOUT_S
    server_version = "gpushare-tui"

    def version_string(self) -> str:
        return self.server_version

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._route(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._route(head=True)

    def _route(self, head: bool) -> None:
        url = urlsplit(self.path)
        if len(url.query) > MAX_QUERY_CHARS:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": "query too long"}, head)
        try:
            if url.path == "/metrics":
                body = render_metrics(self.server.exporter.model)
                return self._send(HTTPStatus.OK, CONTENT_TYPE, body, head)
            if url.path == "/gpu/peers":
                keys = parse_qs(url.query).get("gpu_key")
                status, doc = peers_reply(keys, self.server.exporter.model, socket.gethostname())
                return self._json(status, doc, head)
            if url.path == "/healthz":
                return self._send(HTTPStatus.OK, "text/plain; charset=utf-8", b"ok\n", head)
            if url.path == "/":
                index = b"gpushare-tui serve: /metrics /gpu/peers[?gpu_key=K] /healthz\n"
                return self._send(HTTPStatus.OK, "text/plain; charset=utf-8", index, head)
        except (GpushareError, OSError, ValueError) as e:
            return self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"cannot read the segments: {e}"}, head)
        self._json(HTTPStatus.NOT_FOUND, {"error": f"not found: {url.path[:200]}"}, head)

    def _json(self, status: HTTPStatus, doc: dict, head: bool) -> None:
        body = (json.dumps(doc, allow_nan=False) + "\n").encode()
        self._send(status, "application/json", body, head)

    def _send(self, status: HTTPStatus, ctype: str, body: bytes, head: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's errors (bad request line, unsupported method, oversized headers) as JSON."""
        self.close_connection = True
        try:
            reason = HTTPStatus(code).phrase
        except ValueError:
            reason = ""
        body = (json.dumps({"error": message or reason}) + "\n").encode()
        self.send_response(code, message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD" and code >= 200 and code not in (204, 304):
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # no access log: a scrape a second would fill the journal


class ExporterServer(HTTPServer):
    """An HTTPServer whose request threads are bounded (MAX_CONNECTIONS) and reaped (REQUEST_DEADLINE_S)."""

    request_queue_size = 64
    server_address: tuple[str, int] | tuple[str, int, int, int]  # as bound: getsockname() of an AF_INET(6) socket
    allow_reuse_address = True  # a restart right after a stop: TIME_WAIT must not hold the port

    def __init__(
        self,
        address: tuple[str, int],
        exporter: Exporter,
        *,
        max_connections: int = MAX_CONNECTIONS,
        deadline_s: float = REQUEST_DEADLINE_S,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.exporter = exporter
        self.deadline_s = deadline_s
        self._slots = threading.BoundedSemaphore(max_connections)
        self._live: dict[socket.socket, float] = {}
        self._live_lock = threading.Lock()
        self._closed = threading.Event()
        super().__init__(address, Handler)
        threading.Thread(target=self._reap, name="serve-reaper", daemon=True).start()

    # A TCPServer's request is a socket; typeshed types BaseServer's, a UDP (bytes, socket) pair included.
    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        with self._live_lock:
            self._live[request] = time.monotonic() + self.deadline_s
        threading.Thread(target=self._serve_one, args=(request, client_address), daemon=True).start()

    def _serve_one(self, request: socket.socket, client_address: object) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            pass  # a client that went away or was reaped: nothing to report, nothing to print
        finally:
            with self._live_lock:
                self._live.pop(request, None)
            self.shutdown_request(request)
            self._slots.release()

    def _refuse(self, request: socket.socket) -> None:
        try:
            request.settimeout(0.2)
            request.sendall(_BUSY)
        except OSError:
            pass
        self.shutdown_request(request)

    def _reap(self) -> None:
        while not self._closed.wait(REAP_EVERY_S):
            now = time.monotonic()
            with self._live_lock:
                overdue = [s for s, deadline in self._live.items() if deadline <= now]
            for s in overdue:
                try:
                    s.shutdown(socket.SHUT_RDWR)  # wakes the handler's blocked read or write
                except OSError:
                    pass

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # see _serve_one

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in str(host) else f"http://{host}:{port}"
