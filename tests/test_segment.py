"""Segment I/O (spec §1, §4): create/attach, the joiner's wait, refusing bad segments, RO maps, seqlock."""

from __future__ import annotations

import functools
import os
import stat
import struct
import sys
import threading
import time

import pytest

from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.segment import Segment, SegmentError, list_segment_paths, shm_path
from testkit.shm import shm_file


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _header(magic: bytes = abi.MAGIC, version: int = 1, count: int = 16, ssize: int = 128, hsize: int = 64) -> bytes:
    return abi.HEADER_STRUCT.pack(magic, version, count, ssize, hsize)


# -- create / attach ---------------------------------------------------------


def test_create_writes_header_with_magic(gpu_key: str) -> None:
    with Segment.create_or_attach(gpu_key) as seg:
        assert seg.writable and seg.key == gpu_key and seg.name == f"/opencoti-gpu-{gpu_key}"
        assert seg.path == shm_file(gpu_key) == shm_path(gpu_key)
        data = _bytes(seg.path)
        assert len(data) == 4096
        assert data[:64] == abi.pack_header()
        assert data[64:] == b"\0" * (4096 - 64)  # every slot free
        assert stat.S_IMODE(os.stat(seg.path).st_mode) == 0o600
        assert all(r.pid == 0 for r in seg.read_slots())
        assert len(seg.read_slots()) == 16
    assert os.path.exists(shm_file(gpu_key))  # nobody unlinks on exit


def test_second_opener_attaches_and_shares_memory(gpu_key: str) -> None:
    with Segment.create_or_attach(gpu_key) as a:
        assert a.cas_pid(2, 0, 777)
        with Segment.create_or_attach(gpu_key) as b:
            assert b.writable
            assert b.read_slot(2).pid == 777
            b.write_slot_fields(
                2, boot_us=5, weight=1.5, active=1, heartbeat_us=6, busy_ppm=7, name_raw=abi.encode_name("shared")
            )
            assert not b.cas_pid(2, 0, 778)  # CAS fails on a taken slot
            assert b.read_slot(2).pid == 777
        rec = a.read_slot(2)
        assert (rec.boot_us, rec.weight, rec.active, rec.heartbeat_us, rec.busy_ppm, rec.name) == (
            5,
            1.5,
            1,
            6,
            7,
            "shared",
        )
        assert rec.seq == 2  # one seqlock write: odd then even


def test_joiner_waits_for_magic_written_last(gpu_key: str) -> None:
    path = shm_file(gpu_key)
    _write_file(path, b"\0" * 4096)  # a creator that has truncated but not yet written the header

    def finish_creation() -> None:
        time.sleep(0.2)
        with open(path, "r+b") as f:
            f.seek(8)
            f.write(abi.pack_header()[8:])
            f.seek(0)
            f.write(abi.MAGIC)

    t = threading.Thread(target=finish_creation)
    t0 = time.monotonic()
    t.start()
    try:
        with Segment.create_or_attach(gpu_key) as seg:
            waited = time.monotonic() - t0
            assert seg.header.version == 1
    finally:
        t.join()
    assert 0.15 <= waited < 1.0  # it waited for the magic, and took it as soon as it was there


@pytest.mark.slow
def test_joiner_gives_up_after_one_second_and_never_overwrites(gpu_key: str) -> None:
    path = shm_file(gpu_key)
    _write_file(path, b"\0" * 4096)
    t0 = time.monotonic()
    with pytest.raises(SegmentError) as ei:
        Segment.create_or_attach(gpu_key)
    waited = time.monotonic() - t0
    assert 0.9 <= waited < 3.0
    assert f"/opencoti-gpu-{gpu_key}" in str(ei.value)
    assert "magic" in str(ei.value)
    assert ei.value.segment == f"/opencoti-gpu-{gpu_key}"
    assert _bytes(path) == b"\0" * 4096


def _random_not_magic() -> bytes:
    data = os.urandom(4096)
    return data if data[:8] != abi.MAGIC else b"X" + data[1:]


def _corrupt_cases() -> list[tuple[str, bytes, str]]:
    good = _header() + b"\0" * (4096 - 64)
    return [
        ("badmagic", b"NOTOCGPU" + good[8:], "bad magic"),
        ("badversion", _header(version=2) + b"\0" * (4096 - 64), "unsupported version 2"),
        ("small", good[:100], "wrong size 100"),
        ("big", good + b"\0" * 4096, "wrong size 8192"),
        ("empty", b"", "wrong size 0"),
        ("random", _random_not_magic(), "bad magic"),
        ("toolarge-layout", _header(count=40) + b"\0" * (4096 - 64), "exceeds segment size"),
        ("zero-slots", _header(count=0) + b"\0" * (4096 - 64), "bad layout"),
    ]


