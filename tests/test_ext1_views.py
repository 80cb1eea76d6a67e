"""Extension 1 (spec §7) in every view: each peer's class, demand and priority, and whether the segment
runs the Extension-1 schedule or is put back on §5 ("v1 compat") by a member without it — in the
snapshot, the `--once` JSON and table, the dashboard (units and a pilot), `/metrics` and `--remote`."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from slots import NOW, slot, snap

from gpushare_tui.app import DashboardApp
from gpushare_tui.core.registry import abi
from gpushare_tui.core.schedule.ext1 import decide
from gpushare_tui.dashboard.columns import class_text, schedule_note
from gpushare_tui.dashboard.model import DashboardModel, GpuView, PeerRow, achieved_shares
from gpushare_tui.dashboard.remote import gpu_from_json
from gpushare_tui.dashboard.report import ReportData, gpu_json, report_json
from gpushare_tui.dashboard.source import FixedSource
from gpushare_tui.serve.exposition import render_metrics
from gpushare_tui.widgets.gpu_panel import info_line
from gpushare_tui.widgets.peers_table import PeersTable, cell_text
from testkit.wait import wait_for

EXT1, INTER, DEMAND, PRIO = abi.FLAG_EXT1, abi.FLAG_INTERACTIVE, abi.FLAG_DEMAND, abi.FLAG_PRIORITY
CHAT = EXT1 | INTER | DEMAND | PRIO  # an interactive peer with work in flight claiming priority


def ext1_slot(i: int, weight: float, flags: int, busy: float = 0.1, active: int = 1, **kw) -> abi.SlotRecord:
    return replace(slot(i, weight, active=active, busy=busy, **kw), flags=flags)


def view(slots: list[abi.SlotRecord], key: str = "k") -> GpuView:
    s = snap(slots, key=key)
    rows = tuple(PeerRow(key, p) for p in s.peers)
    return GpuView(s, None, rows, achieved_shares(rows))


def test_ext1_mode_needs_every_member_to_have_ext1() -> None:
    batch = ext1_slot(1, 1, EXT1 | DEMAND)
    assert decide([ext1_slot(0, 1, CHAT), batch], NOW).mode != "v1" and decide([batch], NOW).v1_peer is None
    v1 = slot(2, 1)  # a v1 member (active, flags 0)
    assert decide([ext1_slot(0, 1, CHAT), batch, v1], NOW).mode == "v1" and decide([batch, v1], NOW).v1_peer == 2
    assert (
        decide([batch, slot(2, 1, active=0), slot(3, 1, age_s=10)], NOW).mode != "v1"
    )  # idle or dead v1 peers: no members
    assert decide([slot(0, 1)], NOW).mode == "v1" and decide([slot(3, 1), slot(0, 1)], NOW).v1_peer == 0  # the lowest
    assert view([]).snapshot.schedule_mode == view([slot(0, 1)]).snapshot.schedule_mode == "v1"  # no EXT1 peer


def test_priority_is_held_within_the_budget_only() -> None:
    """Rule 2: INTERACTIVE with PRIORITY set, and its busy_ppm within 1e6 × its plain share among the
    DEMAND members (S = 1/(1+3) = 0.25 here); the bit alone, a batch peer or one without DEMAND never."""
    batch = ext1_slot(1, 3, EXT1 | DEMAND, busy=0.7)
    assert set(decide([ext1_slot(0, 1, CHAT, busy=0.25), batch], NOW).priority) == {0}  # at the budget: still holds
    assert set(decide([ext1_slot(0, 1, CHAT, busy=0.26), batch], NOW).priority) == set()  # over it: lost
    assert set(decide([ext1_slot(0, 1, CHAT & ~PRIO, busy=0.0), batch], NOW).priority) == set()  # bit cleared
    assert set(decide([ext1_slot(0, 1, EXT1 | DEMAND | PRIO), batch], NOW).priority) == set()  # batch: no claim
    assert set(decide([ext1_slot(0, 1, CHAT & ~DEMAND), batch], NOW).priority) == set()  # no work: no member
    # the share counts DEMAND members only: an idle batch peer leaves the interactive one the whole device
    assert set(decide([ext1_slot(0, 1, CHAT, busy=0.9), ext1_slot(1, 3, EXT1)], NOW).priority) == {0}
    two = [ext1_slot(0, 1, CHAT, busy=0.2), ext1_slot(1, 1, CHAT, busy=0.3), ext1_slot(2, 2, EXT1 | DEMAND)]
    assert set(decide(two, NOW).priority) == {0}  # many claimants: each against its own budget (0.25)


def test_snapshot_and_json_carry_class_demand_priority_and_the_mode() -> None:
    v = view([ext1_slot(0, 1, CHAT), ext1_slot(1, 3, EXT1 | DEMAND, busy=0.6), slot(2, 1, active=0)])
    g = v.snapshot
    assert (g.schedule_mode, g.v1_peer, g.priority_slots) == ("priority", None, (0,))  # slot 0 runs first
    assert [(p.klass, p.demand, p.priority) for p in g.peers] == [
        ("interactive", True, True),
        ("batch", True, False),
        (None, None, None),  # a v1 peer: null
    ]
    doc = json.loads(json.dumps(gpu_json(v)))
    assert (doc["schedule_mode"], doc["v1_peer"]) == ("priority", None)
    assert [(p["class"], p["demand"], p["priority"]) for p in doc["peers"]] == [
        ("interactive", True, True),
        ("batch", True, False),
        (None, None, None),
    ]
    assert "klass" not in doc["peers"][0]
    assert gpu_from_json(doc, NOW) == g  # `--remote` reads back what `/gpu/peers` says
    compat = view([ext1_slot(0, 1, CHAT), slot(1, 1)]).snapshot  # a v1 member: everyone on §5
    assert (compat.schedule_mode, compat.v1_peer) == ("v1", 1)
    assert compat.peers[0].priority is False  # nobody holds priority on §5, whatever its bit says


def test_remote_reads_ext1_keys_tolerantly() -> None:
    doc = gpu_json(view([ext1_slot(0, 1, CHAT)]))
    hostile = {**doc, "schedule_mode": "turbo", "v1_peer": 99}
    hostile["peers"] = [{**doc["peers"][0], "class": "root", "demand": 1, "priority": "yes"}]
    g = gpu_from_json(hostile, NOW)
    assert (g.schedule_mode, g.v1_peer) == ("v1", None)
    assert (g.peers[0].klass, g.peers[0].demand, g.peers[0].priority) == (None, None, None)
    old = {k: v for k, v in doc.items() if k not in ("schedule_mode", "v1_peer")}  # a serve from before issue 20
    old["peers"] = [{k: v for k, v in doc["peers"][0].items() if k not in ("class", "demand", "priority")}]
    assert gpu_from_json(old, NOW).peers[0].klass is None


def test_cells_and_notes() -> None:
    v = view([ext1_slot(0, 1, CHAT), ext1_slot(1, 1, EXT1 | DEMAND), ext1_slot(2, 1, EXT1 | INTER), slot(3, 1, 0)])
    assert [class_text(r) for r in v.rows] == ["int*", "bat+", "int", "v1"]
    assert [cell_text(r, "class") for r in v.rows] == ["int*", "bat+", "int", "v1"]
    note = "interactive first: slot 0 has priority"  # in words: no "ext1" jargon on the dashboard
    assert schedule_note(v.snapshot) == note and note in info_line(v).plain
    no_claim = view([ext1_slot(0, 1, EXT1 | DEMAND), ext1_slot(1, 1, EXT1 | INTER)])
    assert schedule_note(no_claim.snapshot) == "interactive first"
    forced = view([ext1_slot(0, 1, CHAT), slot(4, 1)])
    off = "classes off: slot 4 is an older (v1) peer"
    assert schedule_note(forced.snapshot) == off and off in info_line(forced).plain
    assert schedule_note(view([slot(0, 1), slot(1, 2)]).snapshot) == ""  # a v1-only segment: nothing to explain


def test_once_table_and_metrics() -> None:
    from gpushare_tui.cli.once import render_table

    v = view([ext1_slot(0, 1, CHAT), slot(1, 1)], key="mix")
    model = DashboardModel(NOW, (v,))
    table = render_table(ReportData("h", NOW, [(None, v)]))
    assert "schedule classes off: slot 1 is an older (v1) peer" in table.splitlines()[0]
    assert table.splitlines()[2].split()[-1] == "int+" and table.splitlines()[3].split()[-1] == "v1"
    text = render_metrics(lambda: model).decode()
    labels = 'class="interactive",gpu_key="mix",name="p0",pid="1000",slot="0",user=""'  # user: not verifiable here
    assert f"gpushare_peer_demand{{{labels}}} 1.0" in text
    assert f"gpushare_peer_priority{{{labels}}} 0.0" in text  # v1 compat: no priority
    demand_lines = [line for line in text.splitlines() if line.startswith("gpushare_peer_demand{")]
    assert len(demand_lines) == 1  # the v1 peer (slot 1) has no demand series
    assert 'gpushare_schedule_ext1{gpu_key="mix"} 0.0' in text
    assert report_json(ReportData("h", NOW, [(None, v)]))["gpus"][0]["v1_peer"] == 1


def test_pilot_shows_class_and_v1_compat() -> None:
    """The dashboard at 160 columns: a CLS cell per peer and the GPU line saying who forces §5."""
    v = view([ext1_slot(0, 1, CHAT), ext1_slot(1, 1, EXT1 | DEMAND), slot(2, 1)], key="pilot")

    async def main() -> tuple[list[str], str]:
        app = DashboardApp(FixedSource([DashboardModel(NOW, (v,))]), interval_s=3600)
        async with app.run_test(size=(160, 40)) as pilot:
            table = app.query_one(PeersTable)
            while table.row_count < 3:
                await pilot.pause(0.02)
            await pilot.pause()
            lines = [table.render_line(i).text for i in range(4)]
            panel = " ".join(w.render_line(0).text for w in app.query("InfoLine"))  # type: ignore[attr-defined]
            return lines, panel

    lines, panel = asyncio.run(main())
    assert "CLS" in lines[0].split()
    assert [line.split()[-1] for line in lines[1:]] == ["int+", "bat+", "v1"]  # v1 compat: nobody holds priority
    assert "classes off: slot 2 is an older (v1) peer" in panel


@pytest.mark.slow
def test_a_real_v1_peer_forces_v1_compat_until_it_leaves(procs, cli, gpu_key: str, runtime_dir: str) -> None:
    """The independent v1 writer (tests/raw_writer.py: flags 0) beside an Extension-1 peer: `--once --json`
    says schedule v1 and names the writer's slot; once the writer is dead, ext1 again."""
    from serve_env import start_writer

    from gpushare_tui import GpuShare

    writer = start_writer(procs, gpu_key, "1:v1-engine")
    # busy(): DEMAND held for the block (GpuShare drops it 100 ms after the last pace() otherwise)
    with GpuShare(name="chat", gpu_key=gpu_key, klass="interactive", control=False) as share, share.busy():
        share.active()

        def gpu() -> dict:
            r = cli("--once", "--json", "--gpu-key", gpu_key)
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout)["gpus"][0]

        g = gpu()
        assert (g["schedule_mode"], g["v1_peer"]) == ("v1", 0)
        peers = {p["slot"]: p for p in g["peers"]}
        assert (peers[0]["class"], peers[0]["demand"], peers[0]["priority"]) == (None, None, None)
        assert (peers[share.slot]["class"], peers[share.slot]["demand"]) == ("interactive", True)
        table = cli("--once", "--gpu-key", gpu_key).stdout
        assert "schedule classes off: slot 0 is an older (v1) peer" in table
        writer.kill()
        writer.wait()
        wait_for(lambda: gpu()["schedule_mode"] != "v1", 15, what="the v1 peer to die (3 s) and ext1 to resume")
        assert gpu()["v1_peer"] is None
