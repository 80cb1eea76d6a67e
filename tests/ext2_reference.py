"""A second, independent implementation of Extension 2 (spec registry-abi.md §8, on §4, §5 and §7),
written from the spec text with the standard library only (it shares no code with gpushare_tui nor
with tests/ext1_reference.py), and the generator of tests/data/ext2-vectors.json:

    python tests/ext2_reference.py          # rewrite the vectors file from the cases below
    python tests/ext2_reference.py --check  # exit 1 if the file differs from what this computes

A case is the 16 slots {pid, weight, active, heartbeat_us, flags, busy_ppm} and `uids`: what one
reader read for each occupied slot ({slot: uid}, null when it could not verify it).
"""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data" / "ext2-vectors.json"
BIT = {"EXT1": 0, "INTERACTIVE": 1, "DEMAND": 2, "PRIORITY": 3, "USERS": 4}
NOW = 1_780_000_000_654_321
ROOT, NOBODY, THIRD = 0, 65534, 1000


def has(flags: int, name: str) -> bool:
    return (flags >> BIT[name]) & 1 == 1


def as_f32(x: object) -> float:
    if x in ("nan", "inf", "-inf"):
        return float(str(x))
    (v,) = struct.unpack("<f", struct.pack("<f", float(x)))  # type: ignore[arg-type]
    return v


class Slot:
    def __init__(self, index: int, raw: dict) -> None:
        self.i = index
        self.pid = raw["pid"]
        self.w = as_f32(raw["weight"])
        self.active = raw["active"]
        self.hb = raw["heartbeat_us"]
        self.flags = raw["flags"]
        self.busy = raw["busy_ppm"]

    def alive(self, now: int) -> bool:
        return self.pid != 0 and -3_000_000 <= now - self.hb <= 3_000_000

    def weight_ok(self) -> bool:
        return math.isfinite(self.w) and self.w > 0


def windows(pairs: list[tuple[int, float]]) -> tuple[int, dict[int, list[int]]] | None:
    """§5 steps 3-5, literally: water-filling with f = min(0.10, 1/n), the period, the windows."""
    if len(pairs) < 2:
        return None
    n = len(pairs)
    f = min(0.10, 1.0 / n)
    floored: set[int] = set()
    shares: dict[int, float] = {}
    changed = True
    while changed:
        changed = False
        rest_total = sum(w for k, (_, w) in enumerate(pairs) if k not in floored)
        for k, (_, w) in enumerate(pairs):
            shares[k] = f if k in floored else (1 - f * len(floored)) * w / rest_total
        newly = {k for k in range(n) if k not in floored and shares[k] < f}
        if newly:
            floored |= newly
            changed = True
    period = 1000 * min(400, max(80, math.floor(40 / min(shares.values()) + 0.5)))
    out: dict[int, list[int]] = {}
    acc = 0.0
    for k, (slot, _) in enumerate(pairs):
        out[slot] = [math.floor(period * acc + 0.5), 0]
        acc += shares[k]
    order = [slot for slot, _ in pairs]
    for a, b in zip(order, order[1:]):
        out[a][1] = out[b][0]
    out[order[-1]][1] = period
    return period, out


def evaluate(raw_slots: list[dict], uids: dict[int, int | None], now: int) -> dict:
    slots = [Slot(i, r) for i, r in enumerate(raw_slots)]
    # §7 compatibility: a §4 member without EXT1 puts everyone on §5
    v1_members = [s for s in slots if s.alive(now) and s.active == 1 and s.weight_ok()]
    plain_v1 = [s for s in v1_members if not has(s.flags, "EXT1")]
    result = {"users_applied": False, "fallback": None, "user_shares": {}, "priority": []}
    if plain_v1:
        result.update(
            mode="v1",
            members=[s.i for s in v1_members],
            fallback=f"slot {plain_v1[0].i} is a v1 peer",
            sched=windows([(s.i, s.w) for s in v1_members]),
        )
        return result
    members = [s for s in slots if s.alive(now) and s.weight_ok() and has(s.flags, "DEMAND")]
    result["members"] = [s.i for s in members]

    def priority_of(share_of: dict[int, float]) -> list[int]:
        return [
            s.i
            for s in members
            if has(s.flags, "INTERACTIVE") and has(s.flags, "PRIORITY") and s.busy <= 1e6 * share_of[s.i]
        ]

    def finish(weight_of: dict[int, float], share_of: dict[int, float]) -> dict:
        prio = priority_of(share_of)
        picked = [s for s in members if s.i in prio] if prio else members
        result.update(
            mode="priority" if prio else "ext1", priority=prio, sched=windows([(s.i, weight_of[s.i]) for s in picked])
        )
        return result

    total = sum(s.w for s in members)
    plain = {s.i: s.w / total for s in members}
    flat = {s.i: s.w for s in members}
    # §8.2: every §7 member has USERS and its user is known to this reader
    if not members:
        return finish(flat, plain)
    no_bit = [s.i for s in members if not has(s.flags, "USERS")]
    if no_bit:
        result["fallback"] = f"slot {no_bit[0]} lacks USERS"
        return finish(flat, plain)
    blind = [s.i for s in members if uids.get(s.i) is None]
    if blind:
        result["fallback"] = f"slot {blind[0]}'s user is unverifiable here"
        return finish(flat, plain)
    # §8.3: e_i = w_i / (U * W_u), W_u in slot order
    per_user: dict[int, float] = {}
    for s in members:
        u = uids[s.i]
        assert u is not None
        per_user[u] = per_user.get(u, 0.0) + s.w
    e = {s.i: s.w / (len(per_user) * per_user[uids[s.i]]) for s in members}  # type: ignore[index]
    result["users_applied"] = True
    result["user_shares"] = e
    return finish(e, e)


