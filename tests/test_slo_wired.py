"""The SLO governor's wiring, without engines: the keeper (who writes the weight: up > a person > the governor; its
decisions in the engine's log), the declaration of a target (run's --slo-* options, up's `slo = {...}`), the
front proxy for every HTTP engine kind (the command rewritten, its probes moved to the internal port) and the
proxy process's latency snapshot as the supervisor parses it (hostile lines dropped)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from gpushare_tui.core.engines.declaration import (
    DeclarationError,
    SloDecl,
    SourceOptions,
    check_slo,
    parse_engine,
    resolve_sources,
)
from gpushare_tui.core.engines.fronted import fronted_args, retarget
from gpushare_tui.core.engines.latency_link import parse_snapshot, snapshot_line
from gpushare_tui.core.engines.slo_keeper import SloKeeper
from gpushare_tui.core.observe.latency import LATENCY_SKETCH_BUCKETS, LatencyRecorder
from gpushare_tui.core.pacing.control import control_handlers
from gpushare_tui.core.pacing.governor import (
    GOVERNOR_MANUAL_HOLD_S,
    GOVERNOR_WINDOW_S,
    GovernorBounds,
    SloTarget,
    figures_of,
)


class Engine:
    """What the keeper governs: the supervisor's setters, recorded."""

    def __init__(self) -> None:
        self.klass, self.weight = "batch", 1.0
        self.sets: list[tuple[str, float]] = []

    def set_weight(self, weight: float) -> float:
        self.weight = weight
        self.sets.append((self.klass, weight))
        return weight

    def set_class(self, klass: str) -> str:
        self.klass = klass
        return klass

    def status(self):  # control_handlers' protocol
        raise NotImplementedError

    def stop(self) -> str:
        return "stopping"


