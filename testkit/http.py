"""HTTP peers for tests and benchmarks: a loopback server answering every GET with one body (an engine's
/metrics); hostile ones: a slowloris client, and a loopback host that answers whatever it is told to (a
reply dripped a byte at a time, a huge one, JSON nested 10^5 deep)."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class BodyServer:
    """A loopback HTTP server answering every GET with `self.body` (200; set by the test), keeping each
    request's time.monotonic() in `hits`; `url` is its /metrics."""

    def __init__(self, body: bytes = b"") -> None:
        self.body = body
        self.hits: list[float] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                owner.hits.append(time.monotonic())
                self.send_response(200)
                self.send_header("Content-Length", str(len(owner.body)))
                self.end_headers()
                self.wfile.write(owner.body)

            def log_message(self, *_args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _addr(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def slowloris(url: str, n: int, stop: threading.Event) -> list[threading.Thread]:
    """`n` sockets, each sending one byte of a request and reconnecting as soon as the server drops it,
    until `stop` is set (join the threads after)."""

    def one() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(_addr(url), timeout=0.2) as s:
                    s.sendall(b"G")
                    while not stop.is_set():
                        try:
                            if s.recv(4096) == b"":
                                break  # dropped: reconnect
                        except TimeoutError:
                            continue
            except OSError:
                time.sleep(0.01)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def http_reply(body: bytes, status: str = "200 OK", ctype: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


DRIP_HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Pad: " + b"a" * 100_000


class HostileHost:
    """A loopback 'serve' at `url` that reads a request and sends `raw` (a whole HTTP response, bytes),
    at once or, with `drip_s`, one byte every `drip_s` (the default `raw`: a status line and headers
    that never end). Every connection is served on a thread; `close()` ends them."""

    def __init__(self, raw: bytes = DRIP_HEADERS, drip_s: float | None = None) -> None:
        self.raw = raw
        self.drip_s = drip_s
        self.requests = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.requests += 1
            threading.Thread(target=self._answer, args=(c,), daemon=True).start()

    def _answer(self, c: socket.socket) -> None:
        with c:
            try:
                c.settimeout(5)
                c.recv(65536)  # the request (one packet from httpx)
                if self.drip_s is None:
                    c.sendall(self.raw)
                    return
                for i in range(len(self.raw)):
                    if self._stop.wait(self.drip_s):
                        return
                    c.sendall(self.raw[i : i + 1])
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self.sock.close()

    def __enter__(self) -> HostileHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
