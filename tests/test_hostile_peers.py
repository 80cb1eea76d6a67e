"""Hostile slot contents and clock steps: ghosts with future heartbeats, stepped wall clocks,
escape sequences in names, absurd values. Each of these broke the landed main."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from gpushare_tui.core.host.clock import wall_us
from gpushare_tui.core.host.text import printable
from gpushare_tui.core.observe.snapshot import build_gpu_snapshot
from gpushare_tui.core.pacing.pacer import Pacer
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.registry.segment import Segment
from testkit.cli import cli_argv
from testkit.wait import read_json_file, wait_for

DEAD_PID = 4_000_321  # above the default pid_max range of this box: never a live process
HOUR_US = 3_600_000_000
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
EVIL_NAME = "\x1b]2;OWNED\x07\x1b[2J"


def _ghost(seg: Segment, slot: int, heartbeat_us: int, *, name: str = "ghost", busy_ppm: int = 0) -> None:
    seg.cas_pid(slot, 0, DEAD_PID + slot)
    seg.write_slot_fields(
        slot,
        boot_us=1,
        weight=1.0,
        active=1,
        heartbeat_us=heartbeat_us,
        busy_ppm=busy_ppm,
        name_raw=abi.encode_name(name),
    )


# -- heartbeats in the future --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("ahead", ["hour", "int64_max"])
def test_future_heartbeat_ghost_is_dead_and_never_paces_a_lone_peer(ahead, procs, gpu_key, runtime_dir, tmp_path, cli):
    hb = wall_us() + HOUR_US if ahead == "hour" else INT64_MAX
    with Segment.create_or_attach(gpu_key) as seg:
        _ghost(seg, 1, hb)  # the real peer takes the free slot 0 (the ghost's is reclaimable too)
        status = tmp_path / "synth.json"
        p = procs.start(cli_argv("synth", "--weight", "1", "--gpu-key", gpu_key, "--status-file", str(status), "-q"))
        wait_for(lambda: (read_json_file(status) or {}).get("steps_total", 0) > 20, 30, what="synth steps")
        time.sleep(1.5)  # at least one more status write, paced (or not) against the ghost
        d = read_json_file(status)
        assert d is not None and d["slept_us"] == 0, f"the lone real peer slept {d and d['slept_us']} µs"
        report = json.loads(cli("--once", "--json", "--gpu-key", gpu_key).stdout)
        (g,) = report["gpus"]
        me, ghost = sorted(g["peers"], key=lambda q: q["slot"])
        assert (ghost["pid"], ghost["alive"], ghost["share_pct"], ghost["heartbeat_age_ms"]) == (
            DEAD_PID + 1,
            False,
            0.0,
            None,
        )
        assert me["pid"] == p.pid and me["alive"] and me["share_pct"] == 100.0 and g["period_ms"] is None


def test_slots_held_by_future_heartbeats_are_reclaimable(gpu_key) -> None:
    with Segment.create_or_attach(gpu_key) as seg:
        for i in range(abi.SLOT_COUNT):
            _ghost(seg, i, wall_us() + HOUR_US)
        with Membership(gpu_key, 1.0, "real", heartbeat_s=3600) as m:  # was: registry full
            assert m.slot == 0 and seg.read_slot(0).pid == os.getpid()


def test_heartbeat_a_little_ahead_is_alive_clock_skew() -> None:
    now = 10 * HOUR_US
    rec = abi.SlotRecord(0, 123, 0, 1, 1.0, 1, now + 2_000_000, 0, abi.encode_name("skewed"))
    assert rec.is_alive(now) and rec.is_member(now)
    assert not rec.is_alive(now - 2_000_000)  # 4 s ahead of this reader
    (p,) = build_gpu_snapshot("k", "/s", [rec], now).peers
    assert p.heartbeat_age_ms == 0.0


# -- the wall clock steps ----------------------------------------------------------------


class Clocks:
    """A wall clock that can step, and a monotonic clock that only moves forward."""

    def __init__(self) -> None:
        self.wall = wall_us()
        self.mono = 1_000_000_000

    def advance(self, us: int) -> None:
        self.wall += us
        self.mono += us


def test_wall_clock_step_back_does_not_keep_an_idle_member_active(gpu_key) -> None:
    c = Clocks()
    with Membership(gpu_key, 1.0, "step", clock_us=lambda: c.wall, mono_us=lambda: c.mono, heartbeat_s=3600) as m:
        m.mark_active()
        assert m.active
        c.wall -= HOUR_US  # NTP (or an admin) steps the clock back an hour
        c.advance(2_000_001)
        m.heartbeat()
        assert not m.active and m.segment.read_slot(m.slot).active == 0
        assert m.segment.read_slot(m.slot).heartbeat_us == c.wall  # shared fields keep the wall clock


def test_wall_clock_step_forward_does_not_drop_a_decoding_member(gpu_key) -> None:
    c = Clocks()
    with Membership(gpu_key, 1.0, "step", clock_us=lambda: c.wall, mono_us=lambda: c.mono, heartbeat_s=3600) as m:
        m.mark_active()
        c.wall += HOUR_US
        c.advance(500_000)
        m.heartbeat()
        assert m.active


def test_pacer_busy_fraction_survives_a_wall_clock_step(gpu_key) -> None:
    c = Clocks()
    with Membership(gpu_key, 1.0, "busy", clock_us=lambda: c.wall, mono_us=lambda: c.mono, heartbeat_s=3600) as m:
        pacer = Pacer(m, clock_us=lambda: c.wall, mono_us=lambda: c.mono, sleep_s=lambda s: None)
        c.wall -= HOUR_US
        for _ in range(12):  # alone: never sleeps, so busy the whole time
            c.advance(100_000)
            pacer.step_done()
        m.heartbeat()  # publishes busy_ppm
        assert m.segment.read_slot(m.slot).busy_ppm == 1_000_000


# -- untrusted names reach no terminal --------------------------------------------------


def test_printable_replaces_c0_del_c1_and_esc() -> None:
    assert printable(EVIL_NAME) == "\ufffd]2;OWNED\ufffd\ufffd[2J"
    assert printable("a\x00b\x7fc\x9bd\x85e\u00e9\u4e2d") == "a\ufffdb\ufffdc\ufffdd\ufffde\u00e9\u4e2d"
    assert printable("plain name-1.2") == "plain name-1.2"


def _evil_peer(seg: Segment, slot: int = 0) -> None:
    seg.cas_pid(slot, 0, os.getpid())
    seg.write_slot_fields(
        slot, boot_us=1, weight=1.0, active=1, heartbeat_us=wall_us(), busy_ppm=0, name_raw=abi.encode_name(EVIL_NAME)
    )


@pytest.mark.slow
def test_once_table_strips_escapes_json_keeps_them(gpu_key, cli) -> None:
    with Segment.create_or_attach(gpu_key) as seg:
        _evil_peer(seg)
        table = cli("--once", "--gpu-key", gpu_key)
        doc = cli("--once", "--json", "--gpu-key", gpu_key)
    assert table.returncode == 0 and doc.returncode == 0
    assert "\x1b" not in table.stdout and "\x07" not in table.stdout
    assert "\ufffd]2;OWNED" in table.stdout
    assert "\\u001b]2;OWNED\\u0007" in doc.stdout  # escaped in the JSON text ...
    assert json.loads(doc.stdout)["gpus"][0]["peers"][0]["name"] == EVIL_NAME  # ... and the data kept


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_dashboard_in_a_real_terminal_does_not_obey_a_peer_name(gpu_key, tmp_path) -> None:
    session = f"gst-{os.getpid()}-{gpu_key[-8:]}"
    tmux = ["tmux", "-L", session, "-f", "/dev/null"]
    with Segment.create_or_attach(gpu_key) as seg:
        _evil_peer(seg)
        cmd = " ".join(cli_argv("--gpu-key", gpu_key, "--interval", "0.2", "--readonly"))
        subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "120", "-y", "40", cmd], check=True)
        try:
            subprocess.run([*tmux, "set-option", "-t", session, "allow-rename", "on"], check=True)

            def pane() -> str:
                return subprocess.run(
                    [*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True
                ).stdout

            wait_for(lambda: "OWNED" in pane(), 30, interval=0.2, what="the dashboard showing the peer")
            time.sleep(1.0)  # a few refreshes
            title = subprocess.run(
                [*tmux, "display-message", "-p", "-t", session, "#{pane_title}"], capture_output=True, text=True
            ).stdout.strip()
            assert title != "OWNED", "a peer's name set the terminal title"
            screen = pane()
            assert "\ufffd]2;OWNED" in screen
            assert "SLOT" in screen  # not cleared by ESC[2J
        finally:
            subprocess.run([*tmux, "send-keys", "-t", session, "q"], check=False)
            time.sleep(0.5)
            subprocess.run([*tmux, "kill-server"], check=False)


# -- absurd values are clamped or marked invalid --------------------------------------


@pytest.mark.slow
def test_absurd_busy_and_heartbeat_are_not_shown_as_numbers(gpu_key, cli) -> None:
    with Segment.create_or_attach(gpu_key) as seg:
        _ghost(seg, 0, wall_us(), name="busy", busy_ppm=0xFFFFFFFF)
        _ghost(seg, 1, INT64_MIN, name="ancient")
        doc = json.loads(cli("--once", "--json", "--gpu-key", gpu_key).stdout)
        table = cli("--once", "--gpu-key", gpu_key).stdout
    busy, ancient = doc["gpus"][0]["peers"]
    assert busy["busy_pct"] == 100.0
    assert ancient["heartbeat_age_ms"] is None and not ancient["alive"]
    assert "429496" not in table and "9.2e" not in table and "9223372036854" not in table