@pytest.mark.parametrize(("tag", "data", "why"), _corrupt_cases(), ids=[c[0] for c in _corrupt_cases()])
def test_bad_segment_refused_by_observer_unmodified(tag: str, data: bytes, why: str, gpu_key: str) -> None:
    path = shm_file(gpu_key)
    _write_file(path, data)
    with pytest.raises(SegmentError) as ei:
        Segment.attach_readonly(path)
    assert f"/opencoti-gpu-{gpu_key}" in str(ei.value)
    assert why in str(ei.value)
    assert _bytes(path) == data


@pytest.mark.slow
@pytest.mark.parametrize("tag", ["badversion", "small", "random", "toolarge-layout"])
def test_bad_segment_refused_by_joiner_unmodified(tag: str, gpu_key: str) -> None:
    _, data, why = next(c for c in _corrupt_cases() if c[0] == tag)
    path = shm_file(gpu_key)
    _write_file(path, data)
    before = os.stat(path)
    with pytest.raises(SegmentError) as ei:
        Segment.create_or_attach(gpu_key)
    assert f"/opencoti-gpu-{gpu_key}" in str(ei.value)
    assert why in str(ei.value) or (tag == "random" and "magic" in str(ei.value))
    assert _bytes(path) == data
    assert os.stat(path).st_size == before.st_size


def test_missing_segment_is_an_error_naming_it(gpu_key: str) -> None:
    with pytest.raises(SegmentError, match=f"/opencoti-gpu-{gpu_key}"):
        Segment.attach_readonly(shm_file(gpu_key))


def test_reader_uses_layout_from_header(gpu_key: str) -> None:
    # a later version may grow the header and slots; ABI-v1 fields stay at the same offsets
    hsize, ssize = 128, 192
    buf = bytearray(4096)
    buf[:64] = _header(hsize=hsize, ssize=ssize)
    rec = abi.SlotRecord(2, 4242, 4, 99, 3.0, 1, 1234, 500_000, abi.encode_name("grown"))
    off = hsize + 2 * ssize
    buf[off : off + 128] = abi.pack_slot(rec)
    path = shm_file(gpu_key)
    _write_file(path, bytes(buf))
    with Segment.attach_readonly(path) as seg:
        slots = seg.read_slots()
        assert len(slots) == 16
        assert slots[2] == rec
        assert seg.read_slot(2) == rec
        assert [r.pid for r in slots] == [0, 0, 4242] + [0] * 13


# -- read-only mapping --------------------------------------------------------


def test_readonly_attach_cannot_write(gpu_key: str) -> None:
    with Segment.create_or_attach(gpu_key) as rw:
        rw.cas_pid(0, 0, 1234)
        rw.write_slot_fields(
            0, boot_us=1, weight=1.0, active=1, heartbeat_us=2, busy_ppm=3, name_raw=abi.encode_name("owner")
        )
    path = shm_file(gpu_key)
    before = _bytes(path)
    with Segment.attach_readonly(path) as ro:
        assert not ro.writable
        assert ro._mm is None  # never mapped (spec §1a): read with pread, so a shrunk file cannot SIGBUS us
        with pytest.raises(PermissionError, match="read-only"):
            ro.write_slot_fields(
                0, boot_us=9, weight=9.0, active=0, heartbeat_us=9, busy_ppm=9, name_raw=abi.encode_name("thief")
            )
        with pytest.raises(PermissionError):
            ro.cas_pid(0, 1234, 1)
        with pytest.raises(PermissionError):
            ro.store_heartbeat(0, 5)
        assert ro.read_slot(0).name == "owner"
    assert _bytes(path) == before


def test_list_segment_paths(tmp_path, gpu_key: str) -> None:
    assert list_segment_paths(str(tmp_path / "nope")) == []
    (tmp_path / "opencoti-gpu-b").write_bytes(b"")
    (tmp_path / "opencoti-gpu-a").write_bytes(b"")
    (tmp_path / "other").write_bytes(b"")
    assert list_segment_paths(str(tmp_path)) == [str(tmp_path / "opencoti-gpu-a"), str(tmp_path / "opencoti-gpu-b")]
    with Segment.create_or_attach(gpu_key):
        assert shm_file(gpu_key) in list_segment_paths()


# -- seqlock --------------------------------------------------------------------

WRITER = r"""
import sys, time
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.segment import Segment

key, duration = sys.argv[1], float(sys.argv[2])
slots = [int(x) for x in sys.argv[3].split(",")]
seg = Segment.create_or_attach(key)
for s in slots:
    assert seg.cas_pid(s, 0, 100 + s)

def write(s, n):
    seg.write_slot_fields(s, boot_us=n, weight=float(n % 1000 + 1), active=n & 1, heartbeat_us=3 * n,
                          busy_ppm=n % 1_000_003, name_raw=(f"n{n:023d}" * 2).encode())

n = 1
for s in slots:
    write(s, n)
print("ready", flush=True)
t_end = time.monotonic() + duration
while time.monotonic() < t_end:
    n += 1
    for s in slots:
        write(s, n)
seg.close()
print(n, flush=True)
"""


