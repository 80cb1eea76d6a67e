"""Accounting (core.accounting, core.energy), pure: busy counters per owner, busy_ppm integration for v1
peers, energy attribution with a scripted energy source and clock, the supervisor's busy from marks."""

from __future__ import annotations

import os

import pytest

from gpushare_tui.core.observe.accounting import (
    BUSY_DELTA_SLACK_S,
    SOURCE_BUSY_PPM,
    SOURCE_COUNTER,
    Accountant,
    BusyFromMarks,
    GpuAccountant,
    PeerAccount,
    TimeBudget,
)
from gpushare_tui.core.observe.energy import (
    EnergyCounter,
    EnergyReading,
    RaplReader,
    energy_delta_j,
    nvml_reading,
    split_energy,
)
from gpushare_tui.core.observe.snapshot import GpuSnapshot, PeerSnapshot

S = 1_000_000


def peer(
    slot: int,
    busy_total_s: float = 0.0,
    *,
    pid: int = 0,
    boot_us: int = 1,
    busy_pct: float = 50.0,
    ext1: bool = True,
    alive: bool = True,
) -> PeerSnapshot:
    return PeerSnapshot(
        slot=slot,
        pid=pid or 1000 + slot,
        name=f"p{slot}",
        weight=1.0,
        share_pct=50.0,
        window_us=None,
        busy_pct=busy_pct,
        active=True,
        alive=alive,
        heartbeat_age_ms=0.0,
        boot_us=boot_us,
        klass="batch" if ext1 else None,  # an Extension 1 owner has a class
        busy_total_us=round(busy_total_s * S),
    )


def nvml(j: float) -> EnergyReading:
    return EnergyReading("nvml", (EnergyCounter(j),))


def test_counter_busy_and_gpu_total() -> None:
    acc = GpuAccountant()
    a = acc.update([peer(0, 10.0), peer(1, 5.0)], 0, None)
    assert [(k[0], x.source, x.busy_s, x.energy_j) for k, x in a.peers] == [
        (0, SOURCE_COUNTER, 10.0, None),
        (1, SOURCE_COUNTER, 5.0, None),
    ]
    assert a.busy_s == 0.0 and a.idle_energy_j is None  # since this reader started: nothing yet
    a = acc.update([peer(0, 10.6), peer(1, 5.3)], 1 * S, None)
    assert a.busy_s == pytest.approx(0.9)
    assert a.of(peer(0)).busy_s == pytest.approx(10.6)


def test_counter_never_decreases_and_new_owner_is_new_account() -> None:
    acc = GpuAccountant()
    acc.update([peer(0, 10.0)], 0, None)
    a = acc.update([peer(0, 4.0)], S, None)  # a bad writer's counter went back: ours does not
    assert a.of(peer(0)).busy_s == 10.0 and a.busy_s == 0.0
    a = acc.update([peer(0, 2.0, boot_us=99)], 2 * S, None)  # a new owner (boot_us) of slot 0
    assert [x.busy_s for _, x in a.peers] == [2.0]
    a = acc.update([peer(0, 3.0, boot_us=99)], 3 * S, None)
    assert a.peers[0][1].busy_s == 3.0 and a.busy_s == pytest.approx(1.0)


def test_gpu_total_caps_a_hostile_delta() -> None:
    acc = GpuAccountant()
    acc.update([peer(0, 0.0)], 0, None)
    a = acc.update([peer(0, 1e9)], S, None)
    assert a.of(peer(0)).busy_s == 1e9  # its own counter, as it says
    assert a.busy_s <= 1.0 + 1.0  # the GPU's: at most the interval plus the heartbeat slack


@pytest.mark.parametrize("refresh_s", [0.1, 0.5, 1.0, 3.0])
def test_gpu_total_never_outruns_time_beside_a_jumping_peer(refresh_s: float) -> None:
    """A peer whose busy_total_us jumps by 1e15 a second, beside an honest one: over any span the
    GPU's total rises at most by the span plus BUSY_DELTA_SLACK_S (a per-peer cap alone: 2-11x)."""
    acc = GpuAccountant()
    step_us = round(refresh_s * S)
    energy_j = 0.0
    totals = []
    for i in range(200):
        t = i * step_us
        energy_j += 100.0 * refresh_s  # 100 W
        a = acc.update([peer(0, 1e9 * t / S), peer(1, 0.3 * t / S)], t, nvml(energy_j))
        totals.append((t, a.busy_s))
    for j in range(len(totals)):
        for k in range(j, len(totals), 7):
            span_s = (totals[k][0] - totals[j][0]) / S
            assert totals[k][1] - totals[j][1] <= span_s + BUSY_DELTA_SLACK_S + 1e-9
    assert totals[-1][1] >= 0.99 * totals[-1][0] / S - 1e-9  # all it may have: the device was "busy"
    spent = energy_j - 100.0 * refresh_s  # from the first reading on
    attributed = a.of(peer(0)).energy_j + a.of(peer(1)).energy_j + a.idle_energy_j
    assert attributed == pytest.approx(spent)  # energy: never more than the device's counter says