def recorder_missing(ttft_s: float, n: int = 20, at_s: float = 100.0) -> LatencyRecorder:
    """A recorder whose last seconds hold `n` streamed requests with TTFT `ttft_s` (clock: `at_s`)."""
    rec = LatencyRecorder(clock_s=lambda: at_s)
    for i in range(n):
        t = at_s - 5 + i * 0.2
        r = rec.begin(t)
        rec.head(r, t, 200, True)
        rec.chunk(r, t + ttft_s, b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n')
        rec.end(r, t + ttft_s + 0.01)
    return rec


def keeper_for(engine: Engine, rec: LatencyRecorder, clock: list[float], log: str) -> SloKeeper:
    def snapshot():
        return parse_snapshot(snapshot_line(rec, 100.0)[8:], clock[0])

    return SloKeeper(
        SloTarget(ttft_p99_ms=100),
        GovernorBounds(1, 4),
        engine=engine,
        snapshot=snapshot,
        log_path=log,
        say=lambda _l: None,
        clock_s=lambda: clock[0],
    )


def test_the_keeper_moves_up_on_a_miss_and_a_persons_edit_pauses_it_until_up_declares_again(tmp_path) -> None:
    engine, clock, log = Engine(), [1000.0], str(tmp_path / "engine.log")
    keeper = keeper_for(engine, recorder_missing(0.25), clock, log)
    keeper.tick()
    assert (engine.klass, engine.weight) == ("interactive", 2.0)  # 2.5x the target: two rungs at once
    clock[0] += 5
    keeper.tick()
    assert len(engine.sets) == 1  # within 10 s of the change: settling
    handlers = keeper.wrap(control_handlers(engine))  # type: ignore[arg-type]
    handlers["set_weight"]({"weight": 1.5})  # a person (the dashboard, `gpushare-tui weight`)
    for _ in range(5):
        clock[0] += 20
        keeper.tick()
    assert engine.weight == 1.5 and keeper.report().state == "paused"
    assert keeper.report().paused_s == pytest.approx(GOVERNOR_MANUAL_HOLD_S - 100)
    handlers["set_weight"]({"weight": 1.0, "config": True})  # up --reload: the file's weight
    keeper.tick()
    assert engine.sets[-1] == ("interactive", 2.0)  # afresh from the file's batch 1: missed, up two rungs again
    lines = open(log).read().splitlines()
    assert lines[0] == "gpushare-tui: governor: target ttft p99 ≤ 100 ms; bounds weight 1-4, class batch or interactive"
    assert lines[1].startswith("gpushare-tui: governor: up to interactive weight 2 (from batch weight 1): missed, ttft")
    assert any("paused for 600 s" in ln and "set by hand" in ln for ln in lines)
    assert any("restarted from batch weight 1 (set by up)" in ln for ln in lines)
    assert keeper.report().ttft_attained_pct == 0.0


def test_the_keeper_gives_the_governor_the_engines_busy_fraction_and_the_others_weights(tmp_path) -> None:
    """`usage()` (the supervisor's: busy µs since the join, the other members' weights): each step's figures carry
    the busy fraction over the last GOVERNOR_BUSY_WINDOW_S (none until half of it is there, none across a counter
    that went back: a rejoin), and a governed engine pressing on its share goes up before it misses."""
    engine, clock = Engine(), [1000.0]
    engine.klass = "interactive"
    busy = [0]
    rec = recorder_missing(0.08)  # 80 ms: met (100), not with margin (70)

    def snapshot():
        return parse_snapshot(snapshot_line(rec, 100.0)[8:], clock[0])

    keeper = SloKeeper(
        SloTarget(ttft_p99_ms=100),
        GovernorBounds(1, 8),
        engine=engine,
        snapshot=snapshot,
        usage=lambda: (busy[0], 2.0),
        log_path=str(tmp_path / "engine.log"),
        say=lambda _l: None,
        clock_s=lambda: clock[0],
    )
    seen = []
    for _ in range(4):  # half the device: 500 ms of every second
        seen.append(keeper._figures(clock[0]))
        clock[0] += 1
        busy[0] += 500_000
    assert [f.busy_frac for f in seen] == [None, pytest.approx(0.5), pytest.approx(0.5), pytest.approx(0.5)]
    assert {f.others_weight for f in seen} == {2.0} and seen[-1].ttft_p99_ms is not None
    busy[0] = 0  # the engine rejoined: its counter starts again
    assert keeper._figures(clock[0]).busy_frac is None
    keeper.tick()  # interactive weight 1 (share 1/3) at half the device: pressing; met without margin
    assert engine.sets == [] and keeper.report().state == "met"  # the rejoin's sample: no busy yet
    for _ in range(3):
        clock[0] += 1
        busy[0] += 500_000
        keeper.tick()
    assert engine.sets == [("interactive", 4.0)]  # the lowest rung whose share (2/3) it does not press on
    said = open(tmp_path / "engine.log").read()
    assert "up to interactive weight 4 (from interactive weight 1): pressing on its share (busy 50% of 33%)" in said


def test_the_supervisors_in_flight_clock_counts_the_time_with_work_in_flight() -> None:
    """The governor's measure of use (the proxy's DEMAND changes): repeated flags change nothing, an open span
    counts up to now."""
    from gpushare_tui.core.observe.accounting import InFlightClock

    c = InFlightClock()
    assert c.total_us(100) == 0
    c.set(True, 1_000)
    c.set(True, 1_500)  # still the same span
    assert c.total_us(1_200) == 200
    c.set(False, 2_000)
    c.set(False, 3_000)
    assert c.total_us(9_000) == 1_000
    c.set(True, 10_000)
    assert c.total_us(10_250) == 1_250


def test_a_class_edit_is_a_persons_edit_and_a_met_target_moves_nothing_within_margin(tmp_path) -> None:
    engine, clock = Engine(), [1000.0]
    keeper = keeper_for(engine, recorder_missing(0.09), clock, str(tmp_path / "e.log"))
    for _ in range(40):
        clock[0] += 1
        keeper.tick()
    assert engine.sets == [] and keeper.report().state == "met"  # 90 ms: met, not with margin (70 ms)
    keeper.wrap(control_handlers(engine))["set_class"]({"class": "interactive"})  # type: ignore[arg-type]
    assert keeper.report().state == "paused"


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({"ttft_p99_ms": "abc"}, "invalid slo ttft_p99_ms 'abc': must be a number > 0"),
        ({"ttft_p99_ms": -3}, "must be a number > 0"),
        ({"itl_p99_ms": float("nan")}, "must be a number > 0"),
        ({"weight_max": 4}, "needs ttft_p99_ms or itl_p99_ms"),
        ({"ttft_p99_ms": 1, "weight_min": 4, "weight_max": 2}, "weight_min 4 is above weight_max 2"),
        ({"ttft_p99_ms": 1, "classes": "batch,fast"}, "one or both of batch, interactive"),
        ({"ttft_p99_ms": 1, "classes": "batch,batch"}, "one or both of batch, interactive"),
    ],
)
def test_a_bad_target_is_one_declaration_error(given: dict, problem: str) -> None:
    with pytest.raises(DeclarationError, match=problem.replace("(", r"\(")) as e:
        check_slo(**given)
    assert e.value.field == "slo" and "\n" not in str(e.value)