def _consistent(r: abi.SlotRecord) -> bool:
    """One write's fields, or a free slot: what a reader shows before it has ever read the slot
    consistently (its writer rewrote it during every re-read, as this one does in a tight loop)."""
    if r == abi.unpack_slot(r.index, bytes(abi.SLOT_SIZE)):
        return True
    n = r.boot_us
    return (
        r.heartbeat_us == 3 * n
        and r.weight == float(n % 1000 + 1)
        and r.active == n & 1
        and r.busy_ppm == n % 1_000_003
        and r.name_raw == (f"n{n:023d}" * 2).encode()
        and r.seq % 2 == 0
    )


@pytest.mark.slow
def test_seqlock_reader_never_sees_a_torn_slot(gpu_key: str, procs) -> None:
    slots = [0, 7, 15]  # first, middle and last slot (the last is the tail of the bulk copy)
    with Segment.create_or_attach(gpu_key):
        pass
    w = procs.start([sys.executable, "-c", WRITER, gpu_key, "2.0", ",".join(map(str, slots))])
    assert w.stdout.readline().strip() == "ready"
    torn: list[abi.SlotRecord] = []
    seen: set[int] = set()
    reads = 0
    with Segment.attach_readonly(shm_file(gpu_key)) as seg:
        while w.poll() is None:
            for r in seg.read_slots():
                if r.index in slots:
                    reads += 1
                    seen.add(r.boot_us)
                    if not _consistent(r):
                        torn.append(r)
            for s in slots:
                r = seg.read_slot(s)
                reads += 1
                seen.add(r.boot_us)
                if not _consistent(r):
                    torn.append(r)
    out, err = w.communicate()
    assert w.returncode == 0, err
    writes = int(out.strip())
    assert torn == []
    assert reads > 5_000
    assert writes > 5_000
    assert len(seen) > 100  # the reader really raced the writer (fewer on a loaded box)


def test_seqlock_retry_returns_last_consistent_copy_while_writer_stalls(gpu_key: str) -> None:
    with Segment.create_or_attach(gpu_key) as rw, Segment.attach_readonly(shm_file(gpu_key)) as ro:
        rw.cas_pid(4, 0, 55)
        rw.write_slot_fields(
            4, boot_us=10, weight=2.0, active=1, heartbeat_us=30, busy_ppm=0, name_raw=abi.encode_name("good")
        )
        good = ro.read_slot(4)
        assert good.boot_us == 10
        # a writer stalled mid-write: seq odd, fields half written
        off = rw.slot_offset(4)
        rw._mm[off + abi.OFF_SEQ : off + abi.OFF_SEQ + 4] = struct.pack("<I", good.seq + 1)
        rw._mm[off + abi.OFF_BOOT_US : off + abi.OFF_BOOT_US + 8] = struct.pack("<q", 11)
        t0 = time.monotonic()
        again = ro.read_slot(4)
        assert time.monotonic() - t0 < 0.5
        assert again == good
        assert ro.read_slots()[4] == good
        # the writer finishes: the new value is read
        rw._mm[off + abi.OFF_SEQ : off + abi.OFF_SEQ + 4] = struct.pack("<I", good.seq + 2)
        assert ro.read_slot(4).boot_us == 11
        assert ro.read_slots()[4].boot_us == 11


def test_a_slot_write_moves_its_seq_by_two_in_one_foreign_call_each(gpu_key: str) -> None:
    """The seqlock's increments are the atomics package's own fetch-add, called directly (its public method costs
    ~7.6 µs of Python each, two per slot write: every DEMAND a request raises and drops): the seq goes odd, then
    even, +2 a write, wrapping at 2**32 like a C peer's u32; where the package's internals differ, its public
    method does the same."""
    from gpushare_tui.core.registry.segment import _increment

    fields = dict(boot_us=1, weight=1.0, active=0, heartbeat_us=2, busy_ppm=0, name_raw=b"x", flags=0, busy_total_us=0)
    with Segment.create_or_attach(gpu_key) as seg:
        assert seg.cas_pid(5, 0, os.getpid())
        seq_at = seg.slot_offset(5) + abi.OFF_SEQ
        for n in range(1, 4):
            seg.write_slot_fields(5, **fields)  # type: ignore[arg-type]
            assert seg.read_slot(5).seq == 2 * n
        inc = seg._seq_incs[seg.slot_offset(5)]
        assert isinstance(inc, functools.partial) and hasattr(inc, "buffers"), inc  # the direct call, not the fallback
        struct.pack_into("<I", seg._mm, seq_at, 2**32 - 2)  # type: ignore[arg-type]
        seg.write_slot_fields(5, **fields)  # type: ignore[arg-type]
        assert seg.read_slot(5).seq == 0

        class Bare:  # an atomics view without the internals this was written for
            def __init__(self) -> None:
                self.value = 7

            def fetch_add(self, n: int) -> int:
                self.value += n
                return self.value - n

        bare = Bare()
        fallback = _increment(bare)  # type: ignore[arg-type]
        fallback()
        assert bare.value == 8
