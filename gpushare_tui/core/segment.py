"""Shared-memory segment I/O: create/attach (RW owner, RO observer), CAS, seqlock.

RW segments use real atomics on the shared words (the `atomics` package), the
same words C peers CAS. RO segments are mapped PROT_READ from an O_RDONLY fd,
so an observer physically cannot write.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import time

import atomics

from . import abi

SHM_DIR = "/dev/shm"
JOIN_WAIT_S = 1.0
SEQLOCK_RETRIES = 8

_SEQS = struct.Struct("<I")


class SegmentError(Exception):
    """A segment that cannot be used; the message names it and says why."""

    def __init__(self, segment: str, why: str) -> None:
        super().__init__(f"segment {segment}: {why}")
        self.segment = segment
        self.why = why


def shm_path(key: str) -> str:
    return os.path.join(SHM_DIR, abi.SEGMENT_PREFIX + key)


def key_from_path(path: str) -> str:
    return os.path.basename(path)[len(abi.SEGMENT_PREFIX) :]


class Segment:
    """A mapped registry segment. Use `create_or_attach` or `attach_readonly`."""

    def __init__(self, path: str, fd: int, mm: mmap.mmap, writable: bool) -> None:
        self.path = path
        self.key = key_from_path(path)
        self.name = "/" + os.path.basename(path)
        self.writable = writable
        self._fd = fd
        self._mm = mm
        self._views: dict[tuple[int, int], tuple[object, object]] = {}
        self._last_good: dict[int, bytes] = {}
        self._mv = memoryview(mm) if writable else None
        self.header = abi.unpack_header(mm[: abi.HEADER_SIZE])
        problem = abi.header_problem(self.header, len(mm))
        if problem:
            self.close()
            raise SegmentError(self.name, problem)

    # -- opening -----------------------------------------------------------

    @classmethod
    def create_or_attach(cls, key: str, mode: int = 0o600) -> Segment:
        """Create `/opencoti-gpu-<key>` (O_EXCL, magic last) or attach to it."""
        abi.validate_gpu_key(key)
        path = shm_path(key)
        name = abi.segment_name(key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            return cls._attach_existing(path, name)
        except OSError as e:
            raise SegmentError(name, os.strerror(e.errno or 0)) from None
        try:
            os.ftruncate(fd, abi.SEGMENT_SIZE)
            mm = mmap.mmap(fd, abi.SEGMENT_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            header = abi.pack_header()
            mm[8 : abi.HEADER_SIZE] = header[8:]
            mm[0:8] = header[:8]  # magic last: joiners wait for it
        except OSError as e:
            os.close(fd)
            raise SegmentError(name, f"cannot create: {e.strerror}") from None
        return cls(path, fd, mm, writable=True)

    @classmethod
    def _attach_existing(cls, path: str, name: str) -> Segment:
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as e:
            raise SegmentError(name, f"cannot open: {e.strerror}") from None
        deadline = time.monotonic() + JOIN_WAIT_S
        while True:
            size = os.fstat(fd).st_size
            if size == abi.SEGMENT_SIZE:
                with open(path, "rb") as f:
                    if f.read(8) == abi.MAGIC:
                        break
            if time.monotonic() >= deadline:
                os.close(fd)
                if size != abi.SEGMENT_SIZE:
                    raise SegmentError(name, f"wrong size {size} (expected {abi.SEGMENT_SIZE})")
                raise SegmentError(name, "bad magic (not an ABI v1 registry)")
            time.sleep(0.005)
        mm = mmap.mmap(fd, abi.SEGMENT_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        return cls(path, fd, mm, writable=True)

    @classmethod
    def attach_readonly(cls, path: str) -> Segment:
        """Map an existing segment read-only; errors name the segment."""
        name = "/" + os.path.basename(path)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise SegmentError(name, f"cannot open: {e.strerror}") from None
        size = os.fstat(fd).st_size
        if size != abi.SEGMENT_SIZE:
            os.close(fd)
            raise SegmentError(name, f"wrong size {size} (expected {abi.SEGMENT_SIZE})")
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        return cls(path, fd, mm, writable=False)

    def close(self) -> None:
        for ctx, _ in self._views.values():
            ctx.__exit__(None, None, None)  # type: ignore[attr-defined]
        self._views.clear()
        if self._mv is not None:
            self._mv.release()
            self._mv = None
        if not self._mm.closed:
            self._mm.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Segment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -----------------------------------------------------------

    @property
    def slot_count(self) -> int:
        return self.header.slot_count

    def slot_offset(self, index: int) -> int:
        return self.header.header_size + index * self.header.slot_size

    def read_slots(self) -> tuple[abi.SlotRecord, ...]:
        """All slots, each seqlock-consistent (retry ≤ 8 times per slot).

        A slot still torn after the retries (its writer stalled mid-write) is
        reported as last read consistently; a torn copy only if there is none.
        """
        h = self.header
        start, size = h.header_size, h.slot_size
        end = start + h.slot_count * size
        # Three separate copies: every seq in `before` is loaded before any byte
        # of `data`, every seq in `after` after it (one memcpy has no load order).
        before = self._mm[start:end]
        data = self._mm[start:end]
        after = self._mm[start:end]
        out = []
        for i in range(h.slot_count):
            off = i * size
            buf = data[off : off + abi.SLOT_SIZE]
            seq_a = _SEQS.unpack_from(before, off + abi.OFF_SEQ)[0]
            seq_b = _SEQS.unpack_from(after, off + abi.OFF_SEQ)[0]
            if seq_a & 1 or seq_a != seq_b:
                buf = self._read_slot_bytes(i)
            else:
                self._last_good[i] = buf
            out.append(abi.unpack_slot(i, buf))
        return tuple(out)

    def read_slot(self, index: int) -> abi.SlotRecord:
        return abi.unpack_slot(index, self._read_slot_bytes(index))

    def _read_slot_bytes(self, index: int) -> bytes:
        off = self.slot_offset(index)
        seq_off = off + abi.OFF_SEQ
        buf = b""
        for attempt in range(SEQLOCK_RETRIES):
            seq_a = _SEQS.unpack_from(self._mm, seq_off)[0]
            buf = self._mm[off : off + abi.SLOT_SIZE]
            seq_b = _SEQS.unpack_from(self._mm, seq_off)[0]
            if not seq_a & 1 and seq_a == seq_b:
                self._last_good[index] = buf
                return buf
            # The writer may be descheduled mid-write: back off (≈6 ms in all).
            time.sleep(0 if attempt < 2 else 0.0001 * 2 ** (attempt - 2))
        # Still torn: the last consistent copy of this slot, if we ever had one.
        return self._last_good.get(index, buf)

    # -- writing (RW only) -------------------------------------------------

    def _atomic(self, offset: int, width: int, atype: type) -> object:
        view = self._views.get((offset, width))
        if view is None:
            if self._mv is None:
                raise PermissionError(f"segment {self.name} is mapped read-only")
            ctx = atomics.atomicview(buffer=self._mv[offset : offset + width], atype=atype)
            view = (ctx, ctx.__enter__())
            self._views[(offset, width)] = view
        return view[1]

    def cas_pid(self, index: int, expected: int, desired: int) -> bool:
        """32-bit compare-and-swap on the slot's pid word."""
        word = self._atomic(self.slot_offset(index) + abi.OFF_PID, 4, atomics.UINT)
        return word.cmpxchg_strong(expected=expected, desired=desired).success  # type: ignore[attr-defined]

    def store_pid(self, index: int, pid: int) -> None:
        self._atomic(self.slot_offset(index) + abi.OFF_PID, 4, atomics.UINT).store(pid)  # type: ignore[attr-defined]

    def store_heartbeat(self, index: int, heartbeat_us: int) -> None:
        """Atomic 64-bit store of heartbeat_us (used before a claim CAS)."""
        word = self._atomic(self.slot_offset(index) + abi.OFF_HEARTBEAT_US, 8, atomics.INT)
        word.store(heartbeat_us)  # type: ignore[attr-defined]

    def write_slot_fields(
        self,
        index: int,
        *,
        boot_us: int,
        weight: float,
        active: int,
        heartbeat_us: int,
        busy_ppm: int,
        name_raw: bytes,
    ) -> None:
        """Seqlock write of every field after seq (the owner's fields)."""
        if self._mv is None:
            raise PermissionError(f"segment {self.name} is mapped read-only")
        off = self.slot_offset(index)
        seq = self._atomic(off + abi.OFF_SEQ, 4, atomics.UINT)
        seq.fetch_add(1)  # type: ignore[attr-defined]  # odd: writing
        struct.pack_into(
            "<qfIqI48s", self._mm, off + abi.OFF_BOOT_US, boot_us, weight, active, heartbeat_us, busy_ppm, name_raw
        )
        seq.fetch_add(1)  # type: ignore[attr-defined]  # even: done (seq_cst, a release)


def list_segment_paths(shm_dir: str | None = None) -> list[str]:
    """Every `/opencoti-gpu-*` segment on this host, sorted by name."""
    d = shm_dir or SHM_DIR
    try:
        names = os.listdir(d)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return []
        raise
    return sorted(os.path.join(d, n) for n in names if n.startswith(abi.SEGMENT_PREFIX))
