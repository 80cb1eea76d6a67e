"""Immutable snapshots, built in-process from records and real segments (their JSON: test_golden.py)."""

from __future__ import annotations

import math
import os

import pytest

from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.observe.snapshot import GpuSnapshot, SegmentReader, build_gpu_snapshot, own_peer, runs_alone
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.registry.segment import Segment
from gpushare_tui.core.schedule import v1 as schedule
from testkit.shm import shm_file

NOW = 1_764_000_000_123_456


def rec(i: int, **kw: object) -> abi.SlotRecord:
    d: dict = dict(pid=100 + i, seq=2, boot_us=NOW - 10**7, weight=1.0, active=1, heartbeat_us=NOW - 250_000,
                   busy_ppm=0, name_raw=abi.encode_name(f"p{i}"))  # fmt: skip
    d.update(kw)
    return abi.SlotRecord(index=i, **d)


def test_snapshot_rows() -> None:
    slots = [
        rec(0, weight=2.0, busy_ppm=123_456),
        rec(1, pid=0),
        rec(2, weight=1.0),
        rec(3, active=0, weight=5.0),
        rec(4, heartbeat_us=NOW - 3_500_000),
        rec(5, weight=math.nan, name_raw=b"\xff\xfebad".ljust(48, b"\0")),
    ]
    snap = build_gpu_snapshot("k", "/opencoti-gpu-k", slots, NOW)
    assert isinstance(snap, GpuSnapshot)
    assert snap.period_ms == 120 and snap.gpu_key == "k" and snap.segment == "/opencoti-gpu-k"
    peers = {p.slot: p for p in snap.peers}
    assert sorted(peers) == [0, 2, 3, 4, 5]  # free slots are not peers
    assert peers[0].share_pct == pytest.approx(200 / 3) and peers[0].window_us == (0, 80_000)
    assert peers[0].busy_pct == pytest.approx(12.3456)
    assert peers[2].share_pct == pytest.approx(100 / 3) and peers[2].window_us == (80_000, 120_000)
    assert peers[3].share_pct == 0.0 and peers[3].window_us is None and not peers[3].active and peers[3].alive
    assert not peers[4].alive and peers[4].share_pct == 0.0 and peers[4].heartbeat_age_ms == 3500.0
    assert peers[5].weight is None and peers[5].name == "\ufffd\ufffdbad" and peers[5].share_pct == 0.0
    assert peers[0].heartbeat_age_ms == 250.0 and peers[0].boot_us == NOW - 10**7
    holder = schedule.holder_at(snap.period_ms * 1000, ((p.slot, p.window_us) for p in snap.peers), NOW)
    assert holder == (0 if NOW % 120_000 < 80_000 else 2)
    with pytest.raises(AttributeError):
        snap.period_ms = 1  # type: ignore[misc]  # immutable


def test_achieved_share_is_busy_time_among_members() -> None:
    """busy_i ÷ Σ busy over the schedule's members (model-independent), null for non-members."""
    slots = [
        rec(0, weight=2.0, busy_ppm=300_000),
        rec(1, weight=1.0, busy_ppm=100_000),
        rec(2, active=0, busy_ppm=500_000),  # idle: no member, its busy time not counted
        rec(3, heartbeat_us=NOW - 3_500_000, busy_ppm=900_000),  # dead: likewise
        rec(4, weight=1.0, busy_ppm=0),  # a member that did not run
    ]
    peers = {p.slot: p for p in build_gpu_snapshot("k", "/s", slots, NOW).peers}
    got = {i: p.achieved_pct for i, p in peers.items()}
    assert got == {0: pytest.approx(75.0), 1: pytest.approx(25.0), 2: None, 3: None, 4: 0.0}
    idle = build_gpu_snapshot("k", "/s", [rec(0, busy_ppm=0), rec(1, busy_ppm=0)], NOW)
    assert [p.achieved_pct for p in idle.peers] == [None, None]  # unknown, not 0/0


def test_window_share_is_what_the_floor_gives_beside_the_plain_share() -> None:
    """share_pct stays w ÷ Σw (what C peers report); window_pct is the window's share of the period, the
    10 % floor included (what the engine gets); None for a non-member, 100 for the only member."""
    floored = build_gpu_snapshot("k", "/s", [rec(0, weight=100.0), rec(1, weight=1.0), rec(2, active=0)], NOW)
    p = {x.slot: x for x in floored.peers}
    assert p[0].share_pct == pytest.approx(100 * 100 / 101) and p[0].window_pct == pytest.approx(90.0)
    assert p[1].share_pct == pytest.approx(100 / 101) and p[1].window_pct == pytest.approx(10.0)
    assert p[1].floor_lifted and not p[0].floor_lifted
    assert p[2].window_pct is None and not p[2].floor_lifted  # idle: no window
    w0, w1 = p[0].window_us, p[1].window_us
    assert w0 is not None and w1 is not None and floored.period_ms is not None
    assert (w1[1] - w1[0]) / (floored.period_ms * 1000) == pytest.approx(0.10, abs=0.01)  # the real window
    tiny = build_gpu_snapshot("k", "/s", [rec(0, weight=1.0), rec(1, weight=0.001)], NOW).peers
    assert [round(x.share_pct, 1) for x in tiny] == [99.9, 0.1] and [x.window_pct for x in tiny] == [
        pytest.approx(90.0), pytest.approx(10.0)
    ]  # fmt: skip
    plain = build_gpu_snapshot("k", "/s", [rec(0, weight=2.0), rec(1, weight=1.0)], NOW).peers
    assert [x.window_pct for x in plain] == [pytest.approx(x.share_pct) for x in plain]
    assert not any(x.floor_lifted for x in plain)
    solo = build_gpu_snapshot("k", "/s", [rec(0, weight=0.5)], NOW).peers[0]
    assert solo.window_pct == 100.0 and solo.share_pct == 100.0


