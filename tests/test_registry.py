"""Registry membership (spec §4): join, heartbeat, eviction, weights, activity, leave, races, crashes."""

from __future__ import annotations

import math
import os
import signal
import sys
import time

import pytest

from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.observe.snapshot import SegmentReader
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.membership import Membership, RegistryFullError
from gpushare_tui.core.registry.segment import Segment
from testkit.cli import cli_argv
from testkit.shm import shm_file
from testkit.wait import wait_for

FAKE_PID = 3_999_000  # above any real pid here; liveness is by heartbeat, never by pid


class FakeClock:
    def __init__(self, t: int | None = None) -> None:
        self.t = wall_us() if t is None else t

    def __call__(self) -> int:
        return self.t

    def advance(self, us: int) -> None:
        self.t += us


def _ro(key: str) -> Segment:
    return Segment.attach_readonly(shm_file(key))


def test_join_writes_slot_and_leave_clears_it(gpu_key: str) -> None:
    before = wall_us()
    m = Membership(gpu_key, 1.5, "alpha", heartbeat_s=3600)
    slot = m.join()
    try:
        assert slot == 0 and m.slot == 0
        with _ro(gpu_key) as ro:
            r = ro.read_slot(slot)
            assert r.pid == os.getpid() == m.pid
            assert r.boot_us == m.boot_us and before <= r.boot_us <= wall_us()
            assert r.weight == 1.5 and m.weight == 1.5
            assert r.name == "alpha"
            assert (r.active, r.busy_ppm) == (0, 0)
            assert before <= r.heartbeat_us <= wall_us()
            assert r.seq % 2 == 0 and r.seq > 0
            # a second member takes the next slot, never a live one
            with Membership(gpu_key, 1.0, "beta", pid=FAKE_PID, heartbeat_s=3600) as m2:
                assert m2.slot == 1
                assert ro.read_slot(1).pid == FAKE_PID
                assert m.peers_alive() == 2
            assert ro.read_slot(1).pid == 0  # the context manager left
        m.leave()
        with _ro(gpu_key) as ro:
            r = ro.read_slot(slot)
            assert (r.pid, r.active, r.heartbeat_us) == (0, 0, 0)
        assert m.slot is None
        m.leave()  # idempotent
        with pytest.raises(RuntimeError, match="not joined"):
            _ = m.segment
    finally:
        m.leave()


def test_rejoin_after_leave_takes_a_free_slot(gpu_key: str) -> None:
    with Membership(gpu_key, 1.0, "a", heartbeat_s=3600) as a, Membership(gpu_key, 1.0, "b", pid=FAKE_PID) as b:
        assert (a.slot, b.slot) == (0, 1)
        a.leave()
        with Membership(gpu_key, 2.0, "c", pid=FAKE_PID + 1, heartbeat_s=3600) as c:
            assert c.slot == 0  # index order, first free slot


def test_heartbeat_updates_heartbeat_us(gpu_key: str) -> None:
    clock = FakeClock()
    with Membership(gpu_key, 1.0, "hb", clock_us=clock, heartbeat_s=3600) as m, _ro(gpu_key) as ro:
        t0 = ro.read_slot(m.slot).heartbeat_us
        assert t0 == clock.t
        clock.advance(700_000)
        m.heartbeat()
        r = ro.read_slot(m.slot)
        assert r.heartbeat_us == t0 + 700_000
        assert r.pid == m.pid and r.boot_us == m.boot_us


def test_heartbeat_thread_runs(gpu_key: str) -> None:
    with Membership(gpu_key, 1.0, "hb", heartbeat_s=0.05) as m, _ro(gpu_key) as ro:
        t0 = ro.read_slot(m.slot).heartbeat_us
        wait_for(lambda: ro.read_slot(m.slot).heartbeat_us > t0, 2.0, what="a heartbeat from the thread")


