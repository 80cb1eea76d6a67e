"""Registry membership: join / heartbeat / eviction / leave (spec §4)."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable

from ..host.budgets import SEGMENT_REPAIRS_PER_MIN_MAX
from ..host.clock import ClockUs, mono_us, wall_us
from ..host.errors import GpushareError
from ..host.lifecycle import termination_deferred
from . import abi
from .segment import Segment, SegmentError

HEARTBEAT_S = 0.5


class RegistryFullError(GpushareError, RuntimeError):
    def __init__(self, key: str, slot_count: int) -> None:
        super().__init__(f"registry full: {slot_count} live peers on {key}")


def _log_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Membership:
    """One slot owned on behalf of `pid` (default: this process).

    Thread-safe. The heartbeat thread also drops `active` 2 s after the last
    `mark_active()` and re-claims a slot if this one was evicted. `clock_us` (wall)
    stamps the shared fields; the 2 s activity window runs on `mono_us`.
    """

    def __init__(
        self,
        key: str,
        weight: float,
        name: str,
        *,
        pid: int | None = None,
        clock_us: ClockUs = wall_us,
        mono_us: ClockUs = mono_us,
        heartbeat_s: float = HEARTBEAT_S,
        log: Callable[[str], None] = _log_stderr,
        share_group: str | int | None = None,
        ext1: bool = False,
        interactive: bool = False,
    ) -> None:
        """`ext1`: implement Extension 1 (spec §7: the EXT1 bit; the owner must then publish DEMAND, or it is
        never scheduled under Extension 1); every engine kind of ours passes True (GpuShare, the supervisor).
        False (the default, for a bare Membership that publishes no DEMAND): a v1 owner (flags 0).
        `interactive`: latency class interactive, which starts holding PRIORITY (its budget unspent)."""
        self.key = abi.validate_gpu_key(key)
        self.share_group = share_group  # opt-in: join/create a segment of this group (spec §1a)
        self._weight = abi.parse_weight(weight)
        self._name_raw = abi.encode_name(name)
        self.pid = pid if pid is not None else os.getpid()
        self._clock = clock_us
        self._mono = mono_us
        self._heartbeat_s = heartbeat_s
        self._log = log
        self.boot_us = clock_us()
        self._lock = threading.RLock()
        self._active = 0
        self._last_active_us = 0  # mono_us
        self._busy_ppm = 0
        self._flags = 0  # Extension 1 (§7) FLAG_* bits; 0: a v1 owner
        if interactive:
            ext1 = True  # a latency class is Extension 1's
        if ext1:
            self._flags = abi.FLAG_EXT1 | (abi.FLAG_INTERACTIVE | abi.FLAG_PRIORITY if interactive else 0)
        self._busy_total_us = 0  # Extension 1 (§7): busy µs since the join
        self._slot: int | None = None
        self._segment: Segment | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: SegmentError | None = None  # why the segment became unusable under us (shrunk by another user)
        self._repairs_mono_us: list[int] = []  # when we re-extended a shrunk segment (SEGMENT_REPAIRS_PER_MIN_MAX)
        self._lost_said = False

    # -- lifecycle ---------------------------------------------------------

    def join(self) -> int:
        """Open the segment, claim a slot, start heartbeating. Returns the slot.
        A SIGTERM/SIGHUP meanwhile exits only once `leave` is registered."""
        with termination_deferred():
            with self._lock:
                if self._segment is None:
                    self._segment = Segment.create_or_attach(self.key, share_group=self.share_group)
                try:
                    self._slot = self._claim()
                except RegistryFullError:
                    self._segment.close()  # don't leak the mapping (and its atomic views) of a failed join
                    self._segment = None
                    raise
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._heartbeat_loop, name="gpushare-heartbeat", daemon=True)
                self._thread.start()
            atexit.register(self.leave)
            return self._slot

    def _claim(self) -> int:
        seg = self._segment
        assert seg is not None
        for rec in seg.read_slots():
            now = self._clock()
            if rec.is_alive(now):
                continue
            seg.store_heartbeat(rec.index, now)
            if not seg.cas_pid(rec.index, rec.pid, self.pid):
                continue
            self._slot = rec.index
            self._active = 0
            self._write(now)
            return rec.index
        raise RegistryFullError(self.key, seg.slot_count)

    def leave(self) -> None:
        """Clean exit (spec "Leave"). Idempotent; safe from atexit and signals."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        with self._lock, termination_deferred():
            seg, slot = self._segment, self._slot
            if seg is None:
                return
            try:
                if slot is not None and self.lost is None and self._still_mine(slot):
                    seg.write_slot_fields(
                        slot,
                        boot_us=self.boot_us,
                        weight=self._weight,
                        active=0,
                        heartbeat_us=0,
                        busy_ppm=0,
                        name_raw=self._name_raw,
                        busy_total_us=self._busy_total_us,
                    )
                    seg.cas_pid(slot, self.pid, 0)
            except SegmentError as e:  # shrunk under us: nothing left to clear
                self.lost = self.lost or e  # leaving: not repaired
            self._slot = None
            self._segment = None
            seg.close()
        atexit.unregister(self.leave)

    def __enter__(self) -> Membership:
        if self._slot is None:
            self.join()
        return self

    def __exit__(self, *exc: object) -> None:
        self.leave()

    # -- state -------------------------------------------------------------

    @property
    def slot(self) -> int | None:
        return self._slot

    @property
    def segment(self) -> Segment:
        if self._segment is None:
            raise RuntimeError("not joined")
        return self._segment

    @property
    def weight(self) -> float:
        return self._weight

    @property
    def active(self) -> bool:
        return bool(self._active)

    def read_slots(self) -> tuple[abi.SlotRecord, ...]:
        """Every slot of our segment, () when not joined or `lost`. Safe from any thread: `leave()` unmaps
        the segment under the same lock, and a read of an unmapped segment is a SIGSEGV, not an error."""
        with self._lock:
            if self._segment is None or self.lost is not None:
                return ()
            try:
                return self._segment.read_slots()
            except SegmentError as e:
                if self.recover(e):
                    return self._segment.read_slots()
                return ()

    def slots_raw(self) -> tuple[bytes, int] | None:
        """Every slot's bytes in one unchecked copy (Segment.slots_raw: a cheap look at other slots' words, no
        seqlock) and the slot size; None when not joined, `lost`, or the read fails (a shrunk segment: the next
        full read repairs it). Safe from any thread (read_slots says why the lock)."""
        with self._lock:
            if self._segment is None or self.lost is not None:
                return None
            try:
                return self._segment.slots_raw(), self._segment.header.slot_size
            except SegmentError:
                return None

    def peers_alive(self) -> int:
        now = self._clock()
        return sum(1 for r in self.read_slots() if r.is_alive(now))

    def set_weight(self, weight: float) -> float:
        """Validate (finite, > 0), store as f32 in our slot; returns the stored value."""
        w = abi.parse_weight(weight)
        with self._lock:
            self._weight = w
            self._write_if_joined()
        return w

    def set_busy_ppm(self, ppm: int, publish: bool = False) -> None:
        """Store the busy fraction (ppm); it is written at the next heartbeat, or now if `publish`."""
        self._busy_ppm = max(0, min(1_000_000, int(ppm)))
        if publish:
            with self._lock:
                self._write_if_joined()

    @property
    def flags(self) -> int:
        """The Extension 1 flags we publish (abi.FLAG_*; 0 for a v1 owner)."""
        return self._flags

    def set_flags(self, flags: int, publish: bool = True) -> None:
        """Store the Extension 1 flags; written now if they changed and `publish` (DEMAND must be
        stored at once, spec §7), else at the next heartbeat."""
        if flags & ~abi.FLAGS_KNOWN:
            raise ValueError(f"unknown flag bits {flags & ~abi.FLAGS_KNOWN:#x}")
        with self._lock:
            changed, self._flags = flags != self._flags, flags
            if changed and publish:
                self._write_if_joined()

    def set_demand(self, demand: bool) -> None:
        """Publish DEMAND (work in flight now) at once when it changes (spec §7). Twice a request through a front
        proxy: set_flags' checks of what it is given are left out (one known bit)."""
        with self._lock:
            flags = self._flags | abi.FLAG_DEMAND if demand else self._flags & ~abi.FLAG_DEMAND
            if flags != self._flags:
                self._flags = flags
                self._write_if_joined()

    def set_interactive(self, interactive: bool) -> None:
        """Publish the latency class (INTERACTIVE set: interactive; clear: batch) at once (spec §7). Becoming
        interactive does not claim PRIORITY: the owner's hysteresis (`set_priority`) does, from its busy."""
        with self._lock:
            bit = abi.FLAG_INTERACTIVE
            self.set_flags(self._flags | bit if interactive else self._flags & ~(bit | abi.FLAG_PRIORITY))

    def set_users(self, verified: bool) -> bool:
        """Publish USERS (Extension 2, spec §8.2: we verified every other alive slot's user) at once when it
        changes; an owner without EXT1 never sets it. True when the bit changed."""
        with self._lock:
            want = verified and bool(self._flags & abi.FLAG_EXT1)
            flags = self._flags | abi.FLAG_USERS if want else self._flags & ~abi.FLAG_USERS
            changed = flags != self._flags
            self.set_flags(flags)
            return changed

    @property
    def interactive(self) -> bool:
        return bool(self._flags & abi.FLAG_INTERACTIVE)

    @property
    def demand(self) -> bool:
        return bool(self._flags & abi.FLAG_DEMAND)

    @property
    def priority(self) -> bool:
        return bool(self._flags & abi.FLAG_PRIORITY)

    def set_priority(self, priority: bool, busy_ppm: int | None = None) -> None:
        """Publish PRIORITY (interactive owners only; a batch owner's stays clear) at once when it changes,
        together with `busy_ppm` (the busy it was judged on) in the same seqlock write: a reader never sees
        a new bit beside an older busy (spec §7)."""
        with self._lock:
            want = priority and self.interactive
            flags = self._flags | abi.FLAG_PRIORITY if want else self._flags & ~abi.FLAG_PRIORITY
            if busy_ppm is not None:
                self._busy_ppm = max(0, min(1_000_000, int(busy_ppm)))
            self.set_flags(flags)

    @property
    def busy_total_us(self) -> int:
        return self._busy_total_us

    def add_busy_us(self, us: int) -> None:
        """Count `us` of busy time into `busy_total_us` (written at the next heartbeat); never decreases."""
        if us > 0:
            with self._lock:
                self._busy_total_us += int(us)

    @property
    def last_active_us(self) -> int | None:
        """When the last decode/prefill step was marked (mono µs); None before the first."""
        return self._last_active_us or None

    def mark_active(self, mono_now_us: int | None = None) -> None:
        """A decode/prefill step happened (at `mono_now_us`, default now): raise `active` at once if it was down."""
        self._last_active_us = self._mono() if mono_now_us is None else mono_now_us
        if not self._active:
            with self._lock:
                self._active = 1
                self._write_if_joined()

    def mark_idle(self) -> None:
        """Drop `active` now (e.g. the engine was seen idle)."""
        with self._lock:
            if self._active:
                self._active = 0
                self._write_if_joined()

    # -- internals ---------------------------------------------------------

    def _write_if_joined(self, now: int | None = None) -> None:
        if self._slot is not None and self._segment is not None and self.lost is None:
            try:
                self._write(self._clock() if now is None else now)
            except SegmentError as e:  # shrunk under us: re-extended, or the pacer or supervisor says so, once
                self.recover(e)

    def _write(self, now: int) -> None:
        assert self._segment is not None and self._slot is not None
        self._segment.write_slot_fields(
            self._slot,
            boot_us=self.boot_us,
            weight=self._weight,
            active=self._active,
            heartbeat_us=now,
            busy_ppm=self._busy_ppm,
            name_raw=self._name_raw,
            flags=self._flags,
            busy_total_us=self._busy_total_us,
        )

    def recover(self, e: SegmentError) -> bool:
        """The segment failed under us (`e`: a group member shrank it). Re-extend it and re-claim a slot,
        saying so in one line, at most SEGMENT_REPAIRS_PER_MIN_MAX times a minute; True when that worked.
        Otherwise `lost` is set: the engine carries on unpaced (the pacer and the supervisor say so once)."""
        with self._lock:
            seg = self._segment
            if seg is None or self.lost is not None:
                return False
            now = self._mono()
            self._repairs_mono_us = [t for t in self._repairs_mono_us if now - t < 60_000_000]
            if len(self._repairs_mono_us) >= SEGMENT_REPAIRS_PER_MIN_MAX:
                self.lost = SegmentError(seg.name, f"{e.why}; shrunk {len(self._repairs_mono_us)} times in a minute")
                return False
            self._repairs_mono_us.append(now)
            old = self._slot
            try:
                seg.repair()
                self._slot = None
                new = self._claim()
            except (SegmentError, RegistryFullError) as e2:
                self._slot = old
                self.lost = SegmentError(seg.name, f"{e.why}; {getattr(e2, 'why', e2)}")
                return False
            self._log(f"gpushare-tui: segment {seg.name}: {e.why}; re-extended it and re-claimed slot {new}")
            return True

    def say_lost_once(self) -> bool:
        """When `lost`: one line, the first time (the engine carries on unpaced); True when it is lost."""
        with self._lock:
            if self.lost is None:
                return False
            if not self._lost_said:
                self._lost_said = True
                self._log(f"gpushare-tui: {self.lost}; running unpaced from now on")
            return True

    def _still_mine(self, slot: int) -> bool:
        rec = self.segment.read_slot(slot)
        return rec.pid == self.pid and rec.boot_us == self.boot_us

    def heartbeat(self) -> None:
        """One heartbeat (the thread calls this every ~500 ms). An evicted member
        re-claims a slot, retrying at every heartbeat while the registry is full."""
        with self._lock:
            if self._segment is None or self.lost is not None:
                return
            try:
                self._heartbeat_locked()
            except SegmentError as e:  # shrunk under us: re-extended and re-claimed, or lost (unpaced)
                self.recover(e)

    def _heartbeat_locked(self) -> None:
        now = self._clock()
        if self._active and self._mono() - self._last_active_us > abi.ACTIVITY_WINDOW_US:
            self._active = 0
            self._busy_ppm = 0
        if self._slot is not None and self._still_mine(self._slot):
            self._write(now)
            return
        old = self._slot
        self._slot = None
        try:
            new = self._claim()
        except RegistryFullError as e:
            if old is not None:
                self._log(f"gpushare-tui: evicted from {self.segment.name} slot {old}; re-join failed: {e}; retrying")
            return
        lost = f"slot {old}" if old is not None else "no slot"
        self._log(f"gpushare-tui: evicted from {self.segment.name} {lost}; re-joined slot {new}")

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            try:
                self.heartbeat()
            except Exception as e:  # keep heartbeating through transient errors
                self._log(f"gpushare-tui: heartbeat error: {e}")
