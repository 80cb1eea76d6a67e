"""A joined engine's achieved share beside a group member that re-weights its slot every
millisecond to keep that engine's window just behind "now" (issue 17, "Floor broken over time").

    python -m bench.hostile_reweight [--rounds 3] [--seconds 5]

For each round: the in-process pacer (`GpuShare.pace()`, 2 ms CPU steps: the fraction of wall time
not slept) and the supervisor (SIGSTOP/SIGCONT around a spinning child: the fraction of wall time
it was continued, and its CPU time over the same child's unpaced). The floor of two members is
10 %; the target is >= 70 % of it. Prints a table and writes bench/results/hostile_reweight.json.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from gpushare_tui.core.schedule import v1 as schedule
from testkit.reweight import pacer_share, supervisor_share
from testkit.shm import remove, shm_file, unique_key

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
TARGET_OF_FLOOR = 0.70


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0, help="measured span of each case")
    ap.add_argument("--json", default=str(RESULTS / "hostile_reweight.json"), help="where to write the result")
    a = ap.parse_args()
    floor = schedule.floor_share(2)
    rows = []
    print(f"floor {100 * floor:.1f} % of solo (2 members); target >= {100 * TARGET_OF_FLOOR * floor:.1f} %")
    print(f"{'round':>5} {'pacer %':>8} {'supervisor continued %':>23} {'supervisor cpu/solo %':>22}  load")
    for r in range(a.rounds):
        key = unique_key("reweigh")
        try:
            p = pacer_share(key, a.seconds)
        finally:
            remove(shm_file(key))
        key = unique_key("reweigh")
        try:
            cont, cpu = supervisor_share(key, a.seconds)
        finally:
            remove(shm_file(key))
        load = os.getloadavg()[0]
        rows.append(
            {"round": r, "pacer_share": p, "supervisor_continued": cont, "supervisor_cpu_of_solo": cpu, "load_1m": load}
        )
        print(f"{r:>5} {100 * p:>8.2f} {100 * cont:>23.2f} {100 * cpu:>22.2f}  {load:.2f}")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps({"floor": floor, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