def test_eviction_is_detected_logged_and_reclaimed(gpu_key: str) -> None:
    logs: list[str] = []
    clock = FakeClock()
    m = Membership(gpu_key, 2.0, "victim", clock_us=clock, heartbeat_s=3600, log=logs.append)
    with m, Segment.create_or_attach(gpu_key) as other:
        old = m.slot
        assert old == 0
        # another owner claimed our slot (as if we had stalled > 3 s): its pid and boot_us
        other.cas_pid(old, other.read_slot(old).pid, FAKE_PID)
        other.write_slot_fields(
            old, boot_us=42, weight=1.0, active=1, heartbeat_us=clock.t, busy_ppm=0, name_raw=abi.encode_name("usurper")
        )
        clock.advance(500_000)
        m.heartbeat()
        assert m.slot is not None and m.slot != old
        new = other.read_slot(m.slot)
        assert (new.pid, new.boot_us, new.weight, new.name) == (m.pid, m.boot_us, 2.0, "victim")
        assert new.heartbeat_us == clock.t
        stolen = other.read_slot(old)
        assert (stolen.pid, stolen.boot_us, stolen.name) == (FAKE_PID, 42, "usurper")  # untouched
        assert len(logs) == 1 and "evicted" in logs[0] and f"slot {old}" in logs[0] and f"slot {m.slot}" in logs[0]
        # a stolen boot_us alone (same pid reused) is an eviction too
        other.write_slot_fields(
            m.slot,
            boot_us=43,
            weight=1.0,
            active=0,
            heartbeat_us=clock.t,
            busy_ppm=0,
            name_raw=abi.encode_name("same-pid"),
        )
        second = m.slot
        m.heartbeat()
        assert m.slot not in (None, old, second) and len(logs) == 2


def test_eviction_when_registry_is_full_logs_failure(gpu_key: str) -> None:
    logs: list[str] = []
    clock = FakeClock()
    others = []
    m = Membership(gpu_key, 1.0, "victim", clock_us=clock, heartbeat_s=3600, log=logs.append)
    try:
        m.join()
        others = [
            Membership(gpu_key, 1.0, f"o{i}", pid=FAKE_PID + i, clock_us=clock, heartbeat_s=3600) for i in range(15)
        ]
        for o in others:
            o.join()
        with Segment.create_or_attach(gpu_key) as seg:
            seg.cas_pid(0, seg.read_slot(0).pid, FAKE_PID + 99)
            m.heartbeat()
        assert m.slot is None
        assert "re-join failed" in logs[-1] and "registry full: 16 live peers" in logs[-1]
        n_logs = len(logs)
        m.heartbeat()  # still full: retried quietly
        assert m.slot is None and len(logs) == n_logs
        others.pop().leave()  # a slot frees up: the next heartbeat re-claims it
        m.heartbeat()
        assert m.slot is not None and "re-joined slot" in logs[-1]
        with Segment.attach_readonly(shm_file(gpu_key)) as ro:
            assert ro.read_slot(m.slot).pid == m.pid
    finally:
        for o in others:
            o.leave()
        m.leave()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 0.0, -1.0, 1e39, "abc"])
def test_set_weight_rejects_invalid_and_keeps_slot(gpu_key: str, bad: object) -> None:
    with Membership(gpu_key, 1.5, "w", heartbeat_s=3600) as m, _ro(gpu_key) as ro:
        with pytest.raises(abi.BadWeightError):
            m.set_weight(bad)  # type: ignore[arg-type]
        assert m.weight == 1.5 and ro.read_slot(m.slot).weight == 1.5


def test_set_weight_stores_f32_at_once(gpu_key: str) -> None:
    with Membership(gpu_key, 1.5, "w", heartbeat_s=3600) as m, _ro(gpu_key) as ro:
        got = m.set_weight(0.1)
        assert got == abi.to_f32(0.1) != 0.1
        assert m.weight == got and ro.read_slot(m.slot).weight == got
    with pytest.raises(abi.BadWeightError):
        Membership(gpu_key, math.nan, "bad")
    with pytest.raises(abi.BadKeyError):
        Membership("../x", 1.0, "bad")


def test_mark_active_at_once_and_dropped_two_seconds_after_last_step(gpu_key: str) -> None:
    clock = FakeClock()
    with Membership(gpu_key, 1.0, "act", clock_us=clock, mono_us=clock, heartbeat_s=3600) as m, _ro(gpu_key) as ro:
        assert ro.read_slot(m.slot).active == 0 and not m.active
        m.mark_active()
        assert ro.read_slot(m.slot).active == 1 and m.active  # no heartbeat needed
        m.set_busy_ppm(400_000)
        clock.advance(1_900_000)
        m.heartbeat()
        r = ro.read_slot(m.slot)
        assert r.active == 1 and r.busy_ppm == 400_000
        clock.advance(100_000)  # exactly 2 s: still active
        m.heartbeat()
        assert ro.read_slot(m.slot).active == 1
        clock.advance(1)
        m.heartbeat()
        r = ro.read_slot(m.slot)
        assert r.active == 0 and r.busy_ppm == 0 and not m.active
        # a new step raises it again at once, and keeps it up while steps continue
        m.mark_active()
        assert ro.read_slot(m.slot).active == 1
        for _ in range(5):
            clock.advance(1_000_000)
            m.mark_active()
            m.heartbeat()
            assert ro.read_slot(m.slot).active == 1
        m.mark_idle()
        assert ro.read_slot(m.slot).active == 0


