"""Pure parts of the dashboard: history and plot data, timeline, cells, weights, the collector."""

from __future__ import annotations

import pytest
from rich.text import Text

from gpushare_tui.app import FixedSource, LiveSource, nudged_weight
from gpushare_tui.core import abi
from gpushare_tui.core.control import ControlError
from gpushare_tui.core.gpu import DeviceStats
from gpushare_tui.core.launcher import LaunchReply, LaunchSpec
from gpushare_tui.core.snapshot import build_gpu_snapshot
from gpushare_tui.widgets.launch_form import LaunchResult, validate_launch
from gpushare_tui.widgets.model import DashboardModel, EngineInfo, GpuView, History, PeerRow, achieved_shares
from gpushare_tui.widgets.palette import SLOT_COLOURS, slot_colour, slot_rgb
from gpushare_tui.widgets.peers_table import COLUMNS, cell_text, name_width, row_cells
from gpushare_tui.widgets.timeline import render_timeline

NOW = 1_800_000_000_000_000


def slot(
    i: int,
    weight: float,
    active: int = 1,
    pid: int | None = None,
    name: str = "",
    age_s: float = 0.1,
    busy: float = 0.5,
    now: int = NOW,
) -> abi.SlotRecord:
    return abi.SlotRecord(
        i,
        pid or 1000 + i,
        2,
        7,
        abi.to_f32(weight),
        active,
        now - int(age_s * 1e6),
        int(busy * 1e6),
        abi.encode_name(name or f"p{i}"),
    )


def snap(slots, now=NOW, key="k"):
    return build_gpu_snapshot(key, f"/opencoti-gpu-{key}", slots, now)


# -- weights -----------------------------------------------------------------


def test_nudge_steps_and_never_reaches_zero():
    w, ups = 0.25, []
    for _ in range(4):
        w = nudged_weight(w, +1)
        ups.append(w)
    assert ups == [0.5, 1.0, 2.0, 3.0]
    downs = []
    for _ in range(6):
        w = nudged_weight(w, -1)
        downs.append(w)
    assert downs == [2.0, 1.0, 0.5, 0.25, 0.125, 0.0625]
    assert nudged_weight(0.001, -1) > 0


# -- timeline ----------------------------------------------------------------


def test_timeline_windows_proportional_and_cursor_names_the_runner():
    s = snap([slot(0, 2, name="big"), slot(1, 1, name="small")])  # 2:1 -> 120 ms, [0, 80000) [80000, 120000)
    now = NOW - NOW % 120_000 + 90_000  # inside small's window
    s = snap([slot(0, 2, name="big"), slot(1, 1, name="small")], now=now)
    assert s.running_slot() == 1
    head, bar = render_timeline(s, 60).plain.split("\n")
    assert len(bar) == 60 and bar.startswith(" big 80ms")
    assert bar.index(" small") == 40  # 80 ms of 120 ms -> column 40 of 60
    assert head.index("▼") == 45  # 90/120 of 60 columns
    assert "now: small may run" in head


def test_timeline_without_schedule():
    alone = render_timeline(snap([slot(0, 1, name="solo")]), 50).plain
    assert "solo" in alone and "unthrottled" in alone
    idle = render_timeline(snap([slot(0, 1, active=0)]), 50).plain
    assert "no active members" in idle


def test_timeline_no_color_uses_fill_patterns():
    t = render_timeline(snap([slot(0, 1, name="a"), slot(1, 1, name="b")]), 80, no_color=True)
    bar = t.plain.split("\n")[1]
    assert "█" in bar and "▓" in bar  # slot 0 and slot 1 differ without colour


def test_colours_stable_by_slot():
    assert len(set(SLOT_COLOURS)) == abi.SLOT_COUNT
    assert slot_colour(3) == slot_colour(3 + abi.SLOT_COUNT)
    assert slot_rgb(0) == (0x4F, 0xC3, 0xF7)


# -- table cells ---------------------------------------------------------------


def test_row_cells():
    s = snap([slot(0, 2, name="eng", busy=0.42), slot(1, 1, active=0), slot(2, 1, age_s=12)])
    rows = {p.slot: p for p in s.peers}
    managed = PeerRow("k", rows[0], True, 1234.0, EngineInfo(state="running", tok_s=55.55))
    assert len(row_cells(managed)) == len(COLUMNS)
    got = {c.key: cell_text(managed, c.key) for c in COLUMNS}
    assert got == {
        "slot": "■ 0",
        "pid": "1000",
        "name": "eng",
        "weight": "2",
        "share": "100.0",
        "busy": "42",
        "status": "active",
        "toks": "55.5",
        "engine": "running",
        "hb": "<1s",
        "vram": "1234M",
        "gpu": "k",
    }
    foreign = PeerRow("k", rows[1])
    assert [cell_text(foreign, k) for k in ("status", "engine", "vram", "toks")] == ["idle", "read-only", "-", "-"]
    dead = PeerRow("k", rows[2], True)
    assert [cell_text(dead, k) for k in ("status", "hb", "engine")] == ["dead", "12s", "-"]


