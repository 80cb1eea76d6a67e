"""The dashboard's data layer: the plot history, achieved shares, the live source, the control client."""

from __future__ import annotations

import os

import pytest
from slots import NOW, model_at

from gpushare_tui.core.observe.gpu import DeviceStats
from gpushare_tui.core.pacing.control import ControlError
from gpushare_tui.dashboard.control import LocalControl
from gpushare_tui.dashboard.history import History
from gpushare_tui.dashboard.model import achieved_shares
from gpushare_tui.dashboard.source import LiveSource

# -- history and plot data -----------------------------------------------------


def test_history_buckets_compresses_and_forgets():
    h = History(span_s=60)
    for t in range(0, 100):
        h.add(model_at(t))
    h.add(model_at(99))  # a repeated (frozen-clock) model adds nothing
    series = h.series("k", "share", NOW / 1e6 + 99, span_s=60, buckets=30)
    assert [s.slot for s in series] == [0, 1]
    big = series[0]
    assert set(big.ys) == {66.7} and len(big.xs) == 2  # a flat line is its two ends
    assert -60 <= big.xs[0] < big.xs[-1] <= 0
    assert all(t >= NOW / 1e6 + 39 for t, *_ in h._lines[("k", 0, 1000, 7)].points)


def test_history_series_follows_a_weight_change():
    h = History()
    for t in range(60):
        h.add(model_at(t, share_weights=(1, 1) if t < 30 else (3, 1)))
    ys = h.series("k", "share", NOW / 1e6 + 59, span_s=60, buckets=60)[0].ys
    assert ys[0] == 50.0 and ys[-1] == 75.0


def test_achieved_share_is_busy_time_not_tok_s():
    """Busy time among the members, whatever the tok/s (different models) and without any."""
    got = dict(achieved_shares(model_at(0, tok=(None, 10.0), busy=(0.6, 0.2)).gpus[0].rows))
    assert got == {0: 75.0, 1: 25.0}
    got = dict(achieved_shares(model_at(0, tok=(10.0, 90.0), busy=(0.6, 0.2)).gpus[0].rows))
    assert got == {0: 75.0, 1: 25.0}
    assert achieved_shares(model_at(0, busy=(0.0, 0.0)).gpus[0].rows) == ()  # nobody ran: unknown
    h = History()
    for t in range(10):
        h.add(model_at(t, tok=(30.0, 10.0), busy=(0.6, 0.2)))
    a = h.series("k", "achieved", NOW / 1e6 + 9, 120, 60)
    c = h.series("k", "configured", NOW / 1e6 + 9, 120, 60)
    assert a[0].ys[-1] == 75.0 and c[0].ys[-1] == 66.7


# -- the live source -------------------------------------------------------------


class FakeControl:
    """A ControlClient: `managed` pids have sockets (listed when `listing`), `fail` ones do not answer."""

    def __init__(self, managed: set[int], fail: set[int] = frozenset(), listing: bool = True) -> None:
        self.managed, self.fail, self.listing = managed, fail, listing
        self.calls: list[tuple[int, str, float]] = []
        self.stats: list[int] = []

    def is_managed(self, pid: int) -> bool:
        self.stats.append(pid)
        return pid in self.managed

    def socket_pids(self) -> set[int] | None:
        return set(self.managed) if self.listing else None

    def request(self, pid: int, cmd: str, timeout_s: float = 3.0, **kw):
        self.calls.append((pid, cmd, timeout_s))
        if pid in self.fail:
            raise ControlError(f"engine {pid}: no reply")
        return {"ok": True, "state": "running", "tok_s": 12.5, "model": "m", "kind": "synth", "port": None}