def test_busy_ppm_is_clamped(gpu_key: str) -> None:
    with Membership(gpu_key, 1.0, "b", heartbeat_s=3600) as m, _ro(gpu_key) as ro:
        m.set_busy_ppm(2_000_000)
        m.heartbeat()
        assert ro.read_slot(m.slot).busy_ppm == 1_000_000
        m.set_busy_ppm(-5)
        m.heartbeat()
        assert ro.read_slot(m.slot).busy_ppm == 0


def test_registry_full_error(gpu_key: str) -> None:
    ms = [Membership(gpu_key, 1.0, f"m{i}", pid=FAKE_PID + i, heartbeat_s=3600) for i in range(16)]
    try:
        assert [m.join() for m in ms] == list(range(16))
        late = Membership(gpu_key, 1.0, "late", pid=FAKE_PID + 16)
        with pytest.raises(RegistryFullError, match=f"^registry full: 16 live peers on {gpu_key}$"):
            late.join()
        assert late.slot is None
        with pytest.raises(RuntimeError, match="not joined"):
            _ = late.segment  # a failed join keeps no mapping open
    finally:
        for m in ms:
            m.leave()


@pytest.mark.slow
def test_cli_reports_registry_full(gpu_key: str, cli) -> None:
    ms = [Membership(gpu_key, 1.0, f"m{i}", pid=FAKE_PID + i, heartbeat_s=0.5) for i in range(16)]
    try:
        for m in ms:
            m.join()
        r = cli("synth", "--weight", "1", "--gpu-key", gpu_key, "--duration", "1", "-q")
        assert r.returncode == 1
        assert r.stderr.strip() == f"gpushare-tui: registry full: 16 live peers on {gpu_key}"
    finally:
        for m in ms:
            m.leave()


def test_dead_slot_is_claimable_live_slot_is_not(gpu_key: str) -> None:
    clock = FakeClock()
    with Segment.create_or_attach(gpu_key) as seg:
        for i, age in enumerate([3_000_001, 3_000_000]):
            seg.cas_pid(i, seg.read_slot(i).pid, FAKE_PID + i)
            seg.write_slot_fields(
                i,
                boot_us=1,
                weight=1.0,
                active=1,
                heartbeat_us=clock.t - age,
                busy_ppm=0,
                name_raw=abi.encode_name(f"old{i}"),
            )
        with Membership(gpu_key, 1.0, "new", clock_us=clock, heartbeat_s=3600) as m:
            assert m.slot == 0  # dead by 1 µs
            assert seg.read_slot(1).pid == FAKE_PID + 1  # exactly 3 s old is alive


RACER = r"""
import os, sys, time
from gpushare_tui.core.registry.membership import Membership, RegistryFullError

key, go, stop = sys.argv[1:4]
m = Membership(key, 1.0, f"racer-{os.getpid()}")
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.0005)
try:
    slot = m.join()
except RegistryFullError as e:
    print(e, file=sys.stderr, flush=True)
    sys.exit(3)
print(f"slot {slot}", flush=True)
while not os.path.exists(stop):
    time.sleep(0.01)
m.leave()
"""


