"""Pure parts of the dashboard's UI: weights, timeline, colours, table cells, the launch form."""

from __future__ import annotations

from slots import NOW, slot, snap

from gpushare_tui.app import nudged_weight
from gpushare_tui.core import abi
from gpushare_tui.core.launcher import LaunchReply, LaunchSpec
from gpushare_tui.dashboard.columns import COLUMNS, GAP, NAME_KEEP, NAME_WIDTH, fit_columns
from gpushare_tui.dashboard.model import EngineInfo, PeerRow, speed_pct
from gpushare_tui.widgets.launch_form import LaunchResult, validate_launch
from gpushare_tui.widgets.palette import SLOT_COLOURS, slot_colour, slot_rgb
from gpushare_tui.widgets.peers_table import cell_text, row_cells
from gpushare_tui.widgets.timeline import bar_line, cursor_line

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
    head, bar = cursor_line(s, 78, now).plain, bar_line(s, 78).plain  # a 60-column bar + the 18-column legend
    assert len(bar) == 78 and bar.startswith(" big 80ms")
    assert bar.index(" small") == 40  # 80 ms of 120 ms -> column 40 of 60
    assert bar[60:].strip() == "period 120 ms"
    assert head.index("▼") == 45  # 90/120 of 60 columns
    assert "now: small may run" in head


def test_timeline_without_schedule():
    alone = bar_line(snap([slot(0, 1, name="solo")]), 50).plain
    assert "solo" in alone and "unthrottled" in alone
    idle = bar_line(snap([slot(0, 1, active=0)]), 50).plain
    assert "no active members" in idle


def test_timeline_no_color_uses_fill_patterns():
    bar = bar_line(snap([slot(0, 1, name="a"), slot(1, 1, name="b")]), 80, no_color=True).plain
    assert "█" in bar and "▓" in bar  # slot 0 and slot 1 differ without colour


def test_colours_stable_by_slot():
    assert len(set(SLOT_COLOURS)) == abi.SLOT_COUNT
    assert slot_colour(3) == slot_colour(3 + abi.SLOT_COUNT)
    assert slot_rgb(0) == (0x4F, 0xC3, 0xF7)


# -- table cells ---------------------------------------------------------------


def test_row_cells():
    s = snap([slot(0, 2, name="eng", busy=0.42), slot(1, 1, active=0), slot(2, 1, age_s=12)])
    rows = {p.slot: p for p in s.peers}
    managed = PeerRow("k", rows[0], True, 1234.0, EngineInfo(state="running", tok_s=55.55, solo_tok_s=111.1))
    assert len(row_cells(managed)) == len(COLUMNS)
    got = {c.key: cell_text(managed, c.key) for c in COLUMNS}
    assert got == {
        "slot": "■ 0",
        "pid": "1000",
        "name": "eng",
        "weight": "2",
        "share": "100.0",
        "busy": "42",
        "ach": "100",
        "status": "active",
        "toks": "55.5",
        "speed": "50",
        "engine": "running",
        "time": "-",
        "energy": "-",
        "hb": "<1s",
        "vram": "1234M",
        "gpu": "k",
    }
    foreign = PeerRow("k", rows[1])
    assert [cell_text(foreign, k) for k in ("status", "engine", "vram", "toks", "speed")] == [
        "idle", "read-only", "-", "-", "-"
    ]  # fmt: skip
    no_solo = PeerRow("k", rows[0], True, None, EngineInfo(state="running", tok_s=55.55))
    assert cell_text(no_solo, "speed") == "-"  # solo rate not known yet
    assert cell_text(foreign, "ach") == "-"  # idle: no member of the schedule
    dead = PeerRow("k", rows[2], True)
    assert [cell_text(dead, k) for k in ("status", "hb", "engine")] == ["dead", "12s", "-"]


def test_columns_fit_the_width_dropping_the_least_useful_first():
    """Every column that matters fits at 80 terminal columns (78 inside the border, 77 with a vertical
    scrollbar); GPU goes first, then VRAM, then HB, while NAME would get less than NAME_KEEP; NAME takes
    what is left. A column with nothing to show (VRAM without NVML) goes before any other."""
    must = [c.key for c in COLUMNS if not c.drop]
    acct = {"energy", "time"}  # accounting: ENERGY goes first, then TIME
    cases = (
        (77, set(), {"gpu", "vram", "hb"} | acct),
        (85, set(), {"gpu", "vram"} | acct),
        (97, set(), {"gpu"} | acct),
    )
    cases += ((104, set(), acct), (111, set(), {"energy"}), (117, set(), set()), (200, {"energy"}, {"energy"}))
    cases += ((200, set(), set()), (200, {"vram"}, {"vram"}), (97, {"vram"}, {"vram"} | acct))  # no VRAM: room for GPU
    for available, empty, dropped in cases:
        shown, name = fit_columns(available, frozenset(empty))
        keys = [c.key for c in shown]
        assert set(must) <= set(keys) and {c.key for c in COLUMNS} - set(keys) == dropped, available
        assert sum(c.width + GAP for c in shown if c.key != "name") + name + GAP <= available
        assert name >= (NAME_KEEP if available >= 77 else NAME_WIDTH[0])
    assert fit_columns(200)[1] == NAME_WIDTH[1]
    assert [c.key for c in fit_columns(40)[0]] == must  # narrower still: only the optional ones go


def test_speed_pct_is_tok_s_over_solo():
    assert speed_pct(50.0, 200.0) == 25.0
    assert speed_pct(None, 200.0) is None and speed_pct(50.0, None) is None and speed_pct(50.0, 0.0) is None
    assert EngineInfo(tok_s=30.0, solo_tok_s=60.0).speed_pct == 50.0


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


def test_accounting_cells():
    from gpushare_tui.core.accounting import SOURCE_BUSY_PPM, SOURCE_COUNTER, PeerAccount
    from gpushare_tui.dashboard.columns import fmt_busy_time, fmt_wh

    assert [fmt_busy_time(s) for s in (None, 0.4, 59.9, 3723.5, 999 * 3600 + 1, 1000 * 3600, 2.0**64 / 1e6)] == [
        "-", "0:00:00", "0:00:59", "1:02:03", "999:00:01", "1000h", "huge"
    ]  # fmt: skip
    assert [fmt_wh(j) for j in (None, 0.0, 36.0, 3600 * 123.4, 3600 * 123_456)] == ["-", "0.00", "0.01", "123", "123k"]
    p = snap([slot(0, 1)]).peers[0]
    assert cell_text(PeerRow("k", p, account=PeerAccount(SOURCE_COUNTER, 61.0, 7200.0)), "time") == "0:01:01"
    assert cell_text(PeerRow("k", p, account=PeerAccount(SOURCE_COUNTER, 61.0, 7200.0)), "energy") == "2.00"
    assert cell_text(PeerRow("k", p, account=PeerAccount(SOURCE_BUSY_PPM, 61.0, None)), "time") == "~0:01:01"
    assert cell_text(PeerRow("k", p, account=PeerAccount(SOURCE_BUSY_PPM, None, None)), "time") == "-"
