"""Shared-memory segment I/O: create/attach (RW owner, RO observer), CAS, seqlock.

RW segments use real atomics on the shared words (the `atomics` package), the
same words C peers CAS. RO segments are never mapped: an observer reads them
with `pread` of an O_RDONLY fd, so it physically cannot write, and a segment
its (untrusted) owner shrinks under it gives a short read, never a SIGBUS.
A RW segment someone else can shrink (another user's group segment, or ours
with group write) is read and written the same way, `pread`/`pwrite` under the
seqlock; only the rare pid CAS (claim, leave) touches its mapping, right after
checking its size (see `Segment.exposed`).

Trust (spec §1a): every path is opened O_NOFOLLOW and checked with `fstat`
before use; a joiner only joins a segment that is ours and not writable by
others, or, when a sharing group was opted into, that group's and not
world-writable.
"""

from __future__ import annotations

import errno
import functools
import grp
import mmap
import os
import pwd
import stat
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..host.budgets import OWN_TORN_WAIT_S, OWN_TORN_WAITS, SEQLOCK_REREADS
from ..host.errors import GpushareError, UsageError
from . import abi

TYPE_CHECKING = False  # typing's, without importing typing: --once starts without it (issue 28)
if TYPE_CHECKING:
    from atomics.ctx import AtomicViewContext
    from atomics.view import AtomicIntegralView

SHM_DIR = "/dev/shm"
JOIN_WAIT_S = 1.0
GROUP_MODE = 0o660

_SEQS = struct.Struct("<I")


def _word(buf: bytes, off: int) -> int:
    return _SEQS.unpack_from(buf, off)[0]


def _consistent(before: bytes, slot: bytes, after: bytes, off: int) -> bool:
    """The slot copied between `before` and `after` (whole tables, the slot at `off`) is seqlock-consistent:
    an even seq, unchanged, and the copy's own seq the same (a slot zeroed and rewritten can bring an old
    seq back: ABA)."""
    seq = _word(before, off + abi.OFF_SEQ)
    return not seq & 1 and seq == _word(after, off + abi.OFF_SEQ) and _word(slot, abi.OFF_SEQ) == seq


@dataclass(frozen=True)
class SlotsRead:
    """A table read: every slot's record, and the slots never seen consistent (torn)."""

    slots: tuple[abi.SlotRecord, ...]
    torn: tuple[int, ...] = ()


class SegmentError(GpushareError):
    """A segment that cannot be used; the message names it and says why."""

    def __init__(self, segment: str, why: str) -> None:
        super().__init__(f"segment {segment}: {why}")
        self.segment = segment
        self.why = why


class UnknownGroupError(UsageError, ValueError):
    """A --share-group that names no group on this host."""


def shm_path(key: str) -> str:
    return os.path.join(SHM_DIR, abi.SEGMENT_PREFIX + key)


def key_from_path(path: str) -> str:
    return os.path.basename(path)[len(abi.SEGMENT_PREFIX) :]


def resolve_group(group: str | int) -> int:
    """gid of a group name (or a numeric gid); UnknownGroupError if there is none."""
    if isinstance(group, int):
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        if group.isdigit():
            return int(group)
        raise UnknownGroupError(f"unknown group {group!r} (--share-group / GPUSHARE_GROUP)") from None


@functools.lru_cache(maxsize=256)
def user_name(uid: int) -> str:
    """The user name of `uid`, or the uid as text when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _open_error(name: str, e: OSError) -> SegmentError:
    if e.errno == errno.ELOOP:
        return SegmentError(name, "is a symlink (not following it)")
    return SegmentError(name, f"cannot open: {e.strerror}")


def _file_kind(st: os.stat_result) -> str:
    m = st.st_mode
    if stat.S_ISFIFO(m):
        return "a FIFO"
    if stat.S_ISDIR(m):
        return "a directory"
    if stat.S_ISSOCK(m):
        return "a socket"
    if stat.S_ISCHR(m) or stat.S_ISBLK(m):
        return "a device"
    return "not a regular file"


def _check_regular(name: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise SegmentError(name, f"is {_file_kind(st)}, not a regular file")


def _check_trusted(name: str, st: os.stat_result, share_gid: int | None) -> None:
    """A joiner writes into the segment: refuse one others may write (or shrink) under us."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == os.geteuid() and not mode & 0o022:
        return
    if share_gid is not None and st.st_gid == share_gid and not mode & 0o002:
        return
    rule = "must be ours and not writable by others; or use --share-group"
    if share_gid is not None:
        rule = f"must be ours and not writable by others, or group {_group_name(share_gid)}'s and not world-writable"
    raise SegmentError(
        name, f"owned by {user_name(st.st_uid)} (uid {st.st_uid}), mode {mode:04o}: refusing to join ({rule})"
    )


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