def test_a_target_its_defaults_and_its_run_options() -> None:
    assert check_slo() is None
    d = check_slo("300", None, None, None, "interactive")
    assert d == SloDecl(ttft_p99_ms=300.0, classes=("interactive",))
    assert d.governed(2.0) == (SloTarget(ttft_p99_ms=300.0), GovernorBounds(2.0, 16.0, ("interactive",)))
    assert check_slo(itl_p99_ms=50, weight_max=1).governed(3.0)[1] == GovernorBounds(1.0, 1.0)  # below the weight
    assert d.run_options() == {"slo_ttft_p99_ms": 300.0, "slo_itl_p99_ms": None, "slo_weight_min": None,
                               "slo_weight_max": None, "slo_classes": "interactive"}  # fmt: skip


def test_up_declares_a_target_in_a_table(tmp_path) -> None:
    table = {"name": "chat", "command": ["sh"], "slo": {"ttft_p99_ms": 300, "weight_max": 4, "classes": ["batch"]}}
    assert parse_engine(table, cwd=str(tmp_path)).slo == SloDecl(300.0, None, None, 4.0, ("batch",))
    for bad, problem in (
        ({"ttft_p99_ms": "300"}, "must be a number > 0"),
        ({"ttft": 300}, "unknown key 'ttft'"),
        ({}, "needs ttft_p99_ms or itl_p99_ms"),
        (300, "must be a table"),
    ):
        with pytest.raises(DeclarationError, match=problem):
            parse_engine({**table, "slo": bad}, cwd=str(tmp_path))
    with pytest.raises(DeclarationError, match="goes with command"):
        parse_engine({"name": "s", "synth": {}, "slo": {"ttft_p99_ms": 1}}, cwd=str(tmp_path))


def test_every_http_engine_kind_is_fronted_and_its_probes_go_to_the_engine() -> None:
    argv = ["vllm", "serve", "m", "--port", "8123", "--gpu-memory-utilization", "0.4"]
    src = resolve_sources(argv, SourceOptions(activity="vllm"))
    args, moved = fronted_args(argv, src)
    assert args.upstream is not None and (args.host, args.port) == ("0.0.0.0", 8123)
    inner = str(args.upstream[1])
    assert list(args.argv) == ["vllm", "serve", "m", "--gpu-memory-utilization", "0.4", "--host", "127.0.0.1",
                               "--port", inner]  # fmt: skip
    assert moved.activity.metrics_url == f"http://127.0.0.1:{inner}/metrics"
    assert moved.health.url == f"http://127.0.0.1:{inner}/health"
    tgi = ["text-generation-launcher", "--model-id", "m", "--hostname", "127.0.0.1"]
    args, _ = fronted_args(tgi, resolve_sources(tgi))
    assert (args.host, args.port) == ("127.0.0.1", 3000) and "--hostname" in args.argv and "3000" not in args.argv
    cmd = ["python", "serve.py", "--port=9001"]
    args, _ = fronted_args(cmd, resolve_sources(cmd, SourceOptions(health_url="http://127.0.0.1:9001/ready")))
    assert args.upstream is not None and "--host" not in args.argv  # an unknown command's host flag is not guessed
    # not fronted: no port of its own; a port it shows no HTTP on (a gRPC server, a rendezvous port); --no-proxy
    for unfronted, proxy in ((["python", "train.py"], True), (cmd, True), (argv, False)):
        args, same = fronted_args(unfronted, resolve_sources(unfronted), proxy=proxy)
        assert args.upstream is None and list(args.argv) == unfronted
    assert retarget("http://10.0.0.2:8123/metrics", 8123, ("127.0.0.1", 5)) == "http://10.0.0.2:8123/metrics"
    assert retarget("http://localhost:8123/h?x=1", 8123, ("127.0.0.1", 5)) == "http://127.0.0.1:5/h?x=1"


