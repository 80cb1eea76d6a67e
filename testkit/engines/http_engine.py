"""An HTTP engine for issue 19's tests and benchmarks (not llama-server): it knows nothing of gpushare.

    python -m testkit.engines.http_engine --port N [--host 127.0.0.1] [--load-s 1.0] [--work-units 20]
        [--workers 1] [--gauge engine_requests_running] [--exit-during-load CODE]

- `GET /health`: 503 for the first `--load-s` seconds ("loading"), then 200; TCP accepts from the start
  (as vLLM's server does), so a TCP health check is ready before an HTTP one.
- `POST /work` (optional query `?units=U`): does U units of CPU work (testkit.engines.burn_units) in a
  worker process (`--workers` started at launch: children of this process, each on a pipe), replies
  `{"units": U}` when done.
- `GET /metrics`: Prometheus text: the gauge `--gauge` (requests in flight) and the counters
  `engine_work_units_total`, `engine_requests_total`.
It prints `ready <port> workers <pid> ...` on stdout once it serves 200 (a health log line). SIGTERM/SIGINT:
exits. With `--exit-during-load CODE` it prints two lines of loading log (the last `error: out of memory
while loading the model`) and exits CODE without serving: a load that fails.
HttpLoad drives it from a test (back-to-back requests on threads, each completion's time kept)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from urllib.parse import parse_qs, urlparse

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from testkit.engines import JsonHandler, burn_units, die_with_parent

DEFAULT_GAUGE = "engine_requests_running"


def serve_work(parent_pid: int, conn: Connection) -> None:
    """A worker: for each number of units received, burn them and send the result back."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends us
    while True:
        conn.send(burn_units(conn.recv()))


class Engine:
    def __init__(self, *, load_s: float, work_units: int, workers: int, gauge: str) -> None:
        self.ready_at = time.monotonic() + load_s
        self.work_units = work_units
        self.pool_started = threading.Event()
        self.registry = CollectorRegistry()
        self.in_flight = Gauge(gauge, "Requests being worked on", registry=self.registry)
        self.units = Counter("engine_work_units", "Units of CPU work done", registry=self.registry)
        self.requests = Counter("engine_requests", "Requests completed", registry=self.registry)
        self.workers = workers

    def start_workers(self) -> None:
        # spawn: each worker is a fresh interpreter, a child of this process (in its process group). Pipes,
        # not a ProcessPoolExecutor: its queues are named semaphores in /dev/shm that only this process's
        # exit handlers or multiprocessing's resource tracker unlink, and a supervisor ending the engine's
        # process group by SIGKILL takes both with it.
        ctx = multiprocessing.get_context("spawn")
        self.processes: list[BaseProcess] = []
        self.idle: queue.SimpleQueue[Connection] = queue.SimpleQueue()
        conns = []
        for _ in range(self.workers):
            ours, theirs = ctx.Pipe()
            p = ctx.Process(target=serve_work, args=(os.getpid(), theirs), daemon=True)
            p.start()
            theirs.close()
            self.processes.append(p)
            conns.append(ours)
        for conn in conns:  # every worker up now, not at the first request
            conn.send(0)
            conn.recv()
            self.idle.put(conn)
        self.pool_started.set()

    def ready(self) -> bool:
        return self.pool_started.is_set() and time.monotonic() >= self.ready_at

    def work(self, units: int) -> None:
        with self.in_flight.track_inprogress():
            conn = self.idle.get()  # a free worker (requests beyond --workers wait here)
            try:
                conn.send(units)
                conn.recv()
            finally:
                self.idle.put(conn)
        self.units.inc(units)
        self.requests.inc()

    def worker_pids(self) -> list[int]:
        return sorted(p.pid for p in self.processes if p.pid is not None)


def make_handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def do_GET(self) -> None:
            path = urlparse(self.path).path
            if path == "/health":
                ok = engine.ready()
                self._reply(200 if ok else 503, b'{"status":"ok"}' if ok else b'{"status":"loading"}')
            elif path == "/metrics":
                self._reply(200, generate_latest(engine.registry), "text/plain; version=0.0.4")
            else:
                self._reply(404, b'{"error":"not found"}')

        def do_POST(self) -> None:
            url = urlparse(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            if url.path != "/work":
                self._reply(404, b'{"error":"not found"}')
                return
            if not engine.ready():
                self._reply(503, b'{"error":"loading"}')
                return
            units = int(parse_qs(url.query).get("units", [str(engine.work_units)])[0])
            engine.work(units)
            self._reply(200, json.dumps({"units": units}).encode())

    return Handler


class HttpLoad:
    """`concurrency` threads sending back-to-back `POST /work` to the engine at `port` until stop();
    `done` holds each completed request's time.monotonic()."""

    def __init__(self, port: int, *, units: int | None = None, concurrency: int = 1, host: str = "127.0.0.1") -> None:
        query = "" if units is None else f"?units={units}"
        self.url = f"http://{host}:{port}/work{query}"
        self.done: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(concurrency)]

    def start(self) -> HttpLoad:
        for t in self._threads:
            t.start()
        return self

    def stop(self, join_s: float = 30.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(join_s)

    def count_between(self, t0: float, t1: float) -> int:
        return sum(1 for t in list(self.done) if t0 <= t < t1)

    def _run(self) -> None:
        with httpx.Client(timeout=120) as c:
            while not self._stop.is_set():
                try:
                    ok = c.post(self.url).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    self.done.append(time.monotonic())
                else:
                    self.errors += 1
                    time.sleep(0.05)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--load-s", type=float, default=1.0, help="seconds /health answers 503 (loading)")
    ap.add_argument("--work-units", type=int, default=20, help="CPU work per request (~1 ms a unit)")
    ap.add_argument("--workers", type=int, default=1, help="worker processes doing the work")
    ap.add_argument("--gauge", default=DEFAULT_GAUGE, help="name of the in-flight gauge on /metrics")
    ap.add_argument("--exit-during-load", type=int, metavar="CODE", help="fail the load: log a little, exit CODE")
    a = ap.parse_args(argv)
    if a.exit_during_load is not None:
        print("loading weights", flush=True)
        time.sleep(min(a.load_s, 0.3))
        print("error: out of memory while loading the model", flush=True)
        sys.exit(a.exit_during_load)
    for sig in (signal.SIGTERM, signal.SIGINT):  # SIGINT too: a background job of a shell starts with it ignored
        signal.signal(sig, lambda *_: sys.exit(0))
    engine = Engine(load_s=a.load_s, work_units=a.work_units, workers=a.workers, gauge=a.gauge)
    server = ThreadingHTTPServer((a.host, a.port), make_handler(engine))  # serves 503 from now on
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    engine.start_workers()
    time.sleep(max(0.0, engine.ready_at - time.monotonic()))
    print("ready", a.port, "workers", *engine.worker_pids(), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        for pid in engine.worker_pids():  # the pool's shutdown would wait on requests in flight
            os.kill(pid, signal.SIGKILL)
        os._exit(0)


if __name__ == "__main__":
    main()