def test_runs_alone_only_as_the_sole_member_with_no_other_peer_busy() -> None:
    """The solo reference of SPD% (core.rate) is measured only while nobody else runs: not beside another
    member, nor beside a live peer that is not (yet) a member but reports busy time."""
    assert runs_alone([rec(0), rec(1, active=0)], 0, NOW)  # the other is idle
    assert not runs_alone([rec(0), rec(1)], 0, NOW)  # sharing
    assert not runs_alone([rec(0), rec(1, active=0, busy_ppm=400_000)], 0, NOW)  # it works, not yet a member
    assert runs_alone([rec(0), rec(1, active=0, busy_ppm=10_000)], 0, NOW)  # 1 %: an idle process's noise
    assert runs_alone([rec(0, busy_ppm=900_000), rec(1, heartbeat_us=NOW - 10**7, busy_ppm=900_000)], 0, NOW)
    assert not runs_alone([rec(0, active=0), rec(1, active=0)], 0, NOW)  # not a member itself
    assert not runs_alone([rec(0)], None, NOW)


def test_heartbeat_age_never_negative() -> None:
    snap = build_gpu_snapshot("k", "/s", [rec(0, heartbeat_us=NOW + 5_000)], NOW)
    assert snap.peers[0].heartbeat_age_ms == 0
    assert snap.period_ms is None and snap.peers[0].share_pct == 100.0


def test_segment_reader_empty_and_missing_dirs(tmp_path) -> None:
    r = SegmentReader(shm_dir=str(tmp_path))
    assert r.read(wall_us()) == ([], [])
    r = SegmentReader(shm_dir=str(tmp_path / "missing"))
    assert r.read(wall_us()) == ([], [])


def test_segment_reader_reports_bad_segments_and_keeps_good_ones(tmp_path, gpu_key: str) -> None:
    good = tmp_path / "opencoti-gpu-good"
    bad = tmp_path / "opencoti-gpu-bad"
    short = tmp_path / "opencoti-gpu-short"
    unreadable = tmp_path / "opencoti-gpu-dir"
    body = bytearray(abi.pack_header() + bytes(4096 - 64))
    body[64 : 64 + 128] = abi.pack_slot(rec(0, heartbeat_us=wall_us()))
    good.write_bytes(bytes(body))
    bad.write_bytes(b"garbage!" + bytes(4088))
    short.write_bytes(b"OCGPU")
    unreadable.mkdir()
    reader = SegmentReader(shm_dir=str(tmp_path))
    try:
        gpus, errors = reader.read(wall_us())
        assert [g.gpu_key for g in gpus] == ["good"]
        assert gpus[0].peers[0].name == "p0" and gpus[0].peers[0].alive
        errs = {e.segment: e.error for e in errors}
        assert set(errs) == {"/opencoti-gpu-bad", "/opencoti-gpu-short", "/opencoti-gpu-dir"}
        assert "bad magic" in errs["/opencoti-gpu-bad"] and "wrong size 5" in errs["/opencoti-gpu-short"]
        # segments appear and disappear between refreshes
        good.unlink()
        gpus, _ = reader.read(wall_us())
        assert gpus == []
    finally:
        reader.close()
    # filtered by key
    with Segment.create_or_attach(gpu_key):
        pass
    reader = SegmentReader(gpu_key)
    try:
        gpus, errors = reader.read(wall_us())
        assert [g.gpu_key for g in gpus] == [gpu_key] and errors == []
    finally:
        reader.close()


def test_segment_reader_follows_live_changes_read_only(gpu_key: str) -> None:
    reader = SegmentReader(gpu_key)
    try:
        with Membership(gpu_key, 3.0, "live", heartbeat_s=3600) as m:
            before = open(shm_file(gpu_key), "rb").read()
            (g,) = reader.read(wall_us())[0]
            assert [(p.pid, p.weight, p.active) for p in g.peers] == [(os.getpid(), 3.0, False)]
            assert open(shm_file(gpu_key), "rb").read() == before  # observing writes nothing
            m.set_weight(4.0)
            m.mark_active()
            (g,) = reader.read(wall_us())[0]  # same mapping, new values
            assert [(p.weight, p.active, p.share_pct) for p in g.peers] == [(4.0, True, 100.0)]
            me = own_peer(m.key, m.read_slots(), m.slot, wall_us())
            assert me is not None and me.pid == os.getpid() and me.share_pct == 100.0
            assert own_peer(m.key, m.read_slots(), 15, wall_us()) is None
        (g,) = reader.read(wall_us())[0]
        assert g.peers == ()
    finally:
        reader.close()


def test_dead_peer_shows_not_alive(gpu_key: str) -> None:
    with Segment.create_or_attach(gpu_key) as seg:
        seg.cas_pid(3, seg.read_slot(3).pid, 4_000_001)
        now = wall_us()
        seg.write_slot_fields(3, boot_us=1, weight=1.0, active=1, heartbeat_us=now - 5_000_000, busy_ppm=0,
                              name_raw=abi.encode_name("ghost"))  # fmt: skip
        reader = SegmentReader(gpu_key)
        try:
            (g,) = reader.read(now)[0]
            (p,) = g.peers
            assert (p.slot, p.alive, p.share_pct, p.name) == (3, False, 0.0, "ghost")
            assert p.heartbeat_age_ms == pytest.approx(5000.0)
        finally:
            reader.close()