def test_time_budget_grants_at_most_the_time_plus_the_slack() -> None:
    b = TimeBudget(1.0)
    assert b.take(5.0, 0) == 1.0  # the slack, at once (a counter from before the first read)
    assert b.take(5.0, S) == 1.0  # then the time since
    assert b.take(0.2, 2 * S) == pytest.approx(0.2)  # 0.8 s carried over ...
    assert b.take(5.0, 3 * S) == pytest.approx(1.8)  # ... and spent
    assert b.take(0.0, 10 * S) == 0.0
    assert b.take(9.0, 11 * S) == pytest.approx(2.0)  # the carry is capped at the slack
    assert b.take(1.0, 10 * S) == 0.0  # a clock that goes back grants nothing


def test_v1_peer_is_integrated_from_busy_ppm() -> None:
    """Active with busy_ppm > 0 and a counter that stays 0 for V1_EVIDENCE_S of busy time: a v1 peer,
    integrated from busy_ppm from then on, the wait included; unknown (None) until then."""
    acc = GpuAccountant()
    v1 = {"ext1": False, "busy_pct": 50.0}
    a = acc.update([peer(0, 0.0, **v1)], 0, None)
    assert a.peers[0][1] == PeerAccount(SOURCE_COUNTER, None, None)  # not known yet: no series
    a = acc.update([peer(0, 0.0, **v1)], S, None)  # 0.5 s of busy_ppm: not evidence enough
    assert a.peers[0][1] == PeerAccount(SOURCE_COUNTER, None, None)
    a = acc.update([peer(0, 0.0, **v1)], 2 * S, None)
    assert a.peers[0][1].source == SOURCE_BUSY_PPM and a.peers[0][1].busy_s == pytest.approx(1.0)
    a = acc.update([peer(0, 0.0, ext1=False, busy_pct=100.0)], 4 * S, None)
    assert a.peers[0][1].busy_s == pytest.approx(1.0 + 1.5)  # trapezoid: (50 + 100) / 2 % of 2 s
    assert a.busy_s == pytest.approx(0.5 + 1.5)  # the GPU's sum: from the switch's interval on


def test_a_counter_that_rises_is_never_taken_for_v1() -> None:
    """An engine of ours (no EXT1 yet) whose busy_ppm shows before its counter rises, or that shows CPU
    busy_ppm while idle (a supervisor's), stays "counter"."""
    acc = GpuAccountant()
    early = {"ext1": False, "busy_pct": 40.0}
    acc.update([peer(0, 0.0, **early), peer(1, 0.0, ext1=False, busy_pct=3.0)], 0, None)
    idle_cpu = PeerSnapshot(**{**peer(1, 0.0, ext1=False, busy_pct=3.0).__dict__, "active": False})
    a = acc.update([peer(0, 0.3, **early), idle_cpu], S, None)
    assert a.of(peer(0)) == PeerAccount(SOURCE_COUNTER, 0.3, None)
    for t in range(2, 60):
        a = acc.update([peer(0, 0.3 * t, **early), idle_cpu], t * S, None)
    assert a.of(peer(0)).source == SOURCE_COUNTER and a.of(idle_cpu).source == SOURCE_COUNTER
    assert a.of(idle_cpu).busy_s is None  # busy_ppm > 0, counter 0: not known (idle, or v1 and idle)
    acc2 = GpuAccountant()
    idle = peer(0, 0.0, ext1=False, busy_pct=0.0)
    assert acc2.update([idle], 0, None).peers[0][1] == PeerAccount(SOURCE_COUNTER, 0.0, None)  # 0 either way
    # an Extension 1 peer is "counter" whatever it shows
    assert acc2.update([peer(1, 0.0, busy_pct=40.0)], S, None).of(peer(1)) == PeerAccount(SOURCE_COUNTER, 0.0, None)


