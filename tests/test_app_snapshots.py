"""Dashboard snapshots (pytest-textual-snapshot): fixed data, a frozen clock, fixed sizes.

`fixed_models()` builds two minutes of deterministic history through the real
core code (`build_gpu_snapshot` from SlotRecords), so windows, shares and the
period are the ones the schedule computes. Update the SVGs with
`pytest tests/test_app_snapshots.py --snapshot-update` and look at them.
"""

from __future__ import annotations

import math
import os
import time

import pytest
from textual.widgets import Input

from gpushare_tui.app import DashboardApp
from gpushare_tui.core.observe.gpu import DeviceStats
from gpushare_tui.core.observe.snapshot import SegmentProblem, build_gpu_snapshot
from gpushare_tui.core.registry import abi
from gpushare_tui.dashboard.model import DashboardModel, EngineInfo, GpuView, PeerRow, achieved_shares
from gpushare_tui.dashboard.source import FixedSource

pytestmark = pytest.mark.slow

NOW_US = 1_767_225_600_000_000 + 13 * 3_600_000_000 + 37 * 60_000_000 + 42_000_000 + 61_000  # 13:37:42 UTC
GPU_A = "GPU-3f9c2a4e-7d1b-4c55-9e0a-5b2f8c1d6e77"
GPU_B = "cpu-lab"

# slot, pid, name, weight, active, managed, tok/s at full share, vram MiB, heartbeat age s, state
PEERS_A = [
    (0, 41237, "llama-3.1-8b", 2.0, True, True, 96.0, 9120.0, 0.2, "running"),
    (1, 41290, "qwen2.5-7b", 1.0, True, True, 94.0, 8230.0, 0.4, "running"),
    (2, 41355, "mistral-7b", 1.0, True, True, 98.0, 7400.0, 0.1, "running"),
    (3, 38800, "ollama", 1.0, False, False, None, 15020.0, 0.3, None),
    (5, 40001, "crashed-eng", 1.0, True, True, None, None, 12.5, None),
]
PEERS_B = [
    (0, 52011, "embed-small", 1.0, True, True, 310.0, None, 0.2, "running"),
    (1, 52040, "reranker", 3.0, True, False, None, None, 0.3, None),
]


def _slots(peers, now_us: int, t_s: float, weight_of=None) -> list[abi.SlotRecord]:
    out = []
    for slot, pid, name, w, active, _m, _tok, _vram, age, _state in peers:
        busy = 0 if not active else int(1e6 * (0.55 + 0.35 * math.sin(t_s / 9 + slot)))
        w = weight_of(slot, w) if weight_of else w
        out.append(
            abi.SlotRecord(
                slot,
                pid,
                2,
                1_767_000_000_000_000 + pid,
                abi.to_f32(w),
                int(active),
                now_us - int(age * 1e6),
                busy,
                abi.encode_name(name),
            )
        )
    return out


def _rows(key: str, snap, peers, t_s: float) -> tuple[PeerRow, ...]:
    by_slot = {p[0]: p for p in peers}
    rows = []
    for p in snap.peers:
        _s, _pid, _n, _w, _a, managed, tok, vram, _age, state = by_slot[p.slot]
        engine = None
        if managed and p.alive:
            wobble = 1 + 0.04 * math.sin(t_s / 5 + p.slot * 2)
            tok_s = None if tok is None else round(tok * p.share_pct / 100 * wobble, 1)
            engine = EngineInfo(
                state=state, tok_s=tok_s, solo_tok_s=tok, model=f"/models/{p.name}.gguf", kind="llama-server"
            )  # solo: its rate alone, so SPD% is about its share
        rows.append(PeerRow(key, p, managed, vram, engine))
    return tuple(rows)


