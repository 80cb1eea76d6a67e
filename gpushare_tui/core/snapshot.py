"""Immutable per-GPU snapshots built from read-only segments (their JSON: dashboard.report)."""

from __future__ import annotations

import stat
from collections.abc import Iterable
from dataclasses import dataclass

from . import schedule
from .abi import ALIVE_US, SlotRecord, segment_name, weight_is_valid
from .segment import Segment, SegmentError, key_from_path, list_segment_paths, user_name


@dataclass(frozen=True)
class PeerSnapshot:
    slot: int
    pid: int
    name: str
    weight: float | None  # None when not a finite number
    share_pct: float
    window_us: tuple[int, int] | None  # [start, end) within the period
    busy_pct: float  # clamped to 0..100 (busy_ppm beyond 1e6 is a bad writer)
    active: bool
    alive: bool
    heartbeat_age_ms: float | None  # None: no heartbeat, or one > 3 s in the future (invalid)
    boot_us: int
    # busy time ÷ Σ busy time over the schedule's members (time on the device, whatever the model);
    # None when not a member, or no member was busy
    achieved_pct: float | None = None


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
) -> GpuSnapshot:
    """Pure: shares and windows per spec §5 from consistent slot records (owner and mode as given)."""
    slots = tuple(slots)
    members = schedule.member_weights(slots, now_us)
    sched = schedule.build_schedule(members)
    shares = dict(zip((s for s, _ in members), schedule.share_pct([w for _, w in members]))) if members else {}
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
            )
        )
    period = sched.period_ms if sched else None
    return GpuSnapshot(gpu_key, segment, period, tuple(peers), now_us, owner, owner_uid, mode)


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
    members = schedule.member_weights(slots, now_us)
    return slot is not None and len(members) == 1 and members[0][0] == slot


def _text(name: str) -> str:
    """A file name that was not UTF-8 (surrogate-escaped by os.listdir), printable: U+FFFD for bad bytes."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class SegmentReader:
    """Keeps read-only segments open across refreshes; picks up new, removed and replaced segments.

    A segment that errors is closed and opened afresh at the next refresh; one
    whose path now names another file (unlinked and recreated) is reopened."""

    def __init__(self, gpu_key: str | None = None, shm_dir: str | None = None) -> None:
        self.gpu_key = gpu_key
        self.shm_dir = shm_dir
        self._open: dict[str, Segment] = {}

    def read(self, now_us: int) -> tuple[list[GpuSnapshot], list[SegmentProblem]]:
        paths = list_segment_paths(self.shm_dir)
        if self.gpu_key is not None:
            paths = [p for p in paths if key_from_path(p) == self.gpu_key]
        for gone in set(self._open) - set(paths):
            self._drop(gone)
        gpus, errors = [], []
        for path in paths:
            try:
                gpus.append(self._snapshot(path, now_us))
            except SegmentError as e:
                self._drop(path)
                errors.append(SegmentProblem(_text(e.segment), e.why))
            except (OSError, ValueError) as e:
                self._drop(path)
                errors.append(SegmentProblem(_text("/" + path.rsplit("/", 1)[-1]), _text(str(e))))
        return gpus, errors

    def _snapshot(self, path: str, now_us: int) -> GpuSnapshot:
        seg = self._open.get(path)
        if seg is not None and seg.replaced():
            self._drop(path)
            seg = None
        if seg is None:
            seg = self._open[path] = Segment.attach_readonly(path)
        slots = seg.read_slots()
        st = seg.fstat()  # now: the owner may chmod/chown it at any time
        return build_gpu_snapshot(
            _text(seg.key),
            _text(seg.name),
            slots,
            now_us,
            owner=user_name(st.st_uid),
            owner_uid=st.st_uid,
            mode=stat.S_IMODE(st.st_mode),
        )

    def _drop(self, path: str) -> None:
        seg = self._open.pop(path, None)
        if seg is not None:
            seg.close()

    def close(self) -> None:
        for seg in self._open.values():
            seg.close()
        self._open.clear()