def test_energy_split_by_busy_deltas_rest_idle() -> None:
    acc = GpuAccountant()
    acc.update([peer(0, 0.0), peer(1, 0.0)], 0, nvml(1000.0))
    a = acc.update([peer(0, 0.5), peer(1, 0.25)], S, nvml(1100.0))  # 100 J over 1 s; busy 0.5 s and 0.25 s
    assert a.of(peer(0)).energy_j == pytest.approx(50.0)
    assert a.of(peer(1)).energy_j == pytest.approx(25.0)
    assert a.idle_energy_j == pytest.approx(25.0) and a.energy_source == "nvml"
    total = a.of(peer(0)).energy_j + a.of(peer(1)).energy_j + a.idle_energy_j
    assert total == pytest.approx(100.0)


def test_energy_zero_busy_goes_to_idle_and_first_reading_is_unknown() -> None:
    acc = GpuAccountant()
    a = acc.update([peer(0, 3.0)], 0, nvml(0.0))
    assert a.of(peer(0)).energy_j is None and a.idle_energy_j == 0.0  # an energy source, no interval yet
    a = acc.update([peer(0, 3.0)], S, nvml(40.0))
    assert a.of(peer(0)).energy_j == 0.0 and a.idle_energy_j == pytest.approx(40.0)


def test_energy_lumpy_busy_beyond_interval_splits_it_all() -> None:
    acc = GpuAccountant()
    acc.update([peer(0, 0.0), peer(1, 0.0)], 0, nvml(0.0))
    a = acc.update([peer(0, 0.9), peer(1, 0.3)], S, nvml(120.0))  # 1.2 s of busy in 1 s (heartbeat lumps)
    assert a.of(peer(0)).energy_j == pytest.approx(90.0) and a.of(peer(1)).energy_j == pytest.approx(30.0)
    assert a.idle_energy_j == pytest.approx(0.0)


def test_energy_peer_leaving_mid_interval_goes_to_idle() -> None:
    acc = GpuAccountant()
    acc.update([peer(0, 0.0), peer(1, 0.0)], 0, nvml(0.0))
    acc.update([peer(0, 0.5), peer(1, 0.5)], S, nvml(100.0))
    a = acc.update([peer(0, 1.0)], 2 * S, nvml(200.0))  # peer 1 left: its last part is not known
    assert [k[0] for k, _ in a.peers] == [0]
    assert a.of(peer(0)).energy_j == pytest.approx(50.0 + 50.0)
    assert a.idle_energy_j == pytest.approx(0.0 + 50.0)


def test_energy_counter_reset_skips_one_interval_and_missing_reading_rebaselines() -> None:
    acc = GpuAccountant()
    acc.update([peer(0, 0.0)], 0, nvml(500.0))
    a = acc.update([peer(0, 1.0)], S, nvml(10.0))  # went back, no range: a driver reload; not attributed
    assert a.of(peer(0)).energy_j is None and a.idle_energy_j == 0.0
    a = acc.update([peer(0, 2.0)], 2 * S, nvml(110.0))
    assert a.of(peer(0)).energy_j == pytest.approx(100.0)
    acc.update([peer(0, 3.0)], 3 * S, None)  # no reading: this interval is not attributed
    a = acc.update([peer(0, 3.5)], 4 * S, nvml(160.0))
    assert a.of(peer(0)).energy_j == pytest.approx(100.0)  # rebaselined at 160 J
    a = acc.update([peer(0, 4.0)], 5 * S, nvml(260.0))
    assert a.of(peer(0)).energy_j == pytest.approx(150.0) and a.idle_energy_j == pytest.approx(50.0)


def test_energy_delta_wrap_reset_and_shape() -> None:
    rapl = lambda *vs: EnergyReading("rapl", tuple(EnergyCounter(v, 262143.0) for v in vs))  # noqa: E731
    assert energy_delta_j(rapl(100.0, 5.0), rapl(130.0, 6.0)) == pytest.approx(31.0)
    assert energy_delta_j(rapl(262100.0), rapl(7.0)) == pytest.approx(43.0 + 7.0)  # wrapped at its range
    assert energy_delta_j(nvml(10.0), nvml(5.0)) is None  # no range: a reset
    assert energy_delta_j(rapl(1.0, 2.0), rapl(3.0)) is None  # another set of counters
    assert energy_delta_j(nvml(1.0), rapl(3.0)) is None
    assert nvml_reading(None) is None and nvml_reading(2500) == nvml(2.5)


def test_split_energy() -> None:
    shares, idle = split_energy(60.0, {"a": 2.0, "b": 1.0}, 6.0)
    assert shares == {"a": 20.0, "b": 10.0} and idle == 30.0
    assert split_energy(10.0, {}, 0.0) == ({}, 10.0)
    assert split_energy(10.0, {"a": -1.0}, 1.0) == ({"a": 0.0}, 10.0)


