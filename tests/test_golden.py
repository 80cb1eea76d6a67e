"""Golden outputs: `--once --json`, the `--once` table, `/metrics` and `/gpu/peers` of one fixed model
(fixed slot records, clock, owners and modes, engine replies; no NVML, no subprocess), compared with
the files in tests/__snapshots__/test_golden/. An output-contract change shows up as a diff there:
review it, then `pytest tests/test_golden.py --snapshot-update`. JSON changes may only add keys."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from http import HTTPStatus

import pytest
from slots import NOW, slot
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from gpushare_tui.cli.once import render_table
from gpushare_tui.core.observe.accounting import GpuAccount, GpuAccountant
from gpushare_tui.core.observe.energy import nvml_reading
from gpushare_tui.core.observe.gpu import DeviceStats
from gpushare_tui.core.observe.latency import LatencyRecorder, LatencyReport
from gpushare_tui.core.observe.snapshot import GpuSnapshot, SegmentProblem, build_gpu_snapshot
from gpushare_tui.core.pacing.control import SignalLateness
from gpushare_tui.core.pacing.governor import SloReport
from gpushare_tui.core.registry import abi
from gpushare_tui.dashboard.model import DashboardModel, EngineInfo, GpuView, PeerRow, achieved_shares, unmanaged_view
from gpushare_tui.dashboard.remote import gpu_from_json
from gpushare_tui.dashboard.report import ReportData, report_json
from gpushare_tui.serve.exposition import render_metrics
from gpushare_tui.serve.peers import peers_reply

HOSTNAME = "golden-host"
EXT1_CHAT = abi.FLAG_EXT1 | abi.FLAG_INTERACTIVE | abi.FLAG_DEMAND | abi.FLAG_PRIORITY
REMOTE = "http://10.0.0.5:9464"
DOWN = "http://10.0.0.9:9464"


class JsonSnapshot(SingleFileSnapshotExtension):
    _write_mode = WriteMode.TEXT
    _file_extension = "json"


class TextSnapshot(SingleFileSnapshotExtension):
    _write_mode = WriteMode.TEXT
    _file_extension = "txt"


@pytest.fixture
def golden_json(snapshot):
    return snapshot.use_extension(JsonSnapshot)


@pytest.fixture
def golden_text(snapshot):
    return snapshot.use_extension(TextSnapshot)


def _view(key: str, slots: list[abi.SlotRecord], engines: dict[int, EngineInfo], device: DeviceStats | None = None,
          owner: str = "alice", uid: int = 1000, mode: int = 0o600) -> GpuView:  # fmt: skip
    """A GpuView as LiveSource builds it: the peers in `engines` (by slot) managed, VRAM from `device`."""
    g = build_gpu_snapshot(key, f"/opencoti-gpu-{key}", slots, NOW, owner=owner, owner_uid=uid, mode=mode)
    vram = dict(device.pid_mem_mib) if device is not None else {}
    account = _account(g, device)
    rows = tuple(
        PeerRow(key, p, p.slot in engines, vram.get(p.pid), engines.get(p.slot), account.of(p)) for p in g.peers
    )
    return GpuView(g, device, rows, achieved_shares(rows), account)


ACCOUNT_SPAN_S = 10  # the fixed models' accounts: two reads this far apart, the device spent 2000 J between


def _account(g: GpuSnapshot, device: DeviceStats | None) -> GpuAccount:
    """The account LiveSource would hold after two collects ACCOUNT_SPAN_S apart: each counter peer
    busy for its busy fraction of the span, the v1 peers integrated, NVML's energy split (a device only)."""
    acc = GpuAccountant()
    span_us = ACCOUNT_SPAN_S * 1_000_000
    earlier = [replace(p, busy_total_us=max(0, p.busy_total_us - int(p.busy_pct / 100 * span_us))) for p in g.peers]
    acc.update(earlier, 0, nvml_reading(1_000_000) if device else None)
    return acc.update(g.peers, span_us, nvml_reading(3_000_000) if device else None)


def ext1(rec: abi.SlotRecord, busy_total_s: float, flags: int = 0) -> abi.SlotRecord:
    """`rec` of an Extension 1 owner (EXT1 and `flags` set) that has been busy `busy_total_s` since it joined."""
    return replace(rec, flags=abi.FLAG_EXT1 | flags, busy_total_us=int(busy_total_s * 1e6))


