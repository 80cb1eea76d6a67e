"""An engine of ours whose control socket answers `status` with hostile latency and SLO objects (as a process of
the same user, gone wrong or malicious, may): a histogram whose counts fall, one with 10,000 bounds, NaN-free
but absurd numbers, terminal escapes and a megabyte in its text fields. It joins KEY (a real slot) so the views
ask it, prints "ready" and serves until stdin closes.

usage: python hostile_latency_engine.py KEY
"""

from __future__ import annotations

import os
import sys

from gpushare_tui.core.pacing.control import ControlServer
from gpushare_tui.core.registry.membership import Membership

ESC = "\x1b[2J\x1b]0;pwned\x07"
REPLY = {
    "state": "running",
    "kind": "vllm",
    "name": "hostile",
    "latency": {
        "window_s": 60,
        "requests": 10**30,  # an int beyond any counter: still a number
        "req_s": 1e308,
        "ttft_p50_ms": -5,
        "ttft_p99_ms": 1e300,
        "itl_p99_ms": "fast",
        "in_flight": -3,
        "status_2xx_total": 7,
        "status_5xx_total": True,  # a bool is no count
        "ttft_hist": {"le": [0.1, 0.2], "counts": [5, 3, 9], "sum_s": 1.0},  # counts fall: no histogram
        "itl_hist": {"le": list(range(10_000)), "counts": list(range(10_001)), "sum_s": 1.0},  # too long
        "e2e_hist": {"le": [1.0, 2.0], "counts": [1, 2, 3], "sum_s": 4.5},  # well formed: exported
    },
    "slo": {
        "ttft_p99_ms": 300,
        "state": "unreachable" + ESC,
        "reason": ESC + "x" * 2**20,
        "classes": ["batch"],
        "ttft_attained_pct": 250.0,
    },
}


def main() -> None:
    key = sys.argv[1]
    m = Membership(key, 1.0, "hostile", log=lambda _m: None)
    m.join()
    server = ControlServer(os.getpid(), {"status": lambda _req: dict(REPLY)})
    print("ready", flush=True)
    try:
        sys.stdin.read()
    finally:
        server.close()
        m.leave()


if __name__ == "__main__":
    main()
