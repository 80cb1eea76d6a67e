"""A multi-process CPU engine for issue 19's tests and benchmarks: a parent that starts CPU-bound worker
processes (its children, in its process group), as vLLM's workers are. It knows nothing of gpushare.

    python -m testkit.engines.multiproc_engine [--workers 2] [--work-cpu-s S] [--idle-after-s S]

Each worker spins (testkit.engines.burn_units). With `--work-cpu-s S` each worker stops after S seconds
of its own CPU time (time it spent stopped does not count) and then sleeps, so a benchmark knows when
the last work happened; without it the workers spin until the engine exits.

stdout, one line each: `workers PID PID ...` at start; `idle WALL_S` (time.time()) once every worker
finished its work (with --work-cpu-s). Progress: read the workers' CPU time (/proc, psutil).
SIGTERM/SIGINT: the parent ends its workers and exits."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import time
from multiprocessing.connection import Connection

from testkit.engines import burn_cpu_s, burn_units, die_with_parent


def worker(parent_pid: int, work_cpu_s: float | None, finished: Connection) -> None:
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends us
    if work_cpu_s is None:
        while True:
            burn_units(10)
    burn_cpu_s(work_cpu_s)
    finished.send(True)
    while True:
        time.sleep(3600)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work-cpu-s", type=float, default=None, help="CPU seconds each worker works, then idles")
    a = ap.parse_args(argv)
    ctx = multiprocessing.get_context("spawn")
    # A pipe per worker, not ctx.Event(): an Event is five named semaphores in /dev/shm that only this
    # process's exit handlers or multiprocessing's resource tracker unlink, and a supervisor ending the
    # engine's process group by SIGKILL takes both with it (70 sem.mp-* files left by one test run).
    pipes = [ctx.Pipe(duplex=False) for _ in range(a.workers)]
    procs = [ctx.Process(target=worker, args=(os.getpid(), a.work_cpu_s, w), daemon=True) for _, w in pipes]

    def end(*_: object) -> None:
        for p in procs:
            if p.pid is not None and p.is_alive():
                p.kill()
        sys.exit(0)

    for sig in (signal.SIGTERM, signal.SIGINT):  # SIGINT too: a background job of a shell starts with it ignored
        signal.signal(sig, end)
    for p in procs:
        p.start()
    for _, w in pipes:
        w.close()  # each worker holds its own end: a worker that dies is an EOF here
    print("workers", *(p.pid for p in procs), flush=True)
    if a.work_cpu_s is not None:
        for r, _ in pipes:
            try:
                r.recv()
            except EOFError:
                end()  # a worker died before its work was done: so does the engine
        print("idle", f"{time.time():.3f}", flush=True)
    while all(p.is_alive() for p in procs):
        time.sleep(0.2)
    end()  # a worker died: so does the engine


if __name__ == "__main__":
    main()
