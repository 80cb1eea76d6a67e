"""The synthetic engine and its CLI: validation, weighted ratio under real pacing, pacing overhead alone."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time

import pytest

from gpushare_tui.cli import main as cli_main
from gpushare_tui.core.engines import synthetic
from gpushare_tui.core.engines.synthetic import DutyPattern
from gpushare_tui.core.host import lifecycle
from gpushare_tui.core.pacing import control
from gpushare_tui.core.registry.abi import WEIGHT_RULE
from gpushare_tui.core.registry.segment import Segment
from testkit.cli import cli_argv, cli_argv_threads_at_exit
from testkit.shm import shm_file
from testkit.wait import read_json_file, wait_for

BAD_WEIGHTS = ["nan", "NaN", "inf", "-inf", "0", "-0", "-1", "abc", "", "1e39"]
BAD_KEYS = ["../x", "a/b", "", "x" * 65, "sp ace", ".."]


@pytest.mark.parametrize("weight", BAD_WEIGHTS)
def test_synth_bad_weight_in_process(weight: str, gpu_key: str, capsys) -> None:
    assert cli_main(["synth", "--weight", weight, "--gpu-key", gpu_key, "--duration", "0.1"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [f"gpushare-tui: invalid weight {weight!r}: {WEIGHT_RULE}"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_synth_bad_key_in_process(key: str, capsys) -> None:
    assert cli_main(["synth", "--weight", "1", "--gpu-key", key, "--duration", "0.1"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("gpushare-tui: invalid gpu key")


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["--weight", "nan"],
        ["--weight", "inf"],
        ["--weight", "0"],
        ["--weight", "-1"],
        ["--weight", "abc"],
        ["--weight", "1", "--gpu-key", "../x"],
        ["--weight", "1", "--step-ms", "0"],
        ["--weight", "1", "--busy-idle", "x:y"],
        ["--weight", "1", "--duration", "nan"],
        ["--weight", "1", "--duration", "inf"],
        ["--weight", "1", "--duration", "-1"],
        ["--weight", "1", "--work-units", "-5"],
        ["--weight", "1", "--status-file", "/nonexistent/x"],
        ["--weight", "1", "--status-file", "/tmp"],
        ["--weight", "1", "--status-file", ""],
        ["--weight", "1", "--name", "é" * 25],  # 50 bytes: the slot holds 48 (it was truncated)
        ["--weight", "1", "--name", "a\x1bb"],
    ],
    ids=[
        "nan",
        "inf",
        "zero",
        "negative",
        "abc",
        "bad-key",
        "bad-step",
        "bad-pattern",
        "duration-nan",
        "duration-inf",
        "duration-negative",
        "work-units-negative",
        "status-file-no-dir",
        "status-file-a-dir",
        "status-file-empty",
        "name-too-long",
        "name-control",
    ],
)
def test_synth_usage_errors_in_a_real_process(args: list[str], gpu_key: str, cli) -> None:
    if "--gpu-key" not in args:
        args = [*args, "--gpu-key", gpu_key]
    r = cli("synth", "--duration", "0.1", *args, timeout=30)  # a later --duration wins
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("gpushare-tui: invalid")
    assert not os.path.exists(shm_file(gpu_key))  # refused before joining anything


def test_duty_pattern() -> None:
    p = DutyPattern(3.0, 1.0)
    assert p.busy_at(0) and p.busy_at(2.9) and not p.busy_at(3.5) and p.busy_at(4.1)
    assert DutyPattern().busy_at(123.0)


def test_work_units_scale() -> None:
    units = synthetic.calibrate_units(5.0)
    assert units >= 1
    t0 = time.perf_counter()
    synthetic.work(units)
    one = time.perf_counter() - t0
    assert 0.0005 < one < 0.1


@pytest.mark.slow
def test_serve_synth_joins_serves_and_leaves(gpu_key: str, runtime_dir: str) -> None:
    """The engine's life in-process: join, control socket while running, leave; nothing left after."""
    handlers = {sig: signal.getsignal(sig) for sig in lifecycle.TERMINATION_SIGNALS}  # it installs its own
    said: list[str] = []
    replies: list[dict] = []

    def each_second(_line: str) -> None:
        replies.append(control.request(os.getpid(), "status"))

    try:
        stats = synthetic.serve_synth(
            gpu_key, 2.0, "inproc", step_ms=1.0, duration_s=1.5, report=each_second, say=said.append
        )
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert said == [f"gpushare-tui: joined /opencoti-gpu-{gpu_key} slot 0 (weight 2, 1 peer alive)"]
    assert stats.state == "exited" and stats.steps_total > 0
    assert replies and replies[0]["kind"] == "synth" and replies[0]["name"] == "inproc" and replies[0]["weight"] == 2.0
    assert not os.path.exists(control.socket_path(os.getpid()))
    with Segment.attach_readonly(shm_file(gpu_key)) as seg:
        assert all(r.pid != os.getpid() for r in seg.read_slots())


