"""Immutable per-GPU snapshots built from read-only segments (their JSON: dashboard.report)."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from ..host.budgets import FOREIGN_READ_BUDGET_ALL_OWNERS_S, FOREIGN_READ_BUDGET_S, FOREIGN_SEGMENTS_SHOWN_MAX
from ..host.text import printable
from ..registry.abi import ALIVE_US, FLAG_DEMAND, FLAG_INTERACTIVE, SlotRecord, segment_name, weight_is_valid
from ..registry.segment import (
    Segment,
    SegmentError,
    UnknownGroupError,
    key_from_path,
    list_segments,
    resolve_group,
    user_name,
)
from ..schedule import ext1 as schedule_ext1
from ..schedule import ext2 as schedule_ext2
from ..schedule import v1 as schedule
from .users import UserReader, user_label


@dataclass(frozen=True)
class PeerSnapshot:
    slot: int
    pid: int
    name: str
    weight: float | None  # None when not a finite number
    share_pct: float  # plain w ÷ Σw over the schedule's members (what C peers' /gpu/peers report); 0 for a non-member
    window_us: tuple[int, int] | None  # [start, end) within the period
    busy_pct: float  # clamped to 0..100 (busy_ppm beyond 1e6 is a bad writer)
    active: bool
    alive: bool
    heartbeat_age_ms: float | None  # None: no heartbeat, or one > 3 s in the future (invalid)
    boot_us: int
    # busy time ÷ Σ busy time over the schedule's members (time on the device, whatever the model);
    # None when not a member, or no member was busy
    achieved_pct: float | None = None
    # the share of the period its window is (spec §5: w ÷ Σw with the water-filling floor min(10 %, 1/n)),
    # what the engine gets while busy; 100 for the only member; None when not a member
    window_pct: float | None = None

    @property
    def floor_lifted(self) -> bool:
        """The floor gave it a larger window than its plain share w ÷ Σw."""
        return floor_lifted(self.share_pct, self.window_pct)

    @property
    def ext1(self) -> bool:
        """Its owner implements Extension 1 (§7): it has a latency class."""
        return self.klass is not None

    # Extension 1 (spec §7), each None for a v1 peer (its flags lack EXT1): its latency class
    # ("interactive" | "batch"), whether it has work in flight (DEMAND), and whether it holds priority now
    klass: str | None = None
    demand: bool | None = None
    priority: bool | None = None
    # Extension 1 (§7): µs busy since it claimed the slot (0 from a v1 owner)
    busy_total_us: int = 0
    # Extension 2 (§8): the real uid of its pid as this reader read it (None: not verifiable here, or dead),
    # that uid's user name, and its user share e_i in % (None unless the user shares are in force)
    uid: int | None = None
    user: str | None = None
    user_share_pct: float | None = None


@dataclass(frozen=True)
class UserSnapshot:
    """One user's members of a GPU's schedule (spec §8): how many engines (alive peers of that uid), the
    share of the period their windows are, their user shares (None unless in force), achieved and busy."""

    uid: int
    user: str
    engines: int
    share_pct: float
    user_share_pct: float | None
    achieved_pct: float | None
    busy_pct: float


@dataclass(frozen=True)
class GpuSnapshot:
    gpu_key: str
    segment: str
    period_ms: int | None
    peers: tuple[PeerSnapshot, ...]
    now_us: int
    owner: str = ""  # the segment file's owner (user name, or the uid as text); "" when not known
    owner_uid: int = -1
    mode: int = 0  # its permission bits
    # the schedule in force (schedule_ext1.decide, spec §7): "v1" (§5; `v1_peer` is the member lacking
    # EXT1 that forces it, None when no member has any work), "ext1", "priority" (`priority_slots` run).
    # Not compared: a snapshot read back from JSON (--remote) that does not carry them is the same one.
    schedule_mode: str = field(default="v1", compare=False)
    v1_peer: int | None = field(default=None, compare=False)
    priority_slots: tuple[int, ...] = field(default=(), compare=False)
    # Extension 2 (§8): the user shares are in force; else why not (None: no members, or nothing to say)
    users_applied: bool = field(default=False, compare=False)
    users_fallback: str | None = field(default=None, compare=False)

    @property
    def users(self) -> tuple[UserSnapshot, ...]:
        """Per user (by uid, in order of first slot) of the alive peers whose user is known here."""
        return user_rows(self.peers)

    @property
    def writable_by_others(self) -> bool:
        """Group or world may write (and shrink) this segment: anyone of them can steer the schedule."""
        return bool(self.mode & 0o022)


@dataclass(frozen=True)
class SegmentProblem:
    segment: str
    error: str


def build_gpu_snapshot(
    gpu_key: str,
    segment: str,
    slots: Iterable[SlotRecord],
    now_us: int,
    *,
    owner: str = "",
    owner_uid: int = -1,
    mode: int = 0,
    uids: Mapping[int, int | None] | None = None,
) -> GpuSnapshot:
    """Pure: shares and windows per spec §5, Extension 1's schedule (§7) or Extension 2's (§8:
    schedule_ext2.decide, on `uids`: slot -> the real uid this reader read, None when unverifiable), from
    consistent slot records (owner and mode as given)."""
    slots = tuple(slots)
    uids = uids or {}
    decision = schedule_ext2.decide(slots, now_us, uids)
    weight_of = {s.index: float(s.weight) for s in slots}
    members = [(i, weight_of[i]) for i in decision.members]
    sched = decision.schedule
    shares = dict(zip((s for s, _ in members), schedule.share_pct([w for _, w in members]))) if members else {}
    user_shares = dict(decision.user_shares)
    windows = window_pcts(decision.user_shares if decision.users_applied else members)
    achieved = achieved_pcts(slots, [s for s, _ in members])
    peers = []
    for rec in slots:
        if rec.pid == 0:
            continue
        peers.append(
            PeerSnapshot(
                slot=rec.index,
                pid=rec.pid,
                name=rec.name,
                weight=float(rec.weight) if weight_is_valid(rec.weight) else None,
                share_pct=shares.get(rec.index, 0.0),
                window_us=sched.window_of(rec.index) if sched else None,
                busy_pct=min(rec.busy_ppm, 1_000_000) / 10_000,
                active=rec.active == 1,
                alive=rec.is_alive(now_us),
                heartbeat_age_ms=heartbeat_age_ms(rec.heartbeat_us, now_us),
                boot_us=rec.boot_us,
                achieved_pct=achieved.get(rec.index),
                window_pct=windows.get(rec.index),
                klass=("interactive" if rec.flags & FLAG_INTERACTIVE else "batch") if rec.ext1 else None,
                demand=bool(rec.flags & FLAG_DEMAND) if rec.ext1 else None,
                priority=(rec.index in decision.priority) if rec.ext1 else None,
                busy_total_us=rec.busy_total_us,
                uid=(uid := uids.get(rec.index)),
                user=user_label(uid) if uid is not None else None,
                user_share_pct=100.0 * user_shares[rec.index] if rec.index in user_shares else None,
            )
        )
    period = sched.period_ms if sched else None
    return GpuSnapshot(
        gpu_key,
        segment,
        period,
        tuple(peers),
        now_us,
        owner,
        owner_uid,
        mode,
        # a segment without any alive Extension-1 peer is a v1 one, whatever decide() says of no members
        schedule_mode=decision.mode if any(r.ext1 and r.is_alive(now_us) for r in slots) else "v1",
        v1_peer=decision.v1_peer,
        priority_slots=decision.priority,
        users_applied=decision.users_applied,
        users_fallback=decision.fallback,
    )


def user_rows(peers: Iterable[PeerSnapshot]) -> tuple[UserSnapshot, ...]:
    """Per uid of the alive peers whose user is known: engines, shares summed over its members."""
    rows: dict[int, list[PeerSnapshot]] = {}
    for p in peers:
        if p.alive and p.uid is not None:
            rows.setdefault(p.uid, []).append(p)

    def total(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    return tuple(
        UserSnapshot(
            uid=uid,
            user=ps[0].user or str(uid),
            engines=len(ps),
            share_pct=sum(p.window_pct or 0.0 for p in ps),
            user_share_pct=total([p.user_share_pct for p in ps]),
            achieved_pct=total([p.achieved_pct for p in ps]),
            busy_pct=sum(p.busy_pct for p in ps),
        )
        for uid, ps in rows.items()
    )


def window_pcts(members: Iterable[tuple[int, float]]) -> dict[int, float]:
    """Per member slot: its window's share of the period, in % (schedule.window_shares, the floor included)."""
    members = list(members)
    return {slot: 100.0 * f for (slot, _), f in zip(members, schedule.window_shares([w for _, w in members]))}