@pytest.mark.slow
def test_twenty_racers_exactly_sixteen_win(gpu_key: str, procs, tmp_path) -> None:
    go, stop = tmp_path / "go", tmp_path / "stop"
    racers = [procs.start([sys.executable, "-c", RACER, gpu_key, str(go), str(stop)]) for _ in range(20)]
    for p in racers:
        assert p.stdout.readline().strip() == "ready"
    go.touch()
    winners: dict[int, int] = {}
    losers = []
    for p in racers:
        line = p.stdout.readline().strip()
        if line.startswith("slot "):
            winners[p.pid] = int(line.split()[1])
        else:
            assert p.wait(timeout=30) == 3
            losers.append(p)
    assert len(winners) == 16 and len(losers) == 4
    for p in losers:
        err = p.stderr.read()
        assert err.strip() == f"registry full: 16 live peers on {gpu_key}"
    with _ro(gpu_key) as ro:
        recs = ro.read_slots()
        pids = [r.pid for r in recs]
        assert len(set(pids)) == 16  # no slot has two owners, no owner two slots
        assert set(pids) == set(winners)
        assert {r.pid: r.index for r in recs} == winners
        for r in recs:
            assert r.name == f"racer-{r.pid}"
    stop.touch()
    for p in winners:
        proc = next(x for x in racers if x.pid == p)
        assert proc.wait(timeout=30) == 0
    with _ro(gpu_key) as ro:
        assert all(r.pid == 0 for r in ro.read_slots())


HOLDER = r"""
import sys, time
from gpushare_tui.core.registry.membership import Membership
m = Membership(sys.argv[1], 1.0, "holder")
print(f"slot {m.join()}", flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_killed_member_ages_out_and_its_slot_is_reclaimed(gpu_key: str, procs) -> None:
    keep = Membership(gpu_key, 1.0, "keeper", pid=FAKE_PID)  # slot 0 stays live
    keep.join()
    try:
        p = procs.start([sys.executable, "-c", HOLDER, gpu_key])
        slot = int(p.stdout.readline().split()[1])
        assert slot == 1
        reader = SegmentReader(gpu_key)
        try:

            def peer(now: int):
                gpus, errors = reader.read(now)
                assert errors == []
                return next(x for x in gpus[0].peers if x.slot == slot)

            assert peer(wall_us()).alive and peer(wall_us()).pid == p.pid
            # alive slots are not claimable
            with Membership(gpu_key, 1.0, "probe", pid=FAKE_PID + 1, heartbeat_s=3600) as probe:
                assert probe.slot == 2
            keep.heartbeat()
            os.kill(p.pid, signal.SIGKILL)
            t_kill = time.monotonic()
            p.wait(timeout=10)
            while peer(wall_us()).alive:
                keep.heartbeat()
                assert time.monotonic() - t_kill < 3.5, "a killed member must age out within 3.5 s"
                time.sleep(0.05)
            aged = time.monotonic() - t_kill
            assert aged > 1.5  # it was not dropped early: liveness is the 3 s heartbeat rule
            gone = peer(wall_us())
            assert gone.pid == p.pid and not gone.alive and gone.heartbeat_age_ms > 3000
        finally:
            reader.close()
        with Membership(gpu_key, 1.0, "heir", heartbeat_s=3600) as heir:
            assert heir.slot == slot
    finally:
        keep.leave()


@pytest.mark.slow
def test_sigterm_member_leaves_cleanly(gpu_key: str, procs) -> None:
    p = procs.start(cli_argv("synth", "--weight", "1", "--gpu-key", gpu_key, "--step-ms", "1", "-q"))
    with Segment.create_or_attach(gpu_key) as seg:
        wait_for(lambda: seg.read_slot(0).pid == p.pid, 10, what="synth to join")
        os.kill(p.pid, signal.SIGTERM)
        assert p.wait(timeout=10) == 128 + signal.SIGTERM
        r = seg.read_slot(0)
        assert (r.pid, r.active, r.heartbeat_us) == (0, 0, 0)


def test_sigterm_while_claiming_still_leaves_cleanly(gpu_key: str, monkeypatch) -> None:
    """SIGTERM right after the slot's pid CAS (before its fields are written) must not
    strand the slot: the exit waits until join is done, then leave clears it."""
    from gpushare_tui.core.host.lifecycle import exit_on_termination

    old_handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    exit_on_termination()
    real_cas = Segment.cas_pid
    fired: list[bool] = []

    def cas_then_sigterm(self, index, expected, new):
        ok = real_cas(self, index, expected, new)
        if not fired:
            fired.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return ok

    monkeypatch.setattr(Segment, "cas_pid", cas_then_sigterm)
    m = Membership(gpu_key, 1.0, "term")
    try:
        with pytest.raises(SystemExit) as exc:
            try:
                m.join()
            finally:
                m.leave()
        assert exc.value.code == 128 + signal.SIGTERM
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
    with Segment.create_or_attach(gpu_key) as seg:
        assert all(r.pid == 0 for r in seg.read_slots())