def test_rapl_reader_reads_packages_only(tmp_path) -> None:
    for zone, uj in (("intel-rapl:0", 1_500_000), ("intel-rapl:0:0", 9), ("intel-rapl:1", 2_000_000)):
        d = tmp_path / zone
        d.mkdir()
        (d / "energy_uj").write_text(f"{uj}\n")
        (d / "max_energy_range_uj").write_text("262143328850\n")
    r = RaplReader(str(tmp_path))
    assert [os.path.basename(z) for z in r.zones] == ["intel-rapl:0", "intel-rapl:1"]
    got = r.read()
    assert got is not None and [c.value_j for c in got.counters] == [1.5, 2.0]
    assert got.counters[0].range_j == pytest.approx(262143.32885)
    assert RaplReader(str(tmp_path / "none")).read() is None


def test_accountant_per_segment_and_retain() -> None:
    t = [0]
    acc = Accountant(lambda: t[0])
    snap = lambda key, *peers: GpuSnapshot(key, "/opencoti-gpu-" + key, None, peers, 0)  # noqa: E731
    acc.update(snap("a", peer(0, 1.0)), None)
    acc.update(snap("b", peer(0, 7.0)), None)
    t[0] = S
    assert acc.update(snap("a", peer(0, 1.5)), None).busy_s == pytest.approx(0.5)
    acc.retain(["/opencoti-gpu-b"])
    assert acc.update(snap("a", peer(0, 2.0)), None).busy_s == 0.0  # forgotten: a new start


def test_busy_from_marks() -> None:
    b = BusyFromMarks(max_gap_us=1_000)
    b.continued(0, 5_000)  # idle and continued: no marks, nothing counts
    assert b.mark(None) == 0
    assert b.mark(5_000) == 0  # the first mark of a burst
    b.continued(5_000, 5_400)
    b.continued(5_400, 5_600)  # merged
    assert b.mark(5_500) == 500
    # stopped 5_600..6_100 (not continued), then continued again
    b.continued(6_100, 6_300)
    assert b.mark(6_300) == 100 + 200  # the continued part of (5_500, 6_300]
    assert b.mark(6_300) == 0  # no new mark
    b.continued(6_300, 20_000)  # the work ended at 6_300; the 2 s activity tail is not counted
    assert b.mark(20_000) == 0  # a mark after a long gap starts a new burst
    b.continued(20_000, 20_500)
    assert b.mark(20_400) == 400


def test_in_window_us() -> None:
    from gpushare_tui.core.schedule import v1 as schedule
    from gpushare_tui.core.schedule.v1 import in_window_us

    sched = schedule.build_schedule([(0, 2.0), (1, 1.0)])  # 120 ms: slot 0 [0, 80 ms), slot 1 [80, 120 ms)
    assert sched is not None and sched.window_of(1) == (80_000, 120_000)
    base = 1_000 * sched.period_us  # phase 0
    assert in_window_us(sched, 0, base + 70_000, base + 90_000) == 10_000  # the overshoot past 80 ms is not ours
    assert in_window_us(sched, 1, base + 70_000, base + 90_000) == 10_000
    assert in_window_us(sched, 1, base + 100_000, base + 100_000 + 3 * 120_000) == 3 * 40_000
    assert in_window_us(sched, 0, base + 10, base + 20) == 10
    assert in_window_us(None, 0, 5, 25) == 20 and in_window_us(sched, 7, 5, 25) == 20  # no schedule / not in it
    assert in_window_us(sched, 0, 30, 20) == 0


def test_nvml_energy_read_with_the_device_stats(monkeypatch) -> None:
    from gpushare_tui.core.observe import gpu

    class FakeNvml:
        """Only the handle and the energy counter answer; every other query raises, as NVML may."""

        def nvmlDeviceGetHandleByUUID(self, key: str) -> str:  # noqa: N802
            return "handle"

        def nvmlDeviceGetTotalEnergyConsumption(self, handle: str) -> int:  # noqa: N802
            return 123_456_789  # mJ

        def __getattr__(self, name: str):
            def fails(*args: object) -> None:
                raise RuntimeError(f"{name}: not supported")

            return fails

    monkeypatch.setattr(gpu, "_nvml", lambda: FakeNvml())
    dev = gpu.device_stats("GPU-00000000-0000-0000-0000-000000000000")
    assert dev is not None and dev.energy_mj == 123_456_789 and dev.util_pct is None
    assert nvml_reading(dev.energy_mj) == nvml(123_456.789)