def allowed(res: dict, slot: int, now: int) -> bool:
    if res["mode"] == "priority" and slot in res["members"] and slot not in res["priority"]:
        return False
    sched = res["sched"]
    if sched is None or slot not in sched[1]:
        return True
    period, win = sched
    return win[slot][0] <= now % period < win[slot][1]


def own_share(raw_slots: list[dict], slot: int, weight: float, uids: dict[int, int | None], now: int) -> float | None:
    """§8.3 rule 3: the owner's e_i counting itself a member whatever its DEMAND."""
    slots = [Slot(i, r) for i, r in enumerate(raw_slots)]
    group = {s.i: s.w for s in slots if s.i != slot and s.alive(now) and s.weight_ok() and has(s.flags, "DEMAND")}
    group[slot] = weight
    if any(uids.get(i) is None for i in group):
        return None
    sums: dict[int, float] = {}
    for i in sorted(group):
        sums[uids[i]] = sums.get(uids[i], 0.0) + group[i]  # type: ignore[index]
    return weight / (len(sums) * sums[uids[slot]])  # type: ignore[index]


def keeps_bit(raw_slots: list[dict], slot: int, uids: dict[int, int | None], now: int) -> bool:
    """§8.2: USERS while every other alive slot with a valid weight has a verified user."""
    others = [
        s for s in (Slot(i, r) for i, r in enumerate(raw_slots)) if s.i != slot and s.alive(now) and s.weight_ok()
    ]
    return all(uids.get(s.i) is not None for s in others)


# -- the cases ------------------------------------------------------------------------------------

E1, INT, DEM, PRI, USR = (1 << BIT[k] for k in ("EXT1", "INTERACTIVE", "DEMAND", "PRIORITY", "USERS"))
B2 = E1 | DEM | USR  # an Extension-2 batch owner with work
I2 = B2 | INT | PRI  # an Extension-2 interactive owner holding its bit


def s(
    weight: float | str = 1,
    flags: int = B2,
    uid: int | None = ROOT,
    *,
    busy: int = 0,
    active: int = 1,
    age: int = 2_000,
) -> tuple:
    return (
        {"pid": 0, "weight": weight, "active": active, "heartbeat_us": NOW - age, "flags": flags, "busy_ppm": busy},
        uid,
    )