@pytest.mark.slow
def test_idle_spell_is_said_at_once_and_resuming_reads_unmeasured(gpu_key: str) -> None:
    """A duty-cycled synth entering an idle spell drops `active` and busy at once (not 2 s later, while
    its tok/s already reads 0: the demo's "active, BUSY 1, TOK/S 0.0"), and on resuming its tok/s is
    unknown (None, shown "-") until a window of work completes, not the idle spell's 0."""
    from gpushare_tui.core.pacing.share import GpuShare

    share = GpuShare(1.0, "duty", gpu_key=gpu_key, control=False).open()
    stats = synthetic.SynthStats()
    seen: dict[str, tuple] = {}
    stop = threading.Event()

    def run() -> None:
        synthetic.run_synth(share, step_ms=1.0, duration_s=3.0, pattern=DutyPattern(1.2, 1.0), stats=stats,
                            stop=stop, report=lambda _line: None, units=50)  # fmt: skip

    t = threading.Thread(target=run)
    t0 = time.monotonic()
    t.start()
    try:
        for name, at_s in (("working", 1.1), ("idle", 1.7), ("resumed", 2.3)):
            time.sleep(max(0.0, t0 + at_s - time.monotonic()))
            with Segment.attach_readonly(shm_file(gpu_key)) as seg:
                rec = seg.read_slot(share.slot)
            seen[name] = (rec.active, rec.busy_ppm, stats.tok_s)
    finally:
        stop.set()
        t.join(10)
        share.close()
    assert seen["working"][0] == 1 and seen["working"][2] and seen["working"][2] > 0, seen
    assert seen["idle"] == (0, 0, 0.0), seen  # 0.5 s into the idle spell: said at once
    assert seen["resumed"][0] == 1 and seen["resumed"][2] is None, seen  # 0.1 s after resuming: not measured


# -- measured under real pacing ----------------------------------------------------


def _start(procs, key: str, weight: str, status, units: int, *extra: str):
    return procs.start(
        cli_argv(
            "synth",
            "--weight",
            weight,
            "--gpu-key",
            key,
            "--work-units",
            str(units),
            "--status-file",
            str(status),
            "-q",
            *extra,
        )  # fmt: skip
    )


def _sample(status) -> tuple[int, int]:
    d = wait_for(lambda: read_json_file(status), 15, what=f"status file {status}")
    return d["time_us"], d["steps_total"]  # type: ignore[index]


def _rate(a: tuple[int, int], b: tuple[int, int]) -> float:
    return (b[1] - a[1]) / ((b[0] - a[0]) / 1e6)


def _measure(statuses: list, warmup_s: float, measure_s: float) -> list[float]:
    """steps/s of each engine over the same window, excluding the warm-up."""
    for s in statuses:
        _sample(s)
    time.sleep(warmup_s)
    first = [_sample(s) for s in statuses]
    time.sleep(measure_s)
    last = [_sample(s) for s in statuses]
    for a, b in zip(first, last, strict=True):
        assert b[0] - a[0] > 0.6 * measure_s * 1e6, "status files stopped updating"
    return [_rate(a, b) for a, b in zip(first, last, strict=True)]


@pytest.fixture(scope="module")
def units() -> int:
    return synthetic.calibrate_units(2.0)


