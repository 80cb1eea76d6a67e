"""A second, independent implementation of the Extension-1 schedule (spec registry-abi.md §4, §5, §7),
written from the spec text with the standard library only (it shares no code with gpushare_tui), and
the generator of tests/data/ext1-vectors.json:

    python tests/ext1_reference.py          # rewrite the vectors file from the cases below
    python tests/ext1_reference.py --check  # exit 1 if the file differs from what this computes

Slots are dicts {pid, weight, active, heartbeat_us, flags, busy_ppm}; `weight` is a float (rounded
to f32 as the slot stores it) or "nan"/"inf"/"-inf".
"""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

VECTORS = Path(__file__).resolve().parent / "data" / "ext1-vectors.json"
EXT1, INTERACTIVE, DEMAND, PRIORITY = 1, 2, 4, 8
NOW = 1_764_000_000_123_456  # a Unix-epoch µs instant; every heartbeat below is relative to it


def f32(x: float | str) -> float:
    if isinstance(x, str):
        return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[x]
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def alive(s: dict, now: int) -> bool:  # §4
    return s["pid"] != 0 and abs(now - s["heartbeat_us"]) <= 3_000_000


def good_weight(w: float) -> bool:
    return w == w and w not in (math.inf, -math.inf) and w > 0


def tdm(members: list[tuple[int, float]]) -> tuple[int, dict[int, tuple[int, int]]] | None:
    """§5 steps 1, 3-5 over (slot, weight) in slot order: (period_us, {slot: (start, end)}), None for n <= 1."""
    n = len(members)
    if n <= 1:
        return None
    w = [x for _, x in members]
    f = min(0.10, 1.0 / n)
    fixed: list[int] = []
    while True:
        rest = [i for i in range(n) if i not in fixed]
        tot = sum(w[i] for i in rest)
        s = [f if i in fixed else (1.0 - f * len(fixed)) * w[i] / tot for i in range(n)]
        low = [i for i in rest if s[i] < f]
        if not low:
            break
        fixed += low
    period_ms = max(80, min(400, math.floor(40.0 / min(s) + 0.5)))
    period = 1000 * period_ms
    starts = [math.floor(period * sum(s[:k]) + 0.5) for k in range(n)]
    ends = starts[1:] + [period]
    return period, {members[k][0]: (starts[k], ends[k]) for k in range(n)}


def decide(slots: list[dict], now: int) -> dict:
    """§7: the mode, members, priority members, the v1 peer and the schedule."""
    ws = [f32(s["weight"]) for s in slots]
    v1_members = [i for i, s in enumerate(slots) if alive(s, now) and s["active"] == 1 and good_weight(ws[i])]
    lacking = [i for i in v1_members if not slots[i]["flags"] & EXT1]
    if lacking:
        return {
            "mode": "v1",
            "members": v1_members,
            "priority": [],
            "v1_peer": lacking[0],
            "tdm": tdm([(i, ws[i]) for i in v1_members]),
        }
    members = [i for i, s in enumerate(slots) if alive(s, now) and good_weight(ws[i]) and s["flags"] & DEMAND]
    total = sum(ws[i] for i in members)
    prio = []
    for i in members:
        fl = slots[i]["flags"]
        if fl & INTERACTIVE and fl & PRIORITY and slots[i]["busy_ppm"] <= 1e6 * (ws[i] / total):
            prio.append(i)
    chosen = prio if prio else members
    return {
        "mode": "priority" if prio else "ext1",
        "members": members,
        "priority": prio,
        "v1_peer": None,
        "tdm": tdm([(i, ws[i]) for i in chosen]),
    }


def may_run(d: dict, slot: int, now: int) -> bool:
    if d["mode"] == "priority" and slot in d["members"] and slot not in d["priority"]:
        return False
    if d["tdm"] is None or slot not in d["tdm"][1]:
        return True
    period, windows = d["tdm"]
    start, end = windows[slot]
    return start <= now % period < end


def hysteresis(had: bool, busy_ppm: int, share: float) -> bool:
    """§7 rule 2: clear once busy > 0.8e6·S; set again only once busy < 0.7e6·S."""
    if had and busy_ppm > 0.8e6 * share:
        return False
    if not had and busy_ppm < 0.7e6 * share:
        return True
    return had


# -- the cases ---------------------------------------------------------------


def slot(
    weight: float | str = 1.0,
    flags: int = EXT1 | DEMAND,
    *,
    busy: int = 0,
    active: int = 1,
    age: int = 1_000,
    pid: int = 0,
) -> dict:
    return {"pid": pid, "weight": weight, "active": active, "heartbeat_us": NOW - age, "flags": flags, "busy_ppm": busy}


BATCH = EXT1 | DEMAND
INTER = EXT1 | DEMAND | INTERACTIVE | PRIORITY  # holding its bit
INTER_LOST = EXT1 | DEMAND | INTERACTIVE  # cleared by its hysteresis
V1 = 0