def minute_doc(**minute: object) -> bytes:
    """A snapshot whose report and recent figures are well formed, with `minute`'s fields over good ones."""
    good = {"span_s": 1, "requests": 1, "ttft": [], "itl": []}
    return json.dumps({"report": {}, "recent": {"requests": 1}, "minute": good | minute}).encode()


HOSTILE_SNAPSHOTS = [
    b"",
    b"null",
    b"[]",
    b"{" * 100_000,
    b'{"report": {}, "recent": {"requests": -1}, "minute": {}}',
    b'{"report": {}, "recent": {"requests": 1, "ttft_p99_ms": "x"}, "minute": {}}',
    b'{"report": {}, "recent": {"requests": true}, "minute": {}}',
    minute_doc(ttft=[[99999, 1]]),
    minute_doc(ttft=[[1, -4]]),
    minute_doc(ttft=[[1, 2, 3]]),
    minute_doc(itl=[[1, 2**32]]),
    minute_doc(itl="many"),
    minute_doc(span_s=1e308 * 10),
    minute_doc(requests=1.5),
    minute_doc(ttft=[[i, 1] for i in range(LATENCY_SKETCH_BUCKETS + 1)]),
]


@pytest.mark.parametrize("payload", HOSTILE_SNAPSHOTS, ids=range(len(HOSTILE_SNAPSHOTS)))
def test_a_hostile_latency_line_from_the_proxy_process_is_dropped(payload: bytes) -> None:
    """The proxy's process reads untrusted HTTP: what it sends the supervisor is parsed as any reply from another
    process, and a line that is not a snapshot changes nothing (the last good one stays)."""
    assert parse_snapshot(payload, 0.0) is None


def test_a_snapshot_round_trips_and_its_report_is_typed() -> None:
    rec = recorder_missing(0.25)
    snap = parse_snapshot(snapshot_line(rec, 100.0)[8:], 7.0)
    assert snap is not None and snap.received_s == 7.0
    assert snap.recent.requests == 20 and snap.recent.ttft_p99_ms == pytest.approx(250, rel=0.011)
    assert snap.report.status_2xx_total == 20 and snap.report.ttft_hist is not None and snap.report.ttft_hist.valid()
    assert snap.minute.within_pct("ttft", 0.3) == 100.0 and snap.minute.within_pct("ttft", 0.2) == 0.0
    doc = json.loads(snapshot_line(rec, 100.0)[8:])
    doc["report"]["ttft_p99_ms"] = "\x1b[2J"  # text where a number goes: that field is None, the rest stays
    odd = parse_snapshot(json.dumps(doc).encode(), 0.0)
    assert odd is not None and odd.report.ttft_p99_ms is None and odd.report.requests == 20


def test_a_snapshot_line_says_what_the_recorder_reports() -> None:
    """The line is built with one merge of the minute and no deep copy: it says exactly what the recorder's own
    readers say (its report, the governor's window, the minute's sketches, every non-zero bucket)."""
    rec = recorder_missing(0.25)
    for i in range(30):  # ITL gaps spread over many buckets, and seconds that left the governor's window
        r = rec.begin(40.0 + i)
        rec.head(r, 40.0 + i, 200, True)
        rec.chunk(r, 40.1 + i, b'data: {"content":"x"}\n\n')
        rec.tokens(r, [40.1 + i + 0.001 * k * (1 + k % 7) for k in range(1, 40)])
        rec.end(r, 41.0 + i)
    doc = json.loads(snapshot_line(rec, 100.0)[8:])
    minute = rec.window(100.0)
    assert doc["report"] == json.loads(json.dumps(asdict(rec.report(100.0))))
    assert doc["recent"] == asdict(figures_of(rec.window(100.0, GOVERNOR_WINDOW_S)))
    for figure in ("ttft", "itl"):
        assert doc["minute"][figure] == [[i, n] for i, n in enumerate(minute.sketches[figure]) if n]
    assert len(doc["minute"]["itl"]) > 20 and doc["minute"]["requests"] == minute.requests == 50
