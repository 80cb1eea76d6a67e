"""Extension 2, fair between users (spec registry-abi.md §8). Pure: time and uids are parameters.

`decide(slots, now_us, uids)` composes Extension 1: §7's decision first (its §5 fallback stands), then,
when every §7 member has USERS and the reader knows every member's user (`uids`: slot -> the real uid
of its pid as this reader read it, None when unverifiable), the user shares
`e_i = w_i / (U · W_u)` replace the weights in §7's priority budgets and §5's windows. Otherwise §7's
decision unchanged, with the reason (`fallback`). `user_share` is an owner's own e_i (its budget);
`verifies_all_others` whether an owner may keep its USERS bit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..registry import abi
from ..registry.abi import SlotRecord
from . import ext1
from . import v1 as schedule

Uids = Mapping[int, int | None]  # slot index -> the real uid of its pid, None when unverifiable here


@dataclass(frozen=True)
class Decision(ext1.Decision):
    """§7's decision, or Extension 2's. `users_applied`: the user shares are in force; `fallback`: why
    not (None when applied or when there are no members); `user_of`: (slot, uid) of each §7 member whose
    user this reader knows; `user_shares`: (slot, e_i) of each member when applied."""

    users_applied: bool = False
    fallback: str | None = None
    user_of: tuple[tuple[int, int], ...] = ()
    user_shares: tuple[tuple[int, float], ...] = ()

    def user_share_of(self, slot: int) -> float | None:
        return dict(self.user_shares).get(slot)


def _valid_alive(s: SlotRecord, now_us: int) -> bool:
    return s.is_alive(now_us) and abi.weight_is_valid(s.weight)


def user_shares(members: Iterable[tuple[int, float, int]]) -> list[tuple[int, float]]:
    """(slot, e_i) for (slot, weight, uid) members in slot order: e_i = w_i / (U · W_u), W_u summed in
    slot order (spec §8.3)."""
    ordered = sorted(members)
    totals: dict[int, float] = {}
    for _, w, uid in ordered:
        totals[uid] = totals.get(uid, 0.0) + w
    n_users = len(totals)
    return [(slot, w / (n_users * totals[uid])) for slot, w, uid in ordered]


def _fallback(d: ext1.Decision, why: str | None, user_of: tuple[tuple[int, int], ...] = ()) -> Decision:
    return Decision(
        d.mode,
        d.schedule,
        d.members,
        d.priority,
        d.v1_peer,
        d.interactive_alive,
        d.priority_share,
        d.over_budget,
        fallback=why,
        user_of=user_of,
    )


def decide(slots: Iterable[SlotRecord], now_us: int, uids: Uids) -> Decision:
    """The schedule every peer computes (spec §8.2): §7's unless every §7 member has USERS and its
    user is known here; then §7 over the user shares."""
    ordered = sorted(slots, key=lambda s: s.index)
    d = ext1.decide(ordered, now_us)
    if d.mode == ext1.MODE_V1:
        return _fallback(d, f"slot {d.v1_peer} is a v1 peer")
    by_index = {s.index: s for s in ordered}
    user_of = tuple((i, u) for i in d.members if (u := uids.get(i)) is not None)
    if not d.members:
        return _fallback(d, None, user_of)
    lacking = [i for i in d.members if not by_index[i].flags & abi.FLAG_USERS]
    if lacking:
        return _fallback(d, f"slot {lacking[0]} lacks USERS", user_of)
    if len(user_of) < len(d.members):
        unknown = next(i for i in d.members if uids.get(i) is None)
        return _fallback(d, f"slot {unknown}'s user is unverifiable here", user_of)
    known = dict(user_of)
    shares = user_shares((i, float(by_index[i].weight), known[i]) for i in d.members)
    prio = tuple(
        i
        for i, e in shares
        if by_index[i].flags & abi.FLAG_INTERACTIVE
        and by_index[i].flags & abi.FLAG_PRIORITY
        and by_index[i].busy_ppm <= ext1.BUDGET_PPM * e
    )
    chosen = [(i, e) for i, e in shares if i in prio] if prio else shares
    return Decision(
        ext1.MODE_PRIORITY if prio else ext1.MODE_EXT1,
        schedule.build_schedule(chosen),
        d.members,
        priority=prio,
        interactive_alive=d.interactive_alive,
        priority_share=sum(e for i, e in shares if i in prio),  # S_P over the user shares (§7 rule 2, §8.3)
        users_applied=True,
        user_of=user_of,
        user_shares=tuple(shares),
    )


def judged(d: Decision, believed: ext1.Decision) -> Decision:
    """`d` after a waiting member's check of the holders' budget (ext1.HoldOffCheck.judge, which gave
    `believed`): `d` when their priority is believed; else `d` without priority, over §8's user shares
    when those are in force, else §5's over every member (§7's verified budget)."""
    if believed is d:
        return d
    if d.users_applied:
        return Decision(
            ext1.MODE_EXT1,
            schedule.build_schedule(list(d.user_shares)),
            d.members,
            interactive_alive=d.interactive_alive,
            over_budget=believed.over_budget,
            users_applied=True,
            user_of=d.user_of,
            user_shares=d.user_shares,
        )
    return _fallback(believed, d.fallback, d.user_of)


def user_share(slots: Iterable[SlotRecord], slot: int, weight: float, uids: Uids, now_us: int) -> float | None:
    """An owner's own e_i counted as a member whatever its DEMAND (§8.3 rule 3, §7 rule 2); None when
    some member's user (its own included) is unknown here."""
    members = [
        (s.index, float(s.weight))
        for s in slots
        if s.index != slot and _valid_alive(s, now_us) and s.flags & abi.FLAG_DEMAND
    ]
    members.append((slot, weight))
    if weight <= 0:
        return 0.0
    with_uid: list[tuple[int, float, int]] = []
    for i, w in members:
        uid = uids.get(i)
        if uid is None:
            return None
        with_uid.append((i, w, uid))
    return dict(user_shares(with_uid))[slot]


def verifies_all_others(slots: Iterable[SlotRecord], slot: int | None, uids: Uids, now_us: int) -> bool:
    """An owner keeps USERS while it knows the user of every other alive slot with a valid weight (§8.2)."""
    return all(uids.get(s.index) is not None for s in slots if s.index != slot and _valid_alive(s, now_us))
