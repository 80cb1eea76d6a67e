"""A multi-process job (stdlib only): `python tree_engine.py [--workers N]` starts N (default 2)
CPU-bound worker processes (children that spin for ever) and waits; it prints `workers PID PID...`
to stdout (its log). SIGTERM ends the workers and then itself."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def spin() -> None:
    x = 0
    while True:
        x += 1


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    pids = []
    for _ in range(a.workers):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            spin()
        pids.append(pid)

    def end(_signum: int, _frame: object) -> None:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        sys.exit(0)

    signal.signal(signal.SIGTERM, end)
    print("workers " + " ".join(map(str, pids)), flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