FLOOR_LIFT_MIN_PCT = 0.05  # a window this much above w ÷ Σw is the floor's doing, not rounding


def floor_lifted(share_pct: float, window_pct: float | None) -> bool:
    """Whether a window share exceeds the plain share it came from (the floor of spec §5.3 lifted it)."""
    return window_pct is not None and window_pct - share_pct >= FLOOR_LIFT_MIN_PCT


def achieved_pcts(slots: Iterable[SlotRecord], member_slots: Iterable[int]) -> dict[int, float]:
    """Per member slot: busy_ppm ÷ Σ busy_ppm over the members, in %; {} when their sum is 0."""
    members = set(member_slots)
    busy = {r.index: min(max(r.busy_ppm, 0), 1_000_000) for r in slots if r.index in members}
    total = sum(busy.values())
    return {i: 100.0 * b / total for i, b in busy.items()} if total > 0 else {}


def heartbeat_age_ms(heartbeat_us: int, now_us: int) -> float | None:
    """Age of a heartbeat for display; None when there is none (<= 0) or it lies more than
    ALIVE_US in the future (corrupt, or a stepped clock); a little in the future reads 0."""
    age_us = now_us - heartbeat_us
    if heartbeat_us <= 0 or age_us < -ALIVE_US:
        return None
    return max(0, age_us) / 1000


