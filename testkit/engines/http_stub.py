"""A small inference-server stand-in (stdlib only): `python http_engine.py --port N [--load-s S]
[--work N] [--exit-during-load CODE]`.

- It "loads" for S seconds (default 0.5): GET /health answers 503, then 200 (TCP accepts from the
  start, as vLLM's does); once loaded it prints `engine ready on port N` to stdout (its log).
- GET /work does real CPU work in a worker process (a child: the engine is a process tree) of
  N loop iterations (default 200,000) and answers `done`.
- GET /metrics is Prometheus text with the gauge `engine_requests_in_flight` (requests in progress)
  and the counter `engine_requests_total` (requests done).
- With --exit-during-load CODE it prints a few lines while loading and exits CODE.
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.pool
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def burn(n: int) -> int:
    x = 0
    for i in range(n):
        x ^= i * i
    return x


class State:
    def __init__(self, load_s: float, work: int) -> None:
        self.ready_at = time.monotonic() + load_s
        self.work = work
        self.lock = threading.Lock()
        self.in_flight = 0
        self.done = 0
        self.pool: multiprocessing.pool.Pool | None = None


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            loaded = time.monotonic() >= state.ready_at and state.pool is not None
            if self.path == "/health":
                self._reply(200 if loaded else 503, b"ok" if loaded else b"loading")
            elif self.path == "/metrics":
                body = (
                    "# TYPE engine_requests_in_flight gauge\n"
                    f'engine_requests_in_flight{{model="m"}} {state.in_flight}\n'
                    "# TYPE engine_requests_total counter\n"
                    f"engine_requests_total {state.done}\n"
                )
                self._reply(200, body.encode())
            elif self.path == "/work" and loaded:
                assert state.pool is not None
                with state.lock:
                    state.in_flight += 1
                try:
                    state.pool.apply(burn, (state.work,))
                finally:
                    with state.lock:
                        state.in_flight -= 1
                        state.done += 1
                self._reply(200, b"done")
            else:
                self._reply(503 if self.path == "/work" else 404, b"no")

        def log_message(self, *_args: object) -> None:
            pass

    return Handler


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--load-s", type=float, default=0.5)
    p.add_argument("--work", type=int, default=200_000)
    p.add_argument("--exit-during-load", type=int, default=None)
    a = p.parse_args()
    if a.exit_during_load is not None:
        print("loading weights", flush=True)
        time.sleep(min(a.load_s, 0.3))
        print("error: out of memory while loading the model", flush=True)
        return a.exit_during_load
    state = State(a.load_s, a.work)
    server = ThreadingHTTPServer((a.host, a.port), make_handler(state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.pool = multiprocessing.get_context("fork").Pool(1)  # the worker: a child process
    time.sleep(max(0.0, state.ready_at - time.monotonic()))
    print(f"engine ready on port {a.port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