def test_live_source_attributes_the_device_energy(gpu_key: str) -> None:
    """A real segment: an Extension 1 owner's busy counter and a scripted NVML energy counter, through
    LiveSource, the model and /metrics."""
    from gpushare_tui.core.observe.gpu import DeviceStats
    from gpushare_tui.core.registry import abi
    from gpushare_tui.core.registry.membership import Membership
    from gpushare_tui.dashboard.source import LiveSource
    from gpushare_tui.serve.exposition import render_metrics

    energy_j = [1000.0]
    source = LiveSource(gpu_key, stats=lambda key: DeviceStats(energy_mj=round(energy_j[0] * 1000)))
    with Membership(gpu_key, 1.0, "busy", heartbeat_s=3600) as m:
        m.set_flags(abi.FLAG_EXT1)
        m.mark_active()
        first = source.collect().gpus[0]
        assert first.rows[0].account == PeerAccount(SOURCE_COUNTER, 0.0, None)  # no interval yet
        m.add_busy_us(500_000)
        m.heartbeat()
        energy_j[0] += 100.0
        model = source.collect()
    view = model.gpus[0]
    acc = view.rows[0].account
    assert acc is not None and acc.busy_s == 0.5
    # Σ busy (0.5 s) exceeds the few ms between the collects: the peer gets all of the interval's energy
    assert acc.energy_j == pytest.approx(100.0) and view.account is not None and view.account.idle_energy_j == 0.0
    text = render_metrics(lambda: model).decode()
    assert f'gpushare_peer_energy_joules_total{{gpu_key="{gpu_key}",name="busy"' in text
    assert f'gpushare_gpu_busy_seconds_total{{gpu_key="{gpu_key}"}} 0.5' in text
    assert f'gpushare_gpu_idle_energy_joules_total{{gpu_key="{gpu_key}"}} 0.0' in text


def test_remote_report_carries_the_accounts() -> None:
    """What a `serve`'s /gpu/peers says of each peer's account is what `--remote` views show."""
    import json as json_

    from slots import NOW, slot

    from gpushare_tui.core.observe.snapshot import build_gpu_snapshot
    from gpushare_tui.dashboard.model import GpuView, PeerRow
    from gpushare_tui.dashboard.remote import host_view, parse_report
    from gpushare_tui.dashboard.report import ReportData, report_json

    g = build_gpu_snapshot("k", "/opencoti-gpu-k", [slot(0, 2.0), slot(1, 1.0)], NOW)
    acc = {0: PeerAccount(SOURCE_COUNTER, 12.5, 300.0), 1: PeerAccount(SOURCE_BUSY_PPM, 2.0, None)}
    rows = tuple(PeerRow("k", p, account=acc[p.slot]) for p in g.peers)
    body = json_.dumps(report_json(ReportData("h", NOW, [(None, GpuView(g, None, rows))]))).encode()
    views, errors = host_view(parse_report("http://10.0.0.5:9464", body))
    assert errors == [] and [r.account for r in views[0].rows] == [acc[0], acc[1]]
    doc = json_.loads(body)
    doc["gpus"][0]["peers"][0]["busy_total_s"] = -1.0
    bad = parse_report("http://10.0.0.5:9464", json_.dumps(doc).encode())
    assert bad.error is not None and "busy_total_s" in bad.error  # out of range: the host's one error line


def test_reclaim_after_eviction_keeps_counting(gpu_key: str) -> None:
    """busy_total_us belongs to the owner (pid, boot_us), not the slot: a re-claim after an eviction
    keeps both, so the counter carries on (spec §7: it never decreases while (pid, boot_us) is the same)."""
    from gpushare_tui.core.host.clock import wall_us
    from gpushare_tui.core.registry.membership import Membership
    from gpushare_tui.core.registry.segment import Segment

    intruder = 3_999_777
    with Membership(gpu_key, 1.0, "me", heartbeat_s=3600, log=lambda msg: None) as m:
        m.add_busy_us(700_000)
        m.heartbeat()
        seg = Segment.create_or_attach(gpu_key)
        old = m.slot
        assert old is not None
        try:
            seg.store_heartbeat(old, wall_us())
            assert seg.cas_pid(old, m.pid, intruder)  # evicted: another owner holds the slot now
            m.heartbeat()  # notices, claims another slot
            assert m.slot is not None and m.slot != old
            rec = seg.read_slot(m.slot)
            assert (rec.pid, rec.boot_us, rec.busy_total_us) == (m.pid, m.boot_us, 700_000)
        finally:
            seg.cas_pid(old, intruder, 0)
            seg.close()