CASES: list[tuple[str, list[dict], int]] = [
    ("ext1 two batch with demand 2:1 (= §5)", [slot(2), slot(1)], 100_000),
    ("ext1 no demand anywhere: no members", [slot(2, EXT1), slot(1, EXT1 | INTERACTIVE | PRIORITY)], 0),
    ("ext1 one of two with demand: runs alone", [slot(2, EXT1), slot(1)], 50_000),
    ("ext1 demand replaces active (active 0 still a member)", [slot(1, active=0), slot(1)], 10_000),
    ("v1 member forces §5 over everyone", [slot(1, V1), slot(1, INTER), slot(1)], 30_000),
    (
        "v1 member second forces §5; ext1 without active is no §5 member",
        [slot(1, INTER, active=0), slot(2, V1), slot(1)],
        70_000,
    ),
    ("v1 peer idle does not force §5", [slot(1, V1, active=0), slot(1, INTER), slot(1)], 0),
    ("v1 peer dead does not force §5", [slot(1, V1, age=3_000_001), slot(1, INTER), slot(1)], 0),
    ("v1 peer with invalid weight does not force §5", [slot("nan", V1), slot(1, INTER), slot(1)], 0),
    ("priority: one interactive under budget, batch waits", [slot(1), slot(1, INTER, busy=100_000)], 10_000),
    ("priority: exactly at budget keeps it", [slot(1), slot(1, INTER, busy=500_000)], 60_000),
    ("priority: over budget loses it whatever the bit", [slot(1), slot(1, INTER, busy=500_001)], 60_000),
    ("priority: bit cleared by hysteresis, under budget: no priority", [slot(1), slot(1, INTER_LOST, busy=0)], 60_000),
    ("priority: bit without INTERACTIVE is no priority", [slot(1), slot(1, BATCH | PRIORITY)], 60_000),
    ("priority: interactive without demand is no member", [slot(1), slot(1, INTER & ~DEMAND)], 60_000),
    ("priority: weight 3 of 4 budget 750000 kept", [slot(1), slot(3, INTER, busy=750_000)], 5_000),
    ("priority: weight 1 of 4 budget 250000 exceeded", [slot(3), slot(1, INTER, busy=250_001)], 5_000),
    (
        "priority: two interactive share §5 between them, batch waits",
        [slot(2), slot(2, INTER, busy=100_000), slot(1, INTER, busy=100_000)],
        70_000,
    ),
    (
        "priority: two interactive, one over budget: the other alone",
        [slot(2), slot(1, INTER, busy=400_000), slot(1, INTER, busy=100_000)],
        20_000,
    ),
    ("priority: lone interactive member runs unpaced", [slot(1, EXT1), slot(1, INTER, busy=900_000)], 20_000),
    ("priority: dead interactive is no member", [slot(1), slot(1, INTER, age=3_000_001)], 20_000),
    ("priority: invalid-weight interactive is no member", [slot(1), slot(0.0, INTER), slot(2)], 20_000),
    (
        "ext1 three batch 2:1:1 with an idle interactive",
        [slot(2), slot(1), slot(1, EXT1 | INTERACTIVE), slot(1)],
        130_000,
    ),
    ("ext1 10:1 floor", [slot(10), slot(1)], 370_000),
]

HYSTERESIS = [  # (had, busy_ppm, share) -> the bit after
    (True, 0, 0.5),
    (True, 400_000, 0.5),
    (True, 400_001, 0.5),
    (True, 500_000, 0.5),
    (False, 400_000, 0.5),
    (False, 350_000, 0.5),
    (False, 349_999, 0.5),
    (True, 350_000, 0.5),
    (False, 0, 0.25),
    (True, 1_000_000, 1.0),
    (True, 800_001, 1.0),
    (False, 699_999, 1.0),
    (False, 700_000, 1.0),
    (True, 200_001, 0.25),
    (False, 174_999, 0.25),
    (False, 175_000, 0.25),
]
TRACE_BUSY = [0, 200_000, 380_000, 400_000, 420_000, 600_000, 390_000, 360_000, 350_000, 340_000, 380_000, 410_000]


def _padded(slots: list[dict]) -> list[dict]:
    out = [dict(s, pid=s["pid"] or 101 + i) for i, s in enumerate(slots)]
    return out + [
        {"pid": 0, "weight": 0.0, "active": 0, "heartbeat_us": 0, "flags": 0, "busy_ppm": 0}
        for _ in range(16 - len(out))
    ]


def build() -> dict:
    cases = []
    for name, slots, phase in CASES:
        full = _padded(slots)
        d = decide(full, NOW)
        period = d["tdm"][0] if d["tdm"] else None
        now = NOW - NOW % period + period + phase if period else NOW + phase
        d = decide(full, now)  # the same at that instant (heartbeats are ms old either way)
        occupied = [i for i, s in enumerate(full) if s["pid"] != 0]
        cases.append(
            {
                "name": name,
                "now_us": now,
                "slots": full,
                "expect": {
                    "mode": d["mode"],
                    "members": d["members"],
                    "priority": d["priority"],
                    "v1_peer": d["v1_peer"],
                    "period_us": period,
                    "windows": {str(k): list(v) for k, v in d["tdm"][1].items()} if d["tdm"] else {},
                    "may_run": {str(i): may_run(d, i, now) for i in occupied},
                },
            }
        )
    bits, had = [], True
    for b in TRACE_BUSY:
        had = hysteresis(had, b, 0.5)
        bits.append(had)
    return {
        "spec": "registry-abi.md §7 (Extension 1), with §4 and §5",
        "note": "generated by tests/ext1_reference.py (an independent implementation); flags: EXT1=1 "
        "INTERACTIVE=2 DEMAND=4 PRIORITY=8; weights are rounded to f32; now_us is chosen at the phase each case names",
        "cases": cases,
        "hysteresis": [{"had": h, "busy_ppm": b, "share": s, "expect": hysteresis(h, b, s)} for h, b, s in HYSTERESIS],
        "hysteresis_trace": {"share": 0.5, "start": True, "busy_ppm": TRACE_BUSY, "expect": bits},
    }


def main(argv: list[str]) -> int:
    text = json.dumps(build(), indent=1) + "\n"
    if "--check" in argv:
        return 0 if VECTORS.read_text() == text else 1
    VECTORS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
