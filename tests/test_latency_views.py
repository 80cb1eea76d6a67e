"""Where latency figures go: an engine's `status` reply (`latency`, `slo`) as every view reads it — the CLI's
`status`, `--once --json`, `/metrics` and the peers table — from honest replies and from hostile ones (typed,
bounded, never a traceback; a malformed histogram is not exported, its gauges still are)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from slots import NOW, slot, snap

from gpushare_tui.cli import control_cmds
from gpushare_tui.cli import main as cli_main
from gpushare_tui.core.host import budgets
from gpushare_tui.core.observe.latency import HistogramReport, LatencyRecorder, LatencyReport
from gpushare_tui.core.pacing.control import StatusReply
from gpushare_tui.core.pacing.governor import SloReport
from gpushare_tui.dashboard.columns import (
    COLUMN_BY_KEY,
    LATENCY_KEYS,
    fit_columns,
    fmt_ms,
    fmt_rate,
    latency_text,
    slo_text,
)
from gpushare_tui.dashboard.model import DashboardModel, EngineInfo, GpuView, PeerRow
from gpushare_tui.dashboard.report import ReportData, report_json
from gpushare_tui.serve.exposition import render_metrics
from testkit.paths import REPO


def recorded() -> LatencyReport:
    rec = LatencyRecorder(clock_s=lambda: 0.0)
    for i in range(20):
        r = rec.begin(10.0 + i)
        rec.head(r, 10.0 + i, 200, True)
        for k in range(5):
            rec.chunk(r, 10.3 + i + 0.05 * k, b'data: {"content":"x"}\n\n')
        rec.end(r, 10.6 + i)
    return rec.report(31.0)


def model_of(engine: EngineInfo) -> DashboardModel:
    g = snap([slot(0, 1.0, pid=4100, name="chat")], key="lat")
    rows = (PeerRow("lat", g.peers[0], True, None, engine),)
    return DashboardModel(NOW, (GpuView(g, None, rows),))


def test_the_reply_round_trips_with_its_histograms() -> None:
    lat = recorded()
    slo = SloReport(ttft_p99_ms=300.0, ttft_attained_pct=100.0, state="met", reason="batch weight 1: met")
    doc = json.loads(json.dumps(StatusReply(latency=lat, slo=slo).to_json()))
    back = StatusReply.from_json(doc)
    assert back.latency == lat and back.slo == slo
    assert doc["latency"]["ttft_hist"]["counts"][-1] == 20


@pytest.mark.parametrize(
    "hist",
    [
        {"le": [0.1] * (budgets.STATUS_REPLY_LIST_MAX_ITEMS + 1), "counts": [1], "sum_s": 1.0},
        {"le": ["0.1"], "counts": [1, 2], "sum_s": 1.0},
        {"le": [0.1], "counts": [1.5, 2], "sum_s": 1.0},
        {"le": [0.1], "counts": [True, 2], "sum_s": 1.0},
        {"le": {"a": 1}, "counts": [1, 2], "sum_s": 1.0},
    ],
)
def test_a_histogram_that_is_not_one_is_dropped(hist: dict) -> None:
    lat = StatusReply.from_json({"latency": {"ttft_hist": hist, "ttft_p99_ms": 40}}).latency
    assert lat is not None and lat.ttft_p99_ms == 40.0
    h = lat.ttft_hist
    assert h is None or not h.valid()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=40,
)
LATENCY_KEYS_JSON = [*LatencyReport.__dataclass_fields__, "junk"]
SLO_KEYS_JSON = [*SloReport.__dataclass_fields__, "junk"]


@given(
    st.dictionaries(st.sampled_from(LATENCY_KEYS_JSON), JSON, max_size=12) | JSON,
    st.dictionaries(st.sampled_from(SLO_KEYS_JSON), JSON, max_size=12) | JSON,
)
@settings(max_examples=300, deadline=None)
def test_any_reply_reaches_every_view_without_an_error(latency: object, slo: object) -> None:
    reply = StatusReply.from_json({"state": "running", "latency": latency, "slo": slo})
    engine = EngineInfo(state="running", latency=reply.latency, slo=reply.slo)
    model = model_of(engine)
    json.dumps(report_json(ReportData.of_model(model, "h")), allow_nan=False)
    text = render_metrics(lambda: model).decode()
    list(text_string_to_metric_families(text))  # it parses back
    row = model.rows()[0]
    for key in LATENCY_KEYS:
        assert len(COLUMN_BY_KEY[key].text(row)) <= COLUMN_BY_KEY[key].width
    if reply.latency is not None:
        latency_text(reply.latency)
    if reply.slo is not None:
        slo_text(reply.slo)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_cells_fit_whatever_the_number(x: float) -> None:
    assert len(fmt_ms(x)) <= 5 and len(fmt_rate(x)) <= 5


def test_metrics_export_well_formed_histograms_and_the_gauges() -> None:
    lat = recorded()
    model = model_of(EngineInfo(state="running", latency=lat, slo=SloReport(ttft_p99_ms=300.0, state="unreachable")))
    fams = {f.name: f for f in text_string_to_metric_families(render_metrics(lambda: model).decode())}
    ttft = fams["gpushare_engine_time_to_first_token_seconds"]
    assert ttft.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in ttft.samples if s.name.endswith("_bucket")}
    assert buckets["0.25"] == 0 and buckets["0.5"] == 20 and buckets["+Inf"] == 20 and len(buckets) == 23
    assert next(s for s in ttft.samples if s.name.endswith("_count")).value == 20
    p99 = fams["gpushare_engine_ttft_p99_seconds"].samples[0]
    assert p99.value == pytest.approx(0.3, rel=0.011) and p99.labels["name"] == "chat"
    req = {s.labels["status"]: s.value for s in fams["gpushare_engine_requests"].samples}
    assert req == {"2xx": 20, "3xx": 0, "4xx": 0, "5xx": 0, "none": 0}
    assert fams["gpushare_engine_slo_unreachable"].samples[0].value == 1
    assert fams["gpushare_gpu_slo_unreachable_engines"].samples[0].value == 1
    bad = LatencyReport(ttft_p99_ms=12.0, ttft_hist=HistogramReport((0.1, 0.2), (5, 3, 9), 1.0))
    fams = {f.name: f for f in text_string_to_metric_families(render_metrics(lambda: model_of(EngineInfo(
        state="running", latency=bad))).decode())}  # fmt: skip
    assert fams["gpushare_engine_time_to_first_token_seconds"].samples == []  # not a histogram: left out
    assert fams["gpushare_engine_ttft_p99_seconds"].samples[0].value == 0.012  # its gauge stays


def test_once_json_has_the_last_minute_and_no_histograms() -> None:
    model = model_of(EngineInfo(state="running", latency=recorded()))
    engine = report_json(ReportData.of_model(model, "h"))["gpus"][0]["peers"][0]["engine"]
    lat = engine["latency"]
    assert lat["requests"] == 20 and lat["ttft_p99_ms"] == pytest.approx(300, rel=0.011)
    assert not any(k.endswith("_hist") for k in lat) and engine["slo"] is None


def test_the_peers_table_shows_the_latency_columns_only_when_an_engine_reports_latency() -> None:
    shown, _ = fit_columns(200)
    assert LATENCY_KEYS <= {c.key for c in shown}
    shown, _ = fit_columns(200, frozenset(LATENCY_KEYS))
    assert not LATENCY_KEYS & {c.key for c in shown}
    row = model_of(EngineInfo(state="running", latency=recorded(), slo=SloReport(ttft_p99_ms=250.0))).rows()[0]
    ttft = COLUMN_BY_KEY["ttft"].text(row)
    assert ttft.endswith("!") and 297 <= int(ttft[:-1]) <= 303  # 300 ms (within the sketch's 1%), above its target
    assert COLUMN_BY_KEY["itl"].text(row) == "50" and COLUMN_BY_KEY["reqs"].text(row) == "0.65"  # 20 in 31 s
    narrow, _ = fit_columns(80)
    assert "ttft" not in {c.key for c in narrow} or "reqs" not in {c.key for c in narrow}  # REQ/S drops first


def test_the_once_table_shows_the_latency_columns_only_where_an_engine_has_figures_and_a_legend_to_read() -> None:
    """As the dashboard: TTFT99/ITL99/REQ/S in a segment's table only when one of its engines reports latency;
    the legend below says what the less obvious columns shown mean, a line each, none longer than LEGEND_WIDTH."""
    from gpushare_tui.cli.once import render_table
    from gpushare_tui.dashboard.columns import LEGEND_WIDTH, legend

    with_figures = model_of(EngineInfo(state="running", latency=recorded()))
    without = model_of(EngineInfo(state="running"))
    for model, shown in ((with_figures, True), (without, False)):
        lines = render_table(ReportData.of_model(model, "h")).splitlines()
        header = lines[1].split()
        assert ("TTFT99" in header, "ITL99" in header, "REQ/S" in header) == (shown, shown, shown), header
        assert lines[2].split()[2] == "chat" and len(lines[2].split()) == len(header)
        text = "\n".join(lines[3:])
        assert text == legend({c for c in COLUMN_BY_KEY if shown or c not in LATENCY_KEYS})
        assert ("TTFT99  time to first token p99" in text) == shown
        assert all(len(line) <= LEGEND_WIDTH for line in lines[3:]) and len(lines) >= 3 + 5
        assert lines[3].startswith("SHR%    share it gets while busy")
    # two segments, one with figures: each table has its own columns; the legend says what any of them showed
    two = DashboardModel(NOW, (*with_figures.gpus, replace(without.gpus[0], snapshot=snap([slot(0, 1.0)], key="b"))))
    lines = render_table(ReportData.of_model(two, "h")).splitlines()
    headers = [line.split() for line in lines if line.startswith(" SLOT")]
    assert ["TTFT99" in h for h in headers] == [True, False] and "TTFT99  time" in "\n".join(lines)


def test_status_prints_latency_and_the_target_in_words(monkeypatch, capsys) -> None:
    reply = StatusReply(state="running", latency=recorded(), slo=SloReport(ttft_p99_ms=300.0, ttft_attained_pct=95.0,
                        state="met", weight_min=1, weight_max=8, classes="batch,interactive",
                        reason="interactive weight 2: met")).to_json()  # fmt: skip
    monkeypatch.setattr(control_cmds, "_ask", lambda *a, **k: (4100, {"ok": True, **reply}))
    assert cli_main(["status", "4100"]) == 0
    out = capsys.readouterr().out
    words = re.sub(r"\b(29[7-9]|30[0-3])\b", "300", re.sub(r"\b(59[4-9]|60[0-6])\b", "600", out))  # within 1%
    latency = "   latency: ttft p50 300 p99 300 ms, itl p50 50 p99 50 ms, e2e p50 600 p99 600 ms; 0.65 req/s over 31 s"
    assert latency in words
    assert "       slo: ttft p99 ≤ 300 ms (95.0% within, last minute): met; weight 1-8, batch,interactive;" in out


@pytest.mark.slow
def test_a_hostile_engine_reply_in_every_view(procs, gpu_key: str, runtime_dir: str, cli) -> None:
    """A real process of ours answering `status` with hostile latency and SLO objects (tests/hostile_latency_engine.py):
    `--once --json`, `--format prometheus`, `status` and the dashboard's source all answer, exit 0, no traceback;
    the bad histograms are not exported, the good one is; escapes are printable in `status`'s words."""
    p = procs.start([sys.executable, str(REPO / "tests" / "hostile_latency_engine.py"), gpu_key],
                    stdin=subprocess.PIPE, cwd=REPO)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    try:
        r = cli("--once", "--json", "--gpu-key", gpu_key)
        assert r.returncode == 0 and "Traceback" not in r.stderr
        (peer,) = json.loads(r.stdout)["gpus"][0]["peers"]
        lat = peer["engine"]["latency"]
        assert lat["requests"] == 10**30 and lat["itl_p99_ms"] is None and lat["status_5xx_total"] is None
        assert peer["engine"]["slo"]["classes"] is None  # a list where text was
        r = cli("--once", "--format", "prometheus", "--gpu-key", gpu_key)
        assert r.returncode == 0 and "Traceback" not in r.stderr
        fams = {f.name: f for f in text_string_to_metric_families(r.stdout)}
        assert fams["gpushare_engine_time_to_first_token_seconds"].samples == []  # counts that fall
        assert fams["gpushare_engine_inter_token_latency_seconds"].samples == []  # 10,000 bounds
        assert len(fams["gpushare_engine_e2e_request_latency_seconds"].samples) == 5  # 2 bounds, +Inf, sum, count
        r = cli("status", str(p.pid))
        assert r.returncode == 0 and "Traceback" not in r.stderr and "\x1b" not in r.stdout
        assert "unreachable" in r.stdout and len(r.stdout) < 4096  # the megabyte reason is cut
    finally:
        p.stdin.close()  # type: ignore[union-attr]
        p.wait(10)