class Segment:
    """A registry segment. Use `create_or_attach` (RW: mapped, atomics) or `attach_readonly` (RO: pread, no map)."""

    def __init__(self, path: str, fd: int, mm: mmap.mmap | None, st: os.stat_result) -> None:
        self.path = path
        self.key = key_from_path(path)
        self.name = "/" + os.path.basename(path)
        self.writable = mm is not None
        # Someone else may ftruncate it (its owner, or its group): a touch of a mapped page past a
        # shrunk end is a SIGBUS, so every read and write goes through pread/pwrite instead.
        self.exposed = st.st_uid != os.geteuid() or bool(stat.S_IMODE(st.st_mode) & 0o022)
        self._mapped_io = mm is not None and not self.exposed
        self._fd = fd
        self._mm = mm
        self._ident = (st.st_dev, st.st_ino)
        self._views: dict[tuple[int, int], tuple[AtomicViewContext, AtomicIntegralView]] = {}
        self._seq_incs: dict[int, Callable[[], object]] = {}  # slot offset -> its seq's increment (_increment)
        self._last_good: dict[int, bytes] = {}
        self._mv = memoryview(mm) if mm is not None else None
        try:
            self._header_raw = self._read(0, abi.HEADER_SIZE)
            self.header = abi.unpack_header(self._header_raw)
            problem = abi.header_problem(self.header, st.st_size)
            if problem:
                raise SegmentError(self.name, problem)
        except BaseException:
            self.close()
            raise

    # -- opening -----------------------------------------------------------

    @classmethod
    def create_or_attach(cls, key: str, mode: int = 0o600, share_group: str | int | None = None) -> Segment:
        """Create `/opencoti-gpu-<key>` (O_EXCL, magic last) or attach to a trusted existing one.

        With `share_group` (a name or gid) a new segment is given to that group,
        mode 0660, and an existing one of that group (not world-writable) is
        joined even when another user owns it. SegmentError otherwise."""
        abi.validate_gpu_key(key)
        path = shm_path(key)
        name = abi.segment_name(key)
        try:
            share_gid = None if share_group is None else resolve_group(share_group)
        except UnknownGroupError as e:
            raise SegmentError(name, str(e)) from None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        except FileExistsError:
            return cls._attach_existing(path, name, share_gid)
        except OSError as e:
            raise SegmentError(name, os.strerror(e.errno or 0)) from None
        step = "create"
        try:
            if share_gid is not None:
                step = f"give it to group {_group_name(share_gid)}"
                os.fchown(fd, -1, share_gid)
                os.fchmod(fd, GROUP_MODE)  # after the chown; the umask stripped the group bits at open
                step = "create"
            os.ftruncate(fd, abi.SEGMENT_SIZE)
            st = os.fstat(fd)
            mm = mmap.mmap(fd, abi.SEGMENT_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            os.close(fd)
            # Without its magic it could never become valid and would block every joiner.
            _unlink_quietly(path)
            raise SegmentError(name, f"cannot {step}: {e.strerror}") from None
        header = abi.pack_header()
        mm[8 : abi.HEADER_SIZE] = header[8:]
        mm[0:8] = header[:8]  # magic last: joiners wait for it
        return cls(path, fd, mm, st)

    @classmethod
    def _attach_existing(cls, path: str, name: str, share_gid: int | None) -> Segment:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except PermissionError as e:
            try:  # say whose it is when that is why
                _check_trusted(name, os.stat(path, follow_symlinks=False), share_gid)
            except OSError:
                pass
            raise _open_error(name, e) from None
        except OSError as e:
            raise _open_error(name, e) from None
        try:
            st = os.fstat(fd)
            _check_regular(name, st)
            _check_trusted(name, st, share_gid)
            deadline = time.monotonic() + JOIN_WAIT_S
            while True:
                st = os.fstat(fd)
                if st.st_size == abi.SEGMENT_SIZE and os.pread(fd, len(abi.MAGIC), 0) == abi.MAGIC:
                    break
                if time.monotonic() >= deadline:
                    if st.st_size != abi.SEGMENT_SIZE:
                        raise SegmentError(name, f"wrong size {st.st_size} (expected {abi.SEGMENT_SIZE})")
                    raise SegmentError(name, "bad magic (not an ABI v1 registry)")
                time.sleep(0.005)
            mm = mmap.mmap(fd, abi.SEGMENT_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            os.close(fd)
            raise SegmentError(name, f"cannot attach: {e.strerror}") from None
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, mm, st)

    @classmethod
    def attach_readonly(cls, path: str) -> Segment:
        """Open an existing segment read-only, never mapped (any owner; never hangs). Errors name the segment."""
        name = "/" + os.path.basename(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            raise _open_error(name, e) from None
        try:
            st = os.fstat(fd)
            _check_regular(name, st)
            if st.st_size != abi.SEGMENT_SIZE:
                raise SegmentError(name, f"wrong size {st.st_size} (expected {abi.SEGMENT_SIZE})")
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, None, st)

    def close(self) -> None:
        self._seq_incs.clear()  # they hold the mapping's addresses
        for ctx, _ in self._views.values():
            ctx.__exit__(None, None, None)
        self._views.clear()
        if self._mv is not None:
            self._mv.release()
            self._mv = None
        if self._mm is not None and not self._mm.closed:
            self._mm.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Segment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- identity ------------------------------------------------------------

    @property
    def ident(self) -> tuple[int, int]:
        """(st_dev, st_ino) of the file opened."""
        return self._ident

    def keep_last_good(self, store: dict[int, bytes]) -> None:
        """Keep the slots' last consistent copies in `store` (a reader's, from an earlier open of the same file)."""
        self._last_good = store

    def fstat(self) -> os.stat_result:
        """The open file's status now (owner, mode, size)."""
        return os.fstat(self._fd)

    def repair(self) -> None:
        """A writable segment shrunk under us (a group member truncated it): re-extend the file to its
        size and, where its header no longer reads as it did when we opened it, write that header back
        (magic last, as at creation), so every peer's next read sees a valid, empty segment in which each
        re-claims its slot (spec §4, eviction). SegmentError if the file was replaced or cannot be written."""
        if not self.writable:
            raise SegmentError(self.name, "cannot repair a segment opened read-only")
        if self.replaced():
            raise SegmentError(self.name, "replaced under us (not the file we joined)")
        try:
            if os.fstat(self._fd).st_size < abi.SEGMENT_SIZE:
                os.ftruncate(self._fd, abi.SEGMENT_SIZE)
            if os.pread(self._fd, abi.HEADER_SIZE, 0) != self._header_raw:
                magic = len(abi.MAGIC)
                os.pwrite(self._fd, self._header_raw[magic:], magic)
                os.pwrite(self._fd, self._header_raw[:magic], 0)
        except OSError as e:
            raise SegmentError(self.name, f"cannot repair: {e.strerror}") from None

    def replaced(self) -> bool:
        """True when the path no longer names the file we have open (unlinked, recreated or renamed over)."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self._ident

    # -- reading -----------------------------------------------------------

    @property
    def slot_count(self) -> int:
        return self.header.slot_count

    def slot_offset(self, index: int) -> int:
        return self.header.header_size + index * self.header.slot_size

    def _read(self, off: int, n: int) -> bytes:
        """n bytes at off: a slice of the mapping (RW, not exposed), or a pread that must not come up short."""
        if self._mapped_io:
            assert self._mm is not None
            return self._mm[off : off + n]
        try:
            buf = os.pread(self._fd, n, off)
        except OSError as e:
            raise SegmentError(self.name, f"cannot read: {e.strerror}") from None
        if len(buf) != n:
            size = os.fstat(self._fd).st_size
            raise SegmentError(self.name, f"shrunk under the reader: wrong size {size} (expected {abi.SEGMENT_SIZE})")
        return buf

    def slots_raw(self) -> bytes:
        """Every slot's bytes in one copy, not checked for consistency: a cheap "did anything
        change?" probe (equal bytes, an even seq in each: the same slots as a read_slots() of them)."""
        h = self.header
        return self._read(h.header_size, h.slot_count * h.slot_size)

    def read_slots(self) -> tuple[abi.SlotRecord, ...]:
        """All slots (read_slots_checked's records)."""
        return self.read_slots_checked().slots

    def read_slots_checked(self) -> SlotsRead:
        """All slots, each seqlock-consistent, and which were torn; microseconds whatever others wrote.

        The table is copied three times per round, at most 1 + SEQLOCK_REREADS rounds, with no sleep
        (a segment ours alone may wait a little: _torn_rounds);
        later rounds only decide the slots still torn. A slot whose pid word is 0 in every copy is free
        (never retried). A slot still torn after the rounds (a writer descheduled mid-write, or odd words
        written on purpose) is its last consistent copy if this segment ever gave one; else it is in
        `torn`, and its record is the torn copy for a writer (its claim CAS needs the pid it saw) and a
        free slot for a reader. RO: SegmentError if the file shrank or its header changed since opened.
        """
        h = self.header
        start, size = h.header_size, h.slot_size
        n = h.slot_count * size
        if not self._mapped_io and self._read(0, abi.HEADER_SIZE) != self._header_raw:
            raise SegmentError(self.name, "header changed under the reader (rewritten or truncated)")
        out: list[bytes | None] = [None] * h.slot_count
        pending: list[int] = list(range(h.slot_count))
        data = b""
        for _ in self._torn_rounds(lambda: bool(pending)):
            # Three separate copies: every seq in `before` is loaded before any byte of `data`,
            # every seq in `after` after it (one memcpy has no load order).
            before, data, after = self._read(start, n), self._read(start, n), self._read(start, n)
            still = []
            for i in pending:
                off = i * size
                buf = data[off : off + abi.SLOT_SIZE]
                if _consistent(before, buf, after, off):
                    out[i] = self._last_good[i] = buf
                elif not (_word(before, off + abi.OFF_PID) | _word(buf, abi.OFF_PID) | _word(after, off + abi.OFF_PID)):
                    out[i] = bytes(abi.SLOT_SIZE)  # free in every copy: nothing to show, nothing to retry
                else:
                    still.append(i)
            pending[:] = still
            if not pending:
                break
        torn = []
        for i in pending:
            if i in self._last_good:
                out[i] = self._last_good[i]
                continue
            torn.append(i)
            out[i] = data[i * size : i * size + abi.SLOT_SIZE] if self.writable else bytes(abi.SLOT_SIZE)
        return SlotsRead(tuple(abi.unpack_slot(i, b) for i, b in enumerate(out) if b is not None), tuple(torn))

    def _torn_rounds(self, still_torn: Callable[[], bool]) -> Iterator[int]:
        """The read rounds of a seqlock read: 1 + SEQLOCK_REREADS at once. A reader of a segment ours alone
        (only our own processes write it) then gets up to OWN_TORN_WAITS more, OWN_TORN_WAIT_S apart, while
        `still_torn()`: there a torn slot is a writer descheduled mid-write on a loaded box, not an attack.
        A segment others can write, and a writer's reads, never wait."""
        yield from range(1 + SEQLOCK_REREADS)
        if self.exposed or self.writable:  # a writer (the pacer) uses the torn copy: never wait there
            return
        for i in range(OWN_TORN_WAITS):
            if not still_torn():
                return
            time.sleep(OWN_TORN_WAIT_S)
            yield 1 + SEQLOCK_REREADS + i

    def read_slot(self, index: int) -> abi.SlotRecord:
        return abi.unpack_slot(index, self._read_slot_bytes(index))

    def _read_slot_bytes(self, index: int) -> bytes:
        """One slot, consistent if it is within 1 + SEQLOCK_REREADS tries (no sleep); else its last
        consistent copy, or (never seen consistent) the torn copy for a writer, a free slot for a reader."""
        off = self.slot_offset(index)
        buf = b""
        for _ in self._torn_rounds(lambda: True):
            before = self._read(off, abi.SLOT_SIZE)
            buf = self._read(off, abi.SLOT_SIZE)
            after = self._read(off, abi.SLOT_SIZE)
            if _consistent(before, buf, after, 0):
                self._last_good[index] = buf
                return buf
        if index in self._last_good:
            return self._last_good[index]
        return buf if self.writable else bytes(abi.SLOT_SIZE)

    # -- writing (RW only) -------------------------------------------------

    def _atomic(self, offset: int, width: int, signed: bool = False) -> AtomicIntegralView:
        view = self._views.get((offset, width))
        if view is None:
            if self._mv is None:
                raise PermissionError(f"segment {self.name} is mapped read-only")
            import atomics  # only writers need it (cffi): the headless reader path stays light

            atype = atomics.INT if signed else atomics.UINT
            ctx = atomics.atomicview(buffer=self._mv[offset : offset + width], atype=atype)
            view = (ctx, ctx.__enter__())
            self._views[(offset, width)] = view
        return view[1]

    def _check_size(self) -> None:
        """SegmentError unless the file still has its full size (exposed segments, before a write)."""
        size = os.fstat(self._fd).st_size
        if size != abi.SEGMENT_SIZE:
            raise SegmentError(self.name, f"shrunk under us: wrong size {size} (expected {abi.SEGMENT_SIZE})")

    def _pwrite(self, off: int, data: bytes) -> None:
        """Write `data` at `off` of an exposed segment (never through the mapping). A file shrunk
        between the size check and the write is extended, never a SIGBUS; its next read says so."""
        self._check_size()
        try:
            n = os.pwrite(self._fd, data, off)
        except OSError as e:
            raise SegmentError(self.name, f"cannot write: {e.strerror}") from None
        if n != len(data):
            raise SegmentError(self.name, f"short write ({n} of {len(data)} bytes)")

    def cas_pid(self, index: int, expected: int, desired: int) -> bool:
        """32-bit compare-and-swap on the slot's pid word. Exposed: the mapping is touched only
        after its size is checked (no syscall can CAS a file; claims and leaves are rare)."""
        word = self._atomic(self.slot_offset(index) + abi.OFF_PID, 4)
        if self.exposed:
            self._check_size()
        return word.cmpxchg_strong(expected=expected, desired=desired).success

    def store_heartbeat(self, index: int, heartbeat_us: int) -> None:
        """Atomic 64-bit store of heartbeat_us (used before a claim CAS)."""
        off = self.slot_offset(index) + abi.OFF_HEARTBEAT_US
        if self.exposed:
            self._pwrite(off, struct.pack("<q", heartbeat_us))
            return
        word = self._atomic(off, 8, signed=True)
        word.store(heartbeat_us)

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
        flags: int = 0,
        busy_total_us: int = 0,
    ) -> None:
        """Seqlock write of every field after seq (the owner's fields, Extension 1's included)."""
        if self._mv is None:
            raise PermissionError(f"segment {self.name} is mapped read-only")
        off = self.slot_offset(index)
        if self.exposed:
            # Only this slot's owner (us) writes its seq: pwrite of seq+1 (odd), the fields, seq+2.
            seq_now = _SEQS.unpack(self._read(off + abi.OFF_SEQ, 4))[0] & ~1
            fields = abi.OWNER_FIELDS_STRUCT.pack(
                boot_us, weight, active, heartbeat_us, busy_ppm, name_raw, flags, busy_total_us
            )
            self._pwrite(off + abi.OFF_SEQ, _SEQS.pack((seq_now + 1) & 0xFFFFFFFF))
            self._pwrite(off + abi.OFF_BOOT_US, fields)
            self._pwrite(off + abi.OFF_SEQ, _SEQS.pack((seq_now + 2) & 0xFFFFFFFF))
            return
        seq_inc = self._seq_incs.get(off)
        if seq_inc is None:
            seq_inc = self._seq_incs[off] = _increment(self._atomic(off + abi.OFF_SEQ, 4))
        seq_inc()  # odd: writing
        abi.OWNER_FIELDS_STRUCT.pack_into(
            self._mv,
            off + abi.OFF_BOOT_US,
            boot_us,
            weight,
            active,
            heartbeat_us,
            busy_ppm,
            name_raw,
            flags,
            busy_total_us,
        )
        seq_inc()  # even: done (seq_cst, a release)