CASES: list[tuple[str, list[tuple], int]] = [
    ("A 1,1,1 and B 1: B half, A a sixth each", [s(1), s(1), s(1), s(1, uid=NOBODY)], 130_000),
    ("A 2,1,1 and B 1: 25/12.5/12.5/50", [s(2), s(1), s(1), s(1, uid=NOBODY)], 170_000),
    ("B first in slot order: the same split", [s(1, uid=NOBODY), s(1), s(1), s(1)], 10_000),
    ("three users A 1, B 1, C 1,1", [s(1), s(1, uid=NOBODY), s(1, uid=THIRD), s(1, uid=THIRD)], 210_000),
    ("one user: the plain split (= §7)", [s(2), s(1)], 90_000),
    ("interleaved users A B A B with 3,1,1,3", [s(3), s(1, uid=NOBODY), s(1), s(3, uid=NOBODY)], 50_000),
    ("f32 weights 0.3, 0.7 against 1", [s(0.3), s(0.7), s(1, uid=NOBODY)], 20_000),
    ("a v1 member: §5 over everyone", [s(1), s(1), s(1), s(1, uid=NOBODY), s(1, 0, NOBODY)], 30_000),
    ("a §7-only member (no USERS): §7 flat", [s(1), s(1), s(1), s(1, E1 | DEM, NOBODY)], 30_000),
    ("a member without USERS that is ours: still §7", [s(1, E1 | DEM), s(1), s(1, uid=NOBODY)], 30_000),
    ("a member whose user is unverifiable: §7", [s(1), s(1), s(1), s(1, uid=None)], 40_000),
    ("an idle member without USERS forces nothing", [s(1), s(1), s(1, E1, NOBODY), s(1, uid=NOBODY)], 100_000),
    ("an idle member nobody can verify forces nothing", [s(1), s(1), s(1, E1 | USR, None), s(1, uid=NOBODY)], 100_000),
    ("an idle v1 peer forces nothing", [s(1), s(1), s(1, 0, NOBODY, active=0), s(1, uid=NOBODY)], 100_000),
    ("a dead member without USERS forces nothing", [s(1), s(1, E1 | DEM, NOBODY, age=3_000_001), s(1, uid=NOBODY)], 0),
    ("a user with only idle slots is no user", [s(1), s(1, E1 | USR, THIRD), s(1, uid=NOBODY)], 60_000),
    ("invalid-weight member of a third user is no member", [s(1), s("nan", uid=THIRD), s(1, uid=NOBODY)], 60_000),
    ("priority within the user share kept", [s(1, I2, busy=250_000), s(1), s(1, uid=NOBODY)], 20_000),
    (
        "priority past the user share lost (within the plain one)",
        [s(1, I2, busy=300_000), s(1), s(1, uid=NOBODY)],
        20_000,
    ),
    ("priority of B's lone engine: budget one half", [s(1), s(1), s(1, I2, NOBODY, busy=500_000)], 20_000),
    (
        "priority on §7 fallback judged on the plain share",
        [s(1, I2, busy=300_000), s(1), s(1, E1 | DEM, NOBODY)],
        20_000,
    ),
    (
        "two priority members of two users: §5 over their user shares",
        [s(1, I2, busy=1), s(1), s(1, I2, NOBODY, busy=1)],
        150_000,
    ),
    ("5 against 1: the floor just holds", [*(s(1) for _ in range(5)), s(1, uid=NOBODY)], 350_000),
    ("10 against 1: the floor lifts every engine to 1/11", [*(s(1) for _ in range(10)), s(1, uid=NOBODY)], 350_000),
    ("6 of A at 5,1,1,1,1,1 against B: some floored", [s(5), *(s(1) for _ in range(5)), s(1, uid=NOBODY)], 100_000),
    ("no member with demand: no schedule", [s(1, E1 | USR), s(1, E1 | USR, NOBODY)], 0),
    ("one member alone: unpaced", [s(1), s(1, E1 | USR, NOBODY)], 0),
]

OWN_SHARES = [  # (case index, slot, weight): the owner's own e_i
    (0, 0, 1.0),
    (0, 3, 1.0),
    (1, 0, 2.0),
    (11, 2, 1.0),  # idle: counted a member whatever its DEMAND (adds its user)
    (15, 1, 1.0),
    (10, 0, 1.0),  # a member's user unknown: None
]


def full(case: list[tuple]) -> tuple[list[dict], dict[int, int | None]]:
    slots = [dict(raw, pid=4000 + k) for k, (raw, _) in enumerate(case)]
    uids = {k: uid for k, (_, uid) in enumerate(case)}
    blank = {"pid": 0, "weight": 0.0, "active": 0, "heartbeat_us": 0, "flags": 0, "busy_ppm": 0}
    return slots + [dict(blank) for _ in range(16 - len(slots))], uids


def build() -> dict:
    out = []
    for name, case, phase in CASES:
        slots, uids = full(case)
        res = evaluate(slots, uids, NOW)
        period = res["sched"][0] if res["sched"] else None
        now = (NOW // period + 1) * period + phase if period else NOW + phase
        res = evaluate(slots, uids, now)
        out.append(
            {
                "name": name,
                "now_us": now,
                "slots": slots,
                "uids": {str(k): v for k, v in uids.items()},
                "expect": {
                    "mode": res["mode"],
                    "users_applied": res["users_applied"],
                    "fallback": res["fallback"],
                    "members": res["members"],
                    "priority": res["priority"],
                    "user_shares": {str(k): v for k, v in res["user_shares"].items()},
                    "period_us": period,
                    "windows": {str(k): v for k, v in res["sched"][1].items()} if res["sched"] else {},
                    "may_run": {str(k): allowed(res, k, now) for k in uids},
                    "keeps_users_bit": {str(k): keeps_bit(slots, k, uids, now) for k in uids},
                },
            }
        )
    own = []
    for ci, slot, weight in OWN_SHARES:
        slots, uids = full(CASES[ci][1])
        own.append({"case": ci, "slot": slot, "weight": weight, "expect": own_share(slots, slot, weight, uids, NOW)})
    return {
        "spec": "registry-abi.md §8 (Extension 2), with §4, §5 and §7",
        "note": "generated by tests/ext2_reference.py (an independent implementation); flags: EXT1=1 "
        "INTERACTIVE=2 DEMAND=4 PRIORITY=8 USERS=16; uids: what the reader read per slot (null: unverifiable); "
        "weights are rounded to f32; own_shares are at the first case's NOW",
        "now_base_us": NOW,
        "cases": out,
        "own_shares": own,
    }


def main(argv: list[str]) -> int:
    text = json.dumps(build(), indent=1) + "\n"
    if "--check" in argv:
        return 0 if OUT.exists() and OUT.read_text() == text else 1
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