@pytest.mark.slow
def test_two_to_one_ratio(procs, new_gpu_key, tmp_path, units: int) -> None:
    key = new_gpu_key()
    sa, sb = tmp_path / "a.json", tmp_path / "b.json"
    _start(procs, key, "2", sa, units)
    _start(procs, key, "1", sb, units)
    ra, rb = _measure([sa, sb], warmup_s=1.5, measure_s=4.0)
    ratio = ra / rb
    print(f"2:1 weights: {ra:.1f} : {rb:.1f} steps/s = {ratio:.2f}")
    assert 1.6 <= ratio <= 2.4, f"2:1 weights gave {ra:.1f} : {rb:.1f} steps/s = {ratio:.2f}"


def _steps_per_cpu_s(proc, status) -> float:
    """Reap `proc` (it ran with --duration) and return its steps per CPU second (rusage)."""
    _, _, ru = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped here; Popen must not wait for it again
    d = read_json_file(status)
    assert d is not None and d["state"] == "exited"
    return d["steps_total"] / (ru.ru_utime + ru.ru_stime)


@pytest.mark.slow
def test_lone_paced_engine_never_sleeps_and_costs_little_per_step(procs, new_gpu_key, tmp_path, units: int) -> None:
    # Alone, the pacer must never sleep. Its overhead is compared per CPU second (rusage), not per wall
    # second: on a loaded box the two engines get different shares of the cores, but a step costs what it
    # costs. Wall-clock speed figures live in bench/synth_ratio.py.
    su, sp = tmp_path / "unpaced.json", tmp_path / "paced.json"
    pu = _start(procs, new_gpu_key(), "1", su, units, "--no-pace", "--duration", "4")
    pp = _start(procs, new_gpu_key(), "1", sp, units, "--duration", "4")
    unpaced, paced = _steps_per_cpu_s(pu, su), _steps_per_cpu_s(pp, sp)
    d = read_json_file(sp)
    assert d is not None and d["slept_us"] == 0  # alone: never slept
    overhead_us = 1e6 / paced - 1e6 / unpaced  # measured 40-140 µs per step here, loaded or not
    why = f"pacing costs {overhead_us:.0f} µs of CPU per step ({paced:.0f} vs {unpaced:.0f} steps/CPU s)"
    assert overhead_us < 1000, why


def _status(pid: int) -> control.StatusReply:
    """Its status; an empty one while its control socket is not up yet."""
    try:
        return control.StatusReply.from_json(control.request(pid, "status"))
    except control.ControlError:
        return control.StatusReply()


@pytest.mark.slow
@pytest.mark.alone  # a rate learnt in one stretch of real time compared with one in the next: other CPU work between
def test_solo_tok_s_is_reached_alone_and_kept_while_sharing(procs, gpu_key, runtime_dir, cli) -> None:
    """A synth alone learns its solo rate (the best tok/s as the only active member); once it shares the
    GPU (equal weights) its tok/s drops below it, and a peer that never ran alone has none. --once --json
    reports it in the engine object, with speed_pct = tok/s ÷ solo."""
    argv = ("synth", "--weight", "1", "--gpu-key", gpu_key, "--step-ms", "2", "-q")
    a = procs.start(cli_argv(*argv, "--name", "solo-a"))
    st = wait_for(lambda: (s := _status(a.pid)).solo_tok_s and s, 20, what="solo_tok_s of a lone synth")
    assert st.tok_s is not None and 0 < st.tok_s <= st.solo_tok_s  # alone: every complete window is a solo one
    b = procs.start(cli_argv(*argv, "--name", "shared-b"))
    wait_for(lambda: _status(b.pid).tok_s, 20, what="b's first rate window")
    time.sleep(2.5)  # a's rate windows now span shared time (1 s each)
    sa, sb = _status(a.pid), _status(b.pid)
    assert sa.solo_tok_s is not None and sa.tok_s is not None
    assert sa.tok_s < 0.9 * sa.solo_tok_s, (sa.tok_s, sa.solo_tok_s)  # paced to about half its time
    assert sb.solo_tok_s is None  # b has never been the only active member
    r = cli("--once", "--json", "--gpu-key", gpu_key)
    assert r.returncode == 0, r.stderr
    engines = {p["pid"]: p["engine"] for p in json.loads(r.stdout)["gpus"][0]["peers"]}
    ea, eb = engines[a.pid], engines[b.pid]
    assert ea["kind"] == "synth" and ea["solo_tok_s"] >= sa.solo_tok_s
    assert ea["speed_pct"] == pytest.approx(100 * ea["tok_s"] / ea["solo_tok_s"])
    assert eb["solo_tok_s"] is None and eb["speed_pct"] is None


