"""An Extension-1 engine for the interop tests: a GpuShare (batch, or interactive) running CPU steps
(the synthetic engine's work) busy for BUSY_S then idle for IDLE_S (idle() at each idle spell), for
DURATION_S; prints "ready" once joined, then at the end one JSON line: its slot, each step's end
and work time (time.monotonic, the same clock across processes) and each busy spell's start.

usage: python tests/ext1_worker.py KEY WEIGHT batch|interactive STEP_MS BUSY_S IDLE_S DURATION_S [START_MONO]
"""

from __future__ import annotations

import json
import sys
import time

from gpushare_tui.core.engines.synthetic import calibrate_units, work
from gpushare_tui.core.pacing.share import GpuShare


def main(argv: list[str]) -> None:
    key, weight, klass = argv[0], float(argv[1]), argv[2]
    step_ms, busy_s, idle_s, duration_s = (float(x) for x in argv[3:7])
    units = calibrate_units(step_ms)
    share = GpuShare(weight, f"{klass}-w{weight:g}", gpu_key=key, control=False).open()
    if klass == "interactive":
        share.membership.set_interactive(True)
    print("ready", flush=True)
    start = float(argv[7]) if len(argv) > 7 else time.monotonic()
    while time.monotonic() < start:
        time.sleep(0.001)
    ends: list[float] = []
    spells: list[float] = []
    durs: list[float] = []  # each step's work time (s)
    starts: list[float] = []  # each step's start
    try:
        while time.monotonic() < start + duration_s:
            spell = time.monotonic()
            spells.append(spell)
            with share.busy():  # DEMAND as the work arrives, before its first step (spec §7)
                while time.monotonic() < min(spell + busy_s, start + duration_s):
                    t0 = time.monotonic()
                    work(units)
                    t1 = time.monotonic()
                    durs.append(t1 - t0)
                    starts.append(t0)
                    share.pace()
                    ends.append(time.monotonic())
            if idle_s > 0:
                share.idle()
                time.sleep(max(0.0, min(idle_s, start + duration_s - time.monotonic())))
    finally:
        slot = share.slot
        share.close()
    print(json.dumps({"slot": slot, "ends": ends, "durs": durs, "starts": starts, "spells": spells}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