def test_name_column_takes_the_width_left():
    assert name_width(200) == 28
    assert name_width(118) >= 12  # 120 columns: everything fits
    narrow = name_width(78)  # 80 columns: at least every column up to ENGINE
    assert 10 <= narrow <= 12


# -- history and plot data -----------------------------------------------------


def model_at(t_s: float, share_weights=(2, 1), tok=(None, None)) -> DashboardModel:
    now = NOW + int(t_s * 1e6)
    s = snap([slot(i, w, now=now) for i, w in enumerate(share_weights)], now=now)
    rows = tuple(PeerRow("k", p, True, None, EngineInfo(tok_s=tok[p.slot])) for p in s.peers)
    return DashboardModel(now, (GpuView(s, None, rows, achieved_shares(rows)),))


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


def test_achieved_share_needs_every_members_tok_s():
    assert achieved_shares(model_at(0, tok=(None, 10.0)).gpus[0].rows) == ()
    got = dict(achieved_shares(model_at(0, tok=(30.0, 10.0)).gpus[0].rows))
    assert got == {0: 75.0, 1: 25.0}
    h = History()
    for t in range(10):
        h.add(model_at(t, tok=(30.0, 10.0)))
    a = h.series("k", "achieved", NOW / 1e6 + 9, 120, 60)
    c = h.series("k", "configured", NOW / 1e6 + 9, 120, 60)
    assert a[0].ys[-1] == 75.0 and c[0].ys[-1] == 66.7


def test_fixed_source():
    with pytest.raises(ValueError):
        FixedSource([])
    ms = [model_at(0), model_at(1)]
    src = FixedSource(ms)
    assert src.prime() == ms[:1] and src.collect() is ms[1] and src.collect() is ms[1]


# -- the collector -------------------------------------------------------------


class FakeControl:
    ControlError = ControlError

    def __init__(self, managed: set[int], fail: set[int] = frozenset()) -> None:
        self.managed, self.fail, self.calls = managed, fail, []

    def is_managed(self, pid: int) -> bool:
        return pid in self.managed

    def request(self, pid: int, cmd: str, timeout_s: float = 3.0, **kw):
        self.calls.append((pid, cmd, timeout_s))
        if pid in self.fail:
            raise ControlError(f"engine {pid}: no reply")
        return {"ok": True, "state": "running", "tok_s": 12.5, "model": "m", "kind": "synth", "port": None}


def test_live_source_polls_status_of_managed_peers_only_and_not_every_tick(tmp_path, monkeypatch):
    from gpushare_tui.core import segment
    from gpushare_tui.core.registry import Membership

    monkeypatch.setattr(segment, "SHM_DIR", str(tmp_path))
    ms = [Membership("live", 1.0, f"m{i}", pid=920_000 + i, log=lambda _m: None) for i in range(3)]
    for m in ms:
        m.join()
    nvml_calls = []

    def stats(key):
        nvml_calls.append(key)
        return DeviceStats(name="X", pid_mem_mib=((920_000, 512.0),)) if key == "live" else None

    clock = [NOW]
    ctl = FakeControl(managed={920_000, 920_001}, fail={920_001})
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
        src.collect()
        assert len(ctl.calls) == 2  # cached until status_every_s
        src.forget_status(920_000)
        src.collect()
        assert [p for p, _c, _t in ctl.calls[2:]] == [920_000]
        assert nvml_calls == ["live"] * 3
    finally:
        src.close()
        for m in ms:
            m.leave()


def test_live_source_backs_off_nvml_for_keys_that_are_not_devices(tmp_path, monkeypatch):
    from gpushare_tui.core import segment
    from gpushare_tui.core.registry import Membership

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


# -- launch form -----------------------------------------------------------------


def test_validate_launch_builds_the_launch_spec(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    spec, errors = validate_launch(
        {
            "binary": "/bin/true",
            "model": str(model),
            "weight": "0.5",
            "gpu_key": "GPU-1",
            "extra": "--ctx-size 8192 --flag 'a b'",
        }
    )
    assert errors == {}
    assert spec == LaunchSpec(
        ("/bin/true", "-m", str(model), "--ctx-size", "8192", "--flag", "a b"), "GPU-1", 0.5, name=None
    )
    _, errors = validate_launch(
        {"binary": "/bin/true", "model": str(model), "weight": "1", "gpu_key": "k", "name": "é" * 25}
    )
    assert "48 bytes" in errors["name"]


def test_launch_result_summary():
    reply = LaunchReply(4242, 8081, "127.0.0.1", "/tmp/e.log", 0, 77, "/tmp/s.log")
    assert LaunchResult(reply).summary() == (
        "engine pid 4242 port 8081 (slot 0)\nengine log /tmp/e.log\nsupervisor pid 77 log /tmp/s.log"
    )
    err = LaunchResult(error="engine exited", log_tail="\n".join(f"l{i}" for i in range(20)))
    lines = err.summary().splitlines()
    assert not err.ok and lines[0] == "engine exited" and lines[-1] == "l19" and len(lines) == 8
    assert LaunchResult(error="no such binary").summary() == "no such binary"


def test_text_is_text():
    assert isinstance(row_cells(PeerRow("k", snap([slot(0, 1)]).peers[0]))[0], Text)