@pytest.mark.slow
def test_sigterm_soon_after_join_exits_in_order_every_time(procs, gpu_key: str, runtime_dir: str) -> None:
    """SIGTERM 0-300 ms after the join line, again and again: every run exits 128+15 with no thread
    left running into finalization (see conftest), its slot left and its socket removed."""
    rng = random.Random()
    for i in range(12):
        delay_s = rng.choice((0.0, rng.uniform(0, 0.05), rng.uniform(0, 0.3)))
        p = procs.start(
            # not --quiet: its join line on stderr is what the test waits for (--quiet says nothing there)
            cli_argv_threads_at_exit("synth", "--weight", "1", "--gpu-key", gpu_key, "--step-ms", "1")
        )
        line = p.stderr.readline()
        assert "joined" in line, line + p.stderr.read()
        time.sleep(delay_s)
        p.send_signal(signal.SIGTERM)
        code = p.wait(timeout=20)
        err = p.stderr.read()
        what = f"run {i}, SIGTERM {delay_s * 1000:.0f} ms after the join line"
        assert code == 128 + signal.SIGTERM, f"{what}: exit {code}\n{err}"
        assert "threads at exit: []" in err, f"{what}: a thread outlived the engine\n{err}"
        assert not os.path.exists(os.path.join(runtime_dir, "gpushare-tui", f"{p.pid}.sock")), what
        with Segment.attach_readonly(shm_file(gpu_key)) as seg:
            assert all(r.pid != p.pid for r in seg.read_slots()), what


def test_synth_engines_do_the_same_work_per_step_by_default(procs, new_gpu_key, tmp_path) -> None:
    """Two `synth` processes started as the README's `synth &` lines and `up deploy/synth.toml` start them
    (no --work-units) do the same work per step, step_ms's at the reference rate, whatever the machine's
    load at their start: their TOK/S compare (each calibrating itself, they differed 3.75x). A CPU hog
    beside the second start makes a calibration there come out different."""
    key = new_gpu_key()
    sa, sb = tmp_path / "a.json", tmp_path / "b.json"
    base = ("synth", "--gpu-key", key, "-q", "--duration", "3")
    procs.start(cli_argv(*base, "--weight", "2", "--name", "a", "--status-file", str(sa)))
    hog = procs.start([sys.executable, "-c", "while True: pass"])
    try:
        procs.start(cli_argv(*base, "--name", "b", "--status-file", str(sb)))  # --weight: 1 by default
        da = wait_for(lambda: read_json_file(sa), 15, what="a's status file")
        db = wait_for(lambda: read_json_file(sb), 15, what="b's status file")
    finally:
        hog.kill()
    assert da["units"] == db["units"] == synthetic.step_units(5.0) == round(5.0 * synthetic.REFERENCE_UNITS_PER_MS)
    assert synthetic.step_units(5.0, 0) >= 1 and synthetic.step_units(5.0, 7) == 7  # 0: calibrated; N: N


def test_a_synth_engine_declared_in_a_file_gets_no_work_units_of_its_own() -> None:
    """`up`'s synth engines (deploy/synth.toml: synth = { step_ms = 5 }) are started with step_ms only."""
    from gpushare_tui.core.engines import spawn
    from gpushare_tui.up import config
    from testkit.paths import REPO

    cfg = config.load(str(REPO / "deploy" / "synth.toml"))
    for d in cfg.engines:
        assert d.synth is not None and d.synth.work_units is None
        argv = spawn.synth_argv(gpu_key="k", weight=d.weight, name=d.name, step_ms=d.synth.step_ms)
        assert "--work-units" not in argv