def fixed_model(now_us: int) -> DashboardModel:
    t_s = (now_us - NOW_US) / 1e6

    def weight_a(slot: int, w: float) -> float:
        return 1.0 if slot == 0 and t_s < -60 else w  # llama's weight went 1 -> 2 a minute ago

    snap_a = build_gpu_snapshot(GPU_A, f"/opencoti-gpu-{GPU_A}", _slots(PEERS_A, now_us, t_s, weight_a), now_us)
    snap_b = build_gpu_snapshot(GPU_B, f"/opencoti-gpu-{GPU_B}", _slots(PEERS_B, now_us, t_s), now_us)
    dev = DeviceStats(
        name="NVIDIA L40S",
        util_pct=93.0,
        mem_used_mib=39770.0,
        mem_total_mib=46068.0,
        temperature_c=67.0,
        power_w=284.0,
        pid_mem_mib=tuple((p[1], p[7]) for p in PEERS_A if p[7] is not None),
    )
    rows_a = _rows(GPU_A, snap_a, PEERS_A, t_s)
    rows_b = _rows(GPU_B, snap_b, PEERS_B, t_s)
    return DashboardModel(
        now_us,
        (GpuView(snap_a, dev, rows_a, achieved_shares(rows_a)), GpuView(snap_b, None, rows_b, achieved_shares(rows_b))),
        (SegmentProblem("/opencoti-gpu-broken", "bad magic b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00'"),),
    )


def fixed_models(seconds: int = 120) -> list[DashboardModel]:
    return [fixed_model(NOW_US - (seconds - i) * 1_000_000) for i in range(seconds + 1)]


def fixed_app(**kw) -> DashboardApp:
    # the frozen clock keeps the timelines' animated cursor on one frame
    return DashboardApp(FixedSource(fixed_models()), interval_s=3600, host="gpu-host", clock=lambda: NOW_US, **kw)


@pytest.fixture(autouse=True)
def _utc(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr("gpushare_tui.widgets.launch_form.default_binary", lambda: "llama-server")
    # the launch form checks the binary on PATH: keep snapshots independent of a local llama-server
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    monkeypatch.setenv("PATH", os.pathsep.join(d for d in dirs if not os.path.exists(os.path.join(d, "llama-server"))))
    yield
    monkeypatch.undo()
    time.tzset()


async def _loaded(pilot) -> None:
    app = pilot.app
    for _ in range(500):
        if app.models_seen:
            break
        await pilot.pause(0.01)
    await pilot.pause()
    await pilot.pause()


async def _steady_cursor(pilot) -> None:
    """Inputs' cursors shown and still: a blink (0.5 s) would make the frame depend on when it is taken."""
    for field in pilot.app.screen.query(Input):
        field.cursor_blink = False
    await pilot.pause()


def test_main_view_120x40(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(120, 40), run_before=_loaded)


def test_main_view_80x24(snap_compare):
    assert snap_compare(fixed_app(), terminal_size=(80, 24), run_before=_loaded)


def test_weight_modal(snap_compare):
    async def run_before(pilot):
        await _loaded(pilot)
        await pilot.press("w")
        await pilot.pause()
        await _steady_cursor(pilot)

    assert snap_compare(fixed_app(), terminal_size=(120, 40), run_before=run_before)


def test_help_overlay(snap_compare):
    async def run_before(pilot):
        await _loaded(pilot)
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(fixed_app(), terminal_size=(120, 40), run_before=run_before)


def test_launch_form(snap_compare):
    async def run_before(pilot):
        await _loaded(pilot)
        await pilot.press("l")
        await pilot.pause()
        await pilot.press("enter")  # submit from the focused field (a click would leave a hover state)
        await pilot.pause()
        await _steady_cursor(pilot)

    assert snap_compare(fixed_app(), terminal_size=(120, 40), run_before=run_before)


def test_sorted_by_share_second_row(snap_compare):
    async def run_before(pilot):
        await _loaded(pilot)
        await pilot.press("o", "down", "down")
        await pilot.pause()

    assert snap_compare(fixed_app(), terminal_size=(120, 40), run_before=run_before)


def test_no_color(snap_compare, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert snap_compare(fixed_app(), terminal_size=(120, 40), run_before=_loaded)


def test_readonly_empty(snap_compare):
    app = DashboardApp(FixedSource([DashboardModel(NOW_US)]), interval_s=3600, host="gpu-host", readonly=True)
    assert snap_compare(app, terminal_size=(80, 24), run_before=_loaded)