def _increment(word: AtomicIntegralView) -> Callable[[], object]:
    """`word.fetch_add(1)` (seq_cst), as one foreign call: the atomics package's own function for it, called with
    buffers made once. Its public method wraps that call in ~100 lines of Python (buffer objects each time):
    7.6 µs warm, two per slot write, every DEMAND a request raises and drops. The public method where the
    package's internals are not the ones this was written for."""
    try:
        import ctypes

        from atomics._impl.enums import MemoryOrder, OpType

        core = word._core
        fetch_add = core.get_op_func(OpType.FETCH_ADD)
        address, width, order = core.address, core.width, MemoryOrder.SEQ_CST.value
    except (ImportError, AttributeError):
        fetch_add = None
    if fetch_add is None or width != 4 or not isinstance(address, int):
        return functools.partial(word.fetch_add, 1)
    one, old = ctypes.c_uint32(1), ctypes.c_uint32(0)  # the addend, the old value: the partial keeps them alive
    inc = functools.partial(fetch_add, address, ctypes.addressof(one), order, ctypes.addressof(old))
    inc.buffers = (one, old)  # type: ignore[attr-defined]
    return inc


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def list_segment_paths(shm_dir: str | None = None) -> list[str]:
    """Every `/opencoti-gpu-*` segment on this host, sorted by name."""
    return [path for path, _ in list_segments(shm_dir)]


def list_segments(shm_dir: str | None = None) -> list[tuple[str, int]]:
    """(path, inode number from readdir: no stat) of every `/opencoti-gpu-*` segment, sorted by name."""
    d = shm_dir or SHM_DIR
    try:
        with os.scandir(d) as it:
            found = [(e.path, e.inode()) for e in it if e.name.startswith(abi.SEGMENT_PREFIX)]
    except OSError as e:
        if e.errno == errno.ENOENT:
            return []
        raise
    return sorted(found)