def own_peer(key: str, slots: Iterable[SlotRecord], slot: int | None, now_us: int) -> PeerSnapshot | None:
    """Our own row (share, window) among `slots` of segment `key`, as every peer computes it."""
    snap = build_gpu_snapshot(key, segment_name(key), slots, now_us)
    return next((p for p in snap.peers if p.slot == slot), None)


def sole_member(slots: Iterable[SlotRecord], slot: int | None, now_us: int) -> bool:
    """Whether `slot` is the only member of the schedule of `slots` now (share 100 %: nobody to share with)."""
    members = schedule_ext1.decide(slots, now_us).members
    return slot is not None and members == (slot,)


OTHERS_IDLE_BUSY_PPM = 20_000  # another live peer reporting more busy time than this (2 %) is working


def runs_alone(slots: Iterable[SlotRecord], slot: int | None, now_us: int) -> bool:
    """Whether `slot` runs alone now, so that its rate is a solo rate (core.rate.StepRate's `alone`): the
    schedule's only member, and no other live peer reports busy time (one not active, or not yet: it
    still runs unpaced beside us, e.g. for the ~0.1 s before its supervisor sees its first decode)."""
    slots = tuple(slots)
    if not sole_member(slots, slot, now_us):
        return False
    return not any(
        r.index != slot and r.pid != 0 and r.is_alive(now_us) and r.busy_ppm > OTHERS_IDLE_BUSY_PPM for r in slots
    )