def golden_latency() -> LatencyReport:
    """A chat engine's last minute through its front proxy: 30 streamed replies (TTFT 120-410 ms, 20 tokens 25 ms
    apart), one 404 and one client that left before the head."""
    rec = LatencyRecorder(clock_s=lambda: 1000.0)
    for i in range(30):
        t = 1001.0 + i
        r = rec.begin(t)
        rec.head(r, t + 0.01, 200, True)
        rec.chunk(r, t + 0.01, b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')
        first = t + 0.12 + 0.01 * i
        for k in range(20):
            rec.chunk(r, first + 0.025 * k, b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n')
        rec.end(r, first + 0.5)
    for status in (404, None):
        r = rec.begin(1040.0)
        if status is not None:
            rec.head(r, 1040.0, status, False)
        rec.end(r, 1040.1)
    return rec.report(1045.0)


GOLDEN_SLO = SloReport(
    ttft_p99_ms=300, ttft_attained_pct=63.3, state="missed", weight_min=1, weight_max=8, classes="batch,interactive",
    reason="interactive weight 2: missed: ttft p99 410 ms > 300 (12 requests); settling after the last change",
    changed_ago_s=4.0, paused_s=0.0,
)  # fmt: skip


def fixed_model() -> DashboardModel:
    """Two segments and one unreadable: managed engines (llama-server with lateness, synth, one whose
    control socket timed out), a foreign idle peer, a dead one, an invalid weight, an unthrottled GPU."""
    llama = EngineInfo(
        state="running", tok_s=42.5, solo_tok_s=50.0, model="qwen2.5-7b.gguf", owner_config="/home/alice/up.toml",
        config_weight=2.0, kind="llama-server", port=8081, lateness=SignalLateness(120, 150, 900, 2000),
        log="/home/alice/.local/state/gpushare-tui/logs/chat.log", latency=golden_latency(), slo=GOLDEN_SLO,
    )  # fmt: skip
    synth = EngineInfo(state="running", tok_s=10.0, solo_tok_s=None, model="synthetic", kind="synth")
    mute = EngineInfo(state="running", error="no reply to status within 0.3 s")
    device = DeviceStats("NVIDIA H200", 87.0, 40960.0, 143771.0, 41.0, 300.0, ((2100, 20480.0), (2101, 1024.0)))
    a = _view(
        "golden-a",
        [
            ext1(slot(0, 2.0, pid=2100, name="chat", busy=0.6), busy_total_s=3723.5),
            # an Extension-1 batch peer with work in flight, put back on §5 by the v1 member (slot 3, "mute")
            ext1(slot(1, 1.0, pid=2101, name="模型-batch", busy=0.2), busy_total_s=59.0, flags=abi.FLAG_DEMAND),
            slot(2, 0.5, active=0, pid=2102, name='say "hi"', busy=0.0),
            slot(3, 1.0, pid=2103, name="mute", busy=0.0),
            slot(4, 1.0, pid=2104, name="ghost", age_s=75.0, busy=0.9),
        ],
        {0: llama, 1: synth, 3: mute},
        device,
    )
    b = _view(
        "golden-b",
        [
            # an Extension-1 peer (spec §7): interactive, work in flight, holding priority
            replace(slot(0, 1.5, pid=2200, name="solo", busy=0.35), flags=EXT1_CHAT),
            slot(1, math.nan, pid=2201, name="bad-weight"),  # a v1 peer, no member: the schedule stays ext1
        ],
        {},
        owner="bob",
        uid=1001,
        mode=0o666,
    )
    idle = _view("golden-idle", [slot(0, 1.0, pid=2300, name="gone", age_s=600.0)], {})
    errors = (SegmentProblem("/opencoti-gpu-golden-bad", "bad magic"),)
    return DashboardModel(NOW, (a, b, idle), errors, mono_us=123_456_789)


def _dumps(doc: dict) -> str:
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"  # allow_nan: never NaN/inf


def remote_report() -> ReportData:
    """This host and two `serve` endpoints (one answering with golden-b, one down), as `--remote` collects;
    3 segments of other users on this host over the cap."""
    model = fixed_model()
    here = ReportData.of_model(model, HOSTNAME, HOSTNAME)
    views = [*here.views, (REMOTE, unmanaged_view(model.gpus[1].snapshot))]
    errors = [*here.errors, (DOWN, SegmentProblem("", "timeout after 2 s"))]
    return ReportData(HOSTNAME, NOW, views, errors, foreign_not_shown=3, foreign_shown_max=64)  # over the cap


def test_once_json(golden_json) -> None:
    assert _dumps(report_json(ReportData.of_model(fixed_model(), HOSTNAME))) == golden_json


def test_once_json_remote(golden_json) -> None:
    assert _dumps(report_json(remote_report())) == golden_json


def test_once_table(golden_text) -> None:
    assert render_table(ReportData.of_model(fixed_model(), HOSTNAME), show_idle=False) + "\n" == golden_text


def test_once_table_all_remote(golden_text) -> None:
    assert render_table(remote_report(), show_idle=True) + "\n" == golden_text


def test_metrics(golden_text) -> None:
    assert render_metrics(fixed_model).decode() == golden_text


def test_gpu_peers(golden_json) -> None:
    status, doc = peers_reply(None, fixed_model, HOSTNAME)
    assert status == HTTPStatus.OK
    assert doc == report_json(ReportData.of_model(fixed_model(), HOSTNAME))  # the very `--once --json` report
    assert _dumps(doc) == golden_json


def test_gpu_peers_one_key(golden_json) -> None:
    status, doc = peers_reply(["nope", "golden-a"], fixed_model, HOSTNAME)  # the last value wins
    assert status == HTTPStatus.OK
    assert doc == report_json(ReportData.of_model(fixed_model(), HOSTNAME))["gpus"][0]  # its entry in the report
    assert {"gpu_key", "period_ms", "self", "peers"} <= set(doc)  # the seed's shape (spec §6)
    assert _dumps(doc) == golden_json


def test_gpu_peers_bad_and_unknown_key() -> None:
    assert peers_reply(["golden-x"], fixed_model, HOSTNAME) == (
        HTTPStatus.NOT_FOUND,
        {"error": "no segment for gpu_key 'golden-x' on this host"},
    )
    status, doc = peers_reply(["../etc"], fixed_model, HOSTNAME)
    assert status == HTTPStatus.BAD_REQUEST and "invalid gpu key" in doc["error"]


def test_remote_view_reads_back_the_report() -> None:
    """What `--remote` parses of a `serve`'s `/gpu/peers` is the snapshot the report was built from
    (`managed` and `engine` are that host's: its rows are read-only here)."""
    model = fixed_model()
    doc = json.loads(_dumps(report_json(ReportData.of_model(model, HOSTNAME))))
    # the slots' raw busy counter is not in the report (each peer's account is: busy_total_s ...)
    raw = [replace(v.snapshot, peers=tuple(replace(p, busy_total_us=0) for p in v.snapshot.peers))
           for v in model.gpus]  # fmt: skip
    assert [gpu_from_json(g, NOW) for g in doc["gpus"]] == raw