@pytest.mark.parametrize("listing", [True, False], ids=["socket-listing", "is-managed-per-peer"])
def test_live_source_polls_status_of_managed_peers_only_and_not_every_tick(tmp_path, monkeypatch, listing):
    from gpushare_tui.core.registry import segment
    from gpushare_tui.core.registry.membership import Membership

    monkeypatch.setattr(segment, "SHM_DIR", str(tmp_path))
    ms = [Membership("live", 1.0, f"m{i}", pid=920_000 + i, log=lambda _m: None) for i in range(3)]
    for m in ms:
        m.join()
    nvml_calls = []

    def stats(key):
        nvml_calls.append(key)
        return DeviceStats(name="X", pid_mem_mib=((920_000, 512.0),)) if key == "live" else None

    clock = [NOW]
    ctl = FakeControl(managed={920_000, 920_001}, fail={920_001}, listing=listing)
    src = LiveSource(clock=lambda: clock[0], control=ctl, stats=stats, shm_dir=str(tmp_path), status_every_s=3600)
    try:
        clock[0] = ms[0].boot_us + 1000
        m1 = src.collect()
        rows = {r.peer.pid: r for r in m1.rows()}
        assert rows[920_000].managed and rows[920_000].engine.tok_s == 12.5 and rows[920_000].vram_mib == 512.0
        assert rows[920_001].engine.error == "engine 920001: no reply"
        assert not rows[920_002].managed and rows[920_002].engine is None
        assert sorted(p for p, _c, _t in ctl.calls) == [920_000, 920_001]
        assert all(c == "status" and t <= 0.5 for _p, c, t in ctl.calls)
        # one listing per tick replaces a stat per peer
        assert sorted(ctl.stats) == ([] if listing else [920_000, 920_001, 920_002])
        src.collect()
        assert len(ctl.calls) == 2  # cached until status_every_s
        src.forget_status(920_000)
        src.collect()
        assert [p for p, _c, _t in ctl.calls[2:]] == [920_000]
        assert nvml_calls == ["live"] * 3
        ms[0].mark_active()  # its active flag changed: its tok/s did too, so it is asked at once
        src.collect()
        assert [p for p, _c, _t in ctl.calls[3:]] == [920_000]
        ms[1].mark_active()  # one that did not answer keeps its back-off
        src.collect()
        assert len(ctl.calls) == 4
    finally:
        src.close()
        for m in ms:
            m.leave()


def test_live_source_backs_off_nvml_for_keys_that_are_not_devices(tmp_path, monkeypatch):
    from gpushare_tui.core.registry import segment
    from gpushare_tui.core.registry.membership import Membership

    monkeypatch.setattr(segment, "SHM_DIR", str(tmp_path))
    m = Membership("cpu-only", 1.0, "x", pid=930_000, log=lambda _m: None)
    m.join()
    calls = []
    src = LiveSource(control=FakeControl(set()), stats=lambda k: calls.append(k), shm_dir=str(tmp_path))
    try:
        for _ in range(5):
            src.collect()
        assert calls == ["cpu-only"]
    finally:
        src.close()
        m.leave()


# -- the control client ----------------------------------------------------------


def test_local_control_lists_the_pids_with_a_socket(runtime_dir):
    ctl = LocalControl()
    assert ctl.socket_pids() == set()
    sockets = os.path.join(runtime_dir, "gpushare-tui")
    for name in ("4242.sock", "17.sock", "x.sock", "99.sock.tmp", "123"):
        open(os.path.join(sockets, name), "w").close()
    assert ctl.socket_pids() == {4242, 17}
    assert ctl.is_managed(4242) and not ctl.is_managed(123)


def test_local_control_cannot_list_an_unusable_runtime_dir(runtime_dir):
    os.chmod(runtime_dir, 0o755)
    os.mkdir(os.path.join(runtime_dir, "gpushare-tui"), 0o755)  # not private: refused
    ctl = LocalControl()
    assert ctl.socket_pids() is None
    assert not ctl.is_managed(4242)
    with pytest.raises(ControlError, match="not private"):
        ctl.request(4242, "status")