def _text(name: str) -> str:
    """A file name that was not UTF-8 (surrogate-escaped by os.listdir), printable: U+FFFD for bad bytes."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@dataclass(frozen=True)
class SegmentsRead:
    """One refresh of this host's segments: snapshots and errors (ours first), and how many foreign
    segments were not read (over the count cap or the time budget), with the cap (None: --all-owners)."""

    gpus: list[GpuSnapshot]
    errors: list[SegmentProblem]
    foreign_not_shown: int = 0
    foreign_shown_max: int | None = FOREIGN_SEGMENTS_SHOWN_MAX


@dataclass(frozen=True)
class _Listed:
    path: str
    trusted: bool


def share_gid_from_env() -> int | None:
    """The gid of GPUSHARE_GROUP (the --share-group our engines use), or None when unset or unknown."""
    group = os.environ.get("GPUSHARE_GROUP")
    if not group:
        return None
    try:
        return resolve_group(group)
    except UnknownGroupError:
        return None


class SegmentReader:
    """Reads this host's segments afresh at every refresh: ours first, then foreign ones within a budget.

    Trusted (read first, all of them): segments owned by us or root, those of our share group
    (`share_gid`, default GPUSHARE_GROUP's), and the one `gpu_key` names (then only that one is read).
    Foreign segments (anyone else's) are read after, sorted by name, until FOREIGN_SEGMENTS_SHOWN_MAX of
    them were read or their time budget is spent; the rest are counted, not read. With `all_owners`
    there is no count cap (the time budget is FOREIGN_READ_BUDGET_ALL_OWNERS_S). No fd is held between
    refreshes (open, pread, close), so a flood of segments cannot exhaust our fds. A torn slot is an
    error row (`slot N torn`), not a wait; a trusted segment's torn slot shows its last consistent copy."""

    def __init__(
        self,
        gpu_key: str | None = None,
        shm_dir: str | None = None,
        *,
        all_owners: bool = False,
        share_gid: int | None = None,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gpu_key = gpu_key
        self.shm_dir = shm_dir
        self.all_owners = all_owners
        self.share_gid = share_gid if share_gid is not None else share_gid_from_env()
        self._clock_s = clock_s
        # per trusted segment: its file's identity, and its slots' last consistent copies
        self._last_good: dict[str, tuple[tuple[int, int], dict[int, bytes]]] = {}
        self._trust: dict[str, tuple[int, bool]] = {}  # path -> (inode, trusted) at the last listing
        self._users = UserReader()  # whose process each slot names (spec §8.1), within its budgets

    def read(self, now_us: int) -> tuple[list[GpuSnapshot], list[SegmentProblem]]:
        """Snapshots and errors (read_all's, without the counts)."""
        r = self.read_all(now_us)
        return r.gpus, r.errors

    def _listed(self) -> list[_Listed]:
        """Every segment, trusted first (each group by name). A name is lstat'ed only when it is new or
        names another inode than at the last listing (readdir gives inodes): a flood costs a stat once."""
        uid = os.geteuid()
        listed = []
        known: dict[str, tuple[int, bool]] = {}
        for path, inode in list_segments(self.shm_dir):
            if self.gpu_key is not None:
                if key_from_path(path) == self.gpu_key:
                    listed.append(_Listed(path, True))
                continue
            cached = self._trust.get(path)
            if cached is not None and cached[0] == inode:
                trusted = cached[1]
            else:
                try:
                    st = os.stat(path, follow_symlinks=False)
                except OSError:
                    continue  # gone since the listing
                trusted = st.st_uid in (uid, 0) or (self.share_gid is not None and st.st_gid == self.share_gid)
            known[path] = (inode, trusted)
            listed.append(_Listed(path, trusted))
        self._trust = known
        return sorted(listed, key=lambda x: not x.trusted)  # stable: by name within each group

    def read_all(self, now_us: int) -> SegmentsRead:
        listed = self._listed()
        trusted = {x.path for x in listed if x.trusted}
        for gone in set(self._last_good) - trusted:
            del self._last_good[gone]
        cap = None if self.all_owners else FOREIGN_SEGMENTS_SHOWN_MAX
        budget_s = FOREIGN_READ_BUDGET_ALL_OWNERS_S if self.all_owners else FOREIGN_READ_BUDGET_S
        gpus: list[GpuSnapshot] = []
        errors: list[SegmentProblem] = []
        foreign_read = 0
        deadline: float | None = None
        not_shown = 0
        for x in listed:
            if not x.trusted:
                if deadline is None:
                    deadline = self._clock_s() + budget_s
                if (cap is not None and foreign_read >= cap) or self._clock_s() >= deadline:
                    not_shown += 1
                    continue
                foreign_read += 1
            try:
                snap, torn = self._snapshot(x.path, now_us, x.trusted)
                gpus.append(snap)
                if torn:
                    errors.append(SegmentProblem(snap.segment, _torn_text(torn)))
            except SegmentError as e:
                errors.append(SegmentProblem(_text(e.segment), e.why))
            except (OSError, ValueError) as e:
                errors.append(SegmentProblem(_text("/" + x.path.rsplit("/", 1)[-1]), _text(str(e))))
        return SegmentsRead(gpus, errors, not_shown, cap)

    def _snapshot(self, path: str, now_us: int, trusted: bool) -> tuple[GpuSnapshot, tuple[int, ...]]:
        with Segment.attach_readonly(path) as seg:
            if trusted:
                ident, last_good = self._last_good.get(path, (None, {}))
                if ident != seg.ident:
                    last_good = {}
                    self._last_good[path] = (seg.ident, last_good)
                seg.keep_last_good(last_good)
            read = seg.read_slots_checked()
            st = seg.fstat()  # now: the owner may chmod/chown it at any time
        snap = build_gpu_snapshot(
            _text(seg.key),
            _text(seg.name),
            read.slots,
            now_us,
            owner=user_name(st.st_uid),
            owner_uid=st.st_uid,
            mode=stat.S_IMODE(st.st_mode),
            uids=self._users.uids(read.slots, now_us),
        )
        return snap, read.torn

    def close(self) -> None:
        """Forget the last consistent copies (no fd is held between refreshes)."""
        self._last_good.clear()


def foreign_not_shown_text(n: int) -> str:
    """The one line every surface shows for the segments of other users it did not read."""
    return f"{n} segment{'s' if n != 1 else ''} of other users not shown (--all-owners)"


def _torn_text(torn: tuple[int, ...]) -> str:
    which = ", ".join(str(i) for i in torn)
    return f"slot{'s' if len(torn) > 1 else ''} {which} torn (seqlock word odd or changing; not shown)"


def printable_gpu(g: GpuSnapshot) -> GpuSnapshot:
    """`g` with its key, segment name and peer names printable (for terminal views only)."""
    peers = tuple(replace(p, name=printable(p.name)) for p in g.peers)
    return replace(g, gpu_key=printable(g.gpu_key), segment=printable(g.segment), peers=peers)


def printable_problem(e: SegmentProblem) -> SegmentProblem:
    return SegmentProblem(printable(e.segment), printable(e.error))
