"""Supervisor acceptance tests against real llama-server processes (CPU, tiny model)."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from llama_env import Engines, end_pid, proc_state, read_join_line

from gpushare_tui.core.engines.activity.llama import CPU_ACTIVE_CORES as LLAMA_CPU_ACTIVE_CORES
from gpushare_tui.core.engines.llama_server import port_in_use
from gpushare_tui.core.registry.segment import Segment, shm_path
from testkit.cli import cli_argv, cli_argv_threads_at_exit, run_cli, status_json
from testkit.load import StreamLoad
from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS
from testkit.wait import wait_for

pytestmark = pytest.mark.llama


@pytest.fixture
def engines(procs, gpu_key, llama_server, tiny_model, runtime_dir):  # noqa: F811
    e = Engines(procs, gpu_key, llama_server, tiny_model)
    yield e
    e.end()


def port_of(pid: int) -> int:
    return status_json(pid)["port"]


def start_load(port: int, n_predict: int = 256) -> StreamLoad:
    return StreamLoad(port, n_predict, banned_tokens=NON_TEXT_TOKEN_IDS).start()


def test_run_joins_with_engine_pid_and_defaults(engines):
    sup, pid, line = engines.run(1.5)
    assert line.startswith(f"gpushare-tui: joined /opencoti-gpu-{engines.key} slot 0 (weight 1.5, 1 peer alive)")
    rec = engines.slot_of(pid)
    assert rec is not None and rec.pid == pid != sup.pid
    assert rec.name == "tiny-llama"  # model file stem
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    for flag in (b"--metrics", b"--slots", b"--port", b"--host"):
        assert flag in argv
    assert os.getpgid(pid) == pid  # its own process group
    st = json.loads(run_cli("status", str(pid), "--json").stdout)
    assert st["engine_pid"] == pid and st["state"] == "running" and st["weight"] == 1.5
    assert httpx.get(f"http://127.0.0.1:{st['port']}/health").status_code == 200


def test_activity_raised_fast_and_dropped_after_idle(engines):
    _, pid, _ = engines.run()
    port = port_of(pid)
    assert not engines.slot_of(pid).active
    t0 = time.monotonic()
    lo = start_load(port, 2000)
    wait_for(lambda: engines.slot_of(pid).active, 2.0, 0.005, "active raised")
    raised_s = time.monotonic() - t0
    assert raised_s < 1.0, raised_s  # ~100 ms target; loose for a loaded CI box
    lo.stop()
    t_idle = time.monotonic()
    wait_for(lambda: not engines.slot_of(pid).active, 5.0, 0.02, "active dropped")
    assert 1.5 <= time.monotonic() - t_idle <= 4.0
    # once idle, probes are back at the idle cadence (not the active one's 1 s)
    t0 = time.monotonic()
    lo = start_load(port, 2000)
    wait_for(lambda: engines.slot_of(pid).active, 2.0, 0.005, "active raised again")
    assert time.monotonic() - t0 < 0.6
    lo.stop()


def test_two_engines_paced_two_to_one(engines):
    sup_a, a, _ = engines.run(2, threads=2)
    sup_b, b, _ = engines.run(1, threads=2)
    loads = [start_load(port_of(p)) for p in (a, b)]
    time.sleep(2.0)
    t0 = time.monotonic()
    stopped_seen = {a: 0, b: 0}
    both_running = samples = 0
    while time.monotonic() < t0 + 8:
        states = {p: proc_state(p) for p in (a, b)}
        for p in (a, b):
            stopped_seen[p] += states[p] == "T"
        both_running += "T" not in states.values()
        samples += 1
        time.sleep(0.002)
    t1 = time.monotonic()
    ta, tb = (lo.count(t0, t1) for lo in loads)
    for lo in loads:
        lo.stop()
    # The pacing's own measure: the time each engine is continued (not stopped), 2:1. Measured 1.99
    # quiet and 2.06-2.10 beside a CPU hog; weight-blind pacing gives ~1:1, none never stops either.
    # The tokens follow it quiet (2.06; 1.98-2.01 before), but beside a CPU hog the CPU stand-ins'
    # token ratio ranged 1.2-6.9 (the short windows suffer most from the contention), so tokens
    # are only checked to favour the heavier engine.
    assert stopped_seen[a] > 0 and stopped_seen[b] > 0  # really paced by signals
    continued_a, continued_b = samples - stopped_seen[a], samples - stopped_seen[b]
    assert continued_b > 0 and 1.6 <= continued_a / continued_b <= 2.5, (continued_a, continued_b, samples)
    assert ta > tb > 0, (ta, tb)
    # one at a time, give or take the hand-off: 0% of samples quiet, 0.6-3.9% with two busy
    # loops on the 2 cores as well (the outgoing engine's thread must get a core to stop);
    # broken pacing shows ~50-100%. test_run_until pins the stop lead itself.
    assert both_running / samples < 0.08, (both_running, samples)
    # both go idle, and idle engines are never stopped
    wait_for(lambda: not engines.slot_of(a).active and not engines.slot_of(b).active, 8, what="both idle")
    states = []
    for _ in range(50):
        states += [proc_state(a), proc_state(b)]
        time.sleep(0.01)
    assert "T" not in states


def test_lone_and_idle_engines_are_never_stopped(engines):
    _, a, _ = engines.run(1)
    _, b, _ = engines.run(1)
    lo = start_load(port_of(a))
    states_a, states_b = [], []
    t_end = time.monotonic() + 3
    while time.monotonic() < t_end:
        states_a.append(proc_state(a))
        states_b.append(proc_state(b))
        time.sleep(0.005)
    lo.stop()
    assert lo.tokens
    assert "T" not in states_a  # alone active: unthrottled
    assert "T" not in states_b  # idle: never stopped


def test_sigkill_supervisor_ends_its_engine_never_left_stopped(engines):
    """Issue 26 item 7: a SIGKILLed supervisor's engine is continued (the watchdog), then ended: SIGTERM from
    the kernel (PR_SET_PDEATHSIG, taken once continued) and the watchdog; none runs on unpaced and unseen."""
    sup_a, a, _ = engines.run(1)
    sup_b, b, _ = engines.run(1)
    loads = [start_load(port_of(p)) for p in (a, b)]
    try:
        wait_for(lambda: proc_state(a) == "T", 10, 0.001, "engine a stopped by its supervisor")
        os.kill(sup_a.pid, signal.SIGKILL)
        t0 = time.monotonic()
        wait_for(lambda: proc_state(a) in (None, "Z"), 15, 0.01, "the orphaned engine's end")
        print(f"engine ended {time.monotonic() - t0:.2f} s after its supervisor's SIGKILL")
        assert sup_b.poll() is None and proc_state(b) not in (None, "Z")  # its peer runs on
    finally:
        for lo in loads:
            lo.stop_nowait()


def test_sigterm_supervisor_stops_engine_and_leaves_slot(engines):
    sup, pid, _ = engines.run(1)
    os.kill(sup.pid, signal.SIGTERM)
    assert sup.wait(20) == 0  # llama-server exits 0 on SIGTERM
    assert proc_state(pid) is None
    assert engines.slot_of(pid) is None


SIGTERM_RUNS = 16


def test_sigterm_soon_after_join_exits_cleanly_every_time(engines):
    """SIGTERM 0-300 ms after the join line (the monitor thread may still be starting): every run
    exits 0, with no thread left running into finalization, and leaves no engine and no slot."""
    rng = random.Random()
    for i in range(SIGTERM_RUNS):
        delay_s = rng.choice((0.0, rng.uniform(0, 0.05), rng.uniform(0, 0.3)))  # the monitor's start is early
        sup, pid, _ = engines.run(1, python=cli_argv_threads_at_exit())
        time.sleep(delay_s)
        os.kill(sup.pid, signal.SIGTERM)
        code = sup.wait(30)
        err = sup.stderr.read()
        what = f"run {i}, SIGTERM {delay_s * 1000:.0f} ms after the join line"
        assert code == 0, f"{what}: exit {code}\n{err}"
        assert "threads at exit: []" in err, f"{what}: a thread outlived the supervisor\n{err}"
        assert proc_state(pid) is None, what
        engines.engine_pids.remove(pid)  # gone: not to be signalled at teardown (its pid may be reused)
        assert engines.slot_of(pid) is None, what


def test_sigterm_before_the_engine_starts_stops_in_order(procs, gpu_key, llama_server, tiny_model, runtime_dir):  # noqa: F811
    """A SIGTERM as soon as `run` says which port it picked (before the engine starts, or while it
    loads) ends it with one line and exit 128 + 15 (an Interrupted start-up), never kills it outright (-15),
    and leaves no engine running."""
    argv = cli_argv("run", "--weight", "1", "--gpu-key", gpu_key, "--", llama_server, "-m", tiny_model, "-t", "1")
    for i in range(4):
        sup = procs.start(argv)
        line = sup.stderr.readline()
        assert "free port picked" in line, line
        os.kill(sup.pid, signal.SIGTERM)
        code = sup.wait(30)
        err = sup.stderr.read()
        # 0: the engine loaded and joined before the signal came (a tiny model loads in ~50 ms)
        assert (code, "gpushare-tui: interrupted" in err or "joined" in err) in ((143, True), (0, True)), (
            f"run {i}: exit {code}\n{err}"
        )
        assert "Traceback" not in err, err
        port = int(line.split(" port ")[1].split()[0])
        assert not port_in_use("127.0.0.1", port), f"run {i}: an engine still listens on {port}"


def test_control_weight_and_stop(engines):
    sup, pid, _ = engines.run(1)
    r = run_cli("weight", str(pid), "2.5")
    assert r.returncode == 0, r.stderr
    assert engines.slot_of(pid).weight == 2.5
    for bad in ("nan", "inf", "0", "-1", "abc"):
        r = run_cli("weight", str(pid), "--", bad)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    r = run_cli("weight", str(pid), "-1")  # looks like an option: still one line, exit 2
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert engines.slot_of(pid).weight == 2.5
    from gpushare_tui.core.pacing.control import ControlError, request

    with pytest.raises(ControlError, match="invalid weight"):
        request(pid, "set_weight", weight=float("nan"))
    sock = Path(os.environ["XDG_RUNTIME_DIR"]) / "gpushare-tui" / f"{pid}.sock"
    assert sock.stat().st_mode & 0o777 == 0o600
    r = run_cli("stop", str(pid))
    assert r.returncode == 0, r.stderr
    assert sup.wait(20) == 0
    assert proc_state(pid) is None and engines.slot_of(pid) is None and not sock.exists()


def test_control_cli_errors(runtime_dir):
    r = run_cli("status", "999999")
    assert r.returncode == 1 and "no process 999999" in r.stderr
    r = run_cli("weight", str(os.getpid()), "2")
    assert r.returncode == 1 and f"process {os.getpid()} is not a gpushare-tui engine" in r.stderr
    r = run_cli("stop", "1")
    assert r.returncode == 1 and ("process 1 is not a gpushare-tui engine" in r.stderr or "another user" in r.stderr)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process as another user")
def test_control_refuses_another_users_engine(procs, runtime_dir):
    import pwd

    nobody = pwd.getpwnam("nobody")
    other = procs.start(["sleep", "30"], user=nobody.pw_uid, group=nobody.pw_gid)
    r = run_cli("weight", str(other.pid), "2")
    assert r.returncode == 1 and "another user" in r.stderr and "Traceback" not in r.stderr


def test_launch_detached_and_stop(gpu_key, llama_server, tiny_model, runtime_dir):  # noqa: F811
    r = run_cli(
        "launch",
        "--json",
        "--weight",
        "1",
        "--gpu-key",
        gpu_key,
        "--",
        llama_server,
        "-m",
        tiny_model,
        "-t",
        "1",
        "-c",
        "512",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    try:
        assert os.path.exists(info["log"]) and httpx.get(f"http://127.0.0.1:{info['port']}/health").status_code == 200
        assert os.getsid(info["supervisor_pid"]) == info["supervisor_pid"]  # own session
        assert run_cli("stop", str(info["engine_pid"])).returncode == 0
        wait_for(lambda: proc_state(info["supervisor_pid"]) in (None, "Z"), 15, what="supervisor exit")
    finally:
        end_pid(info["engine_pid"])
        end_pid(info["supervisor_pid"])


def test_bad_inputs_fail_with_one_line(gpu_key, llama_server, tiny_model, tmp_path, runtime_dir):  # noqa: F811
    r = run_cli("run", "--weight", "1", "--gpu-key", gpu_key, "--", "/nonexistent/llama-server", "-m", tiny_model)
    assert r.returncode == 2 and "invalid engine binary" in r.stderr and "Traceback" not in r.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_cli("run", "--gpu-key", gpu_key, "--", llama_server, "-m", tiny_model, "--port", str(port))
    assert r.returncode != 0 and f"port {port}" in r.stderr and "in use" in r.stderr
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf")
    r = run_cli("run", "--gpu-key", gpu_key, "--", llama_server, "-m", str(bad), "-t", "1", timeout=60)
    assert r.returncode == 1 and "exited with code" in r.stderr and "last lines of the engine log" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_cli("launch", "--gpu-key", gpu_key, "--", llama_server, "-m", str(bad), "-t", "1", timeout=60)
    assert r.returncode == 1 and "exited with code" in r.stderr
    r = run_cli("run", "--weight", "nan", "--gpu-key", gpu_key, "--", llama_server)
    assert r.returncode == 2 and "invalid weight" in r.stderr


def test_cpu_time_alone_never_raises_active(procs, gpu_key, runtime_dir):
    """Engine CPU time only carries activity a probe raised: an engine that burns a
    core but reports no decode and no request in flight stays idle (and so never
    paces its peers)."""
    fake = str(Path(__file__).parent / "data" / "busy_idle_engine.py")
    argv = cli_argv("run", "--weight", "1", "--gpu-key", gpu_key, "--name", "busy", "--activity", "llama", "--")
    argv += [sys.executable, fake]
    sup = procs.start(argv)
    wait_for(lambda: read_join_line(sup), 30, what="supervisor join line")
    with Segment.attach_readonly(shm_path(gpu_key)) as seg:
        pid = next(r.pid for r in seg.read_slots() if r.name == "busy")
        try:
            engine = psutil.Process(pid)
            for _ in range(3):  # a window in which it burned past the monitor's threshold (a CPU hog may starve it)
                engine.cpu_percent(None)
                seen = []
                t_end = time.monotonic() + 2.0
                while time.monotonic() < t_end:
                    seen.append(next(r.active for r in seg.read_slots() if r.pid == pid))
                    time.sleep(0.02)
                burned_pct = engine.cpu_percent(None)
                assert seen and not any(seen), burned_pct
                if burned_pct > 100 * LLAMA_CPU_ACTIVE_CORES:
                    break
            else:
                pytest.fail(f"the engine burned {burned_pct:.0f} % at most: below the threshold, nothing was tested")
        finally:
            end_pid(pid)


def test_paced_engines_report_running_not_stopped(engines):
    """A SIGSTOP outside its window is pacing, not a stopped engine: `status` keeps saying running."""
    _, a, _ = engines.run(1)
    _, b, _ = engines.run(1)
    loads = [start_load(port_of(p)) for p in (a, b)]
    try:
        wait_for(lambda: proc_state(a) == "T" or proc_state(b) == "T", 20, 0.002, "an engine paused by pacing")
        states = {status_json(p)["state"] for _ in range(15) for p in (a, b)}
        states |= {json.loads(run_cli("status", str(p), "--json").stdout)["state"] for p in (a, b)}  # as the CLI says
        assert states == {"running"}
    finally:
        for lo in loads:
            lo.stop()


def _status(pid: int) -> dict:
    return status_json(pid)


def test_lone_engine_learns_its_solo_rate(engines):
    """Alone and decoding, a supervised llama-server's tok/s is measured over 1 s windows of work and its
    best one is its solo rate; idle, tok/s is 0 and the solo rate stays."""
    _, pid, _ = engines.run()
    # tok_s is None until the monitor's first reading (a status asked at once, in-process, may come first)
    st = wait_for(lambda: (s := _status(pid))["tok_s"] is not None and s, 10, 0.05, "the first tok/s reading")
    assert (st["tok_s"], st["solo_tok_s"]) == (0.0, None)  # idle: nothing decoded, never measured
    lo = start_load(port_of(pid), 2000)
    try:
        st = wait_for(lambda: (s := _status(pid))["solo_tok_s"] and s, 20, 0.2, "solo_tok_s while alone")
        assert st["solo_tok_s"] > 0 and st["tok_s"] is not None and 0 < st["tok_s"] <= st["solo_tok_s"]
    finally:
        lo.stop()
    st = wait_for(lambda: (s := _status(pid))["tok_s"] == 0.0 and s, 10, 0.2, "tok/s 0 once idle")
    assert st["solo_tok_s"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_termination_signal_stops_run_in_order(sig, procs, gpu_key, runtime_dir, tmp_path):
    """SIGTERM, SIGINT or SIGHUP to `run` (lifecycle.on_signals: a flag its loops check) ends the
    engine and leaves the slot and the socket; `run` exits with the engine's code."""
    fake = str(Path(__file__).parent / "data" / "idle_engine.py")
    argv = cli_argv("run", "--weight", "1", "--gpu-key", gpu_key, "--name", "idle", "--activity", "llama", "--")
    argv += [sys.executable, fake]
    sup = procs.start(argv, env={**os.environ, "XDG_STATE_HOME": str(tmp_path)})
    wait_for(lambda: read_join_line(sup), 30, what="supervisor join line")
    with Segment.attach_readonly(shm_path(gpu_key)) as seg:
        pid = next(r.pid for r in seg.read_slots() if r.name == "idle")
        assert os.path.exists(os.path.join(runtime_dir, "gpushare-tui", f"{pid}.sock"))
        os.kill(sup.pid, sig)
        assert sup.wait(30) == 128 + signal.SIGTERM, sup.stderr.read()  # the stand-in dies of the SIGTERM it gets
        assert all(r.pid == 0 for r in seg.read_slots())
    assert proc_state(pid) is None
    assert not os.path.exists(os.path.join(runtime_dir, "gpushare-tui", f"{pid}.sock"))


def test_busy_total_counts_continued_work_only(engines):
    """busy_total_us (spec §7) of supervised engines: the time each is continued while it works, so
    about 2:1 under a 2:1 schedule, never more than the wall time together, and not the idle time
    (nor the 2 s activity tail) after the work ends."""
    sup_a, a, _ = engines.run(2, threads=2)
    sup_b, b, _ = engines.run(1, threads=2)
    assert engines.slot_of(a).busy_total_us == 0  # idle since it joined
    loads = [start_load(port_of(p)) for p in (a, b)]
    time.sleep(2.0)
    t0, c0 = time.monotonic(), {p: engines.slot_of(p).busy_total_us for p in (a, b)}
    time.sleep(8.0)
    t1, c1 = time.monotonic(), {p: engines.slot_of(p).busy_total_us for p in (a, b)}
    for lo in loads:
        lo.stop()
    da, db = (c1[p] - c0[p] for p in (a, b))
    elapsed_us = (t1 - t0) * 1e6
    print(f"busy a {da / 1e6:.2f} s, b {db / 1e6:.2f} s over {elapsed_us / 1e6:.2f} s")
    assert db > 0 and 1.4 <= da / db <= 2.8, (da, db)  # continued time follows the 2:1 windows
    assert da + db <= elapsed_us * 1.05 + 1_000_000  # one at a time (heartbeat lag: 0.5 s at each end)
    assert da + db >= elapsed_us * 0.4  # they had work all along (a loaded box loses some)
    # busy_total_us as of a heartbeat after the work wound down (a request the client left ends at the engine's
    # next token, within a period): the heartbeat thread runs late on a loaded box, so it is waited for, not
    # slept for (0.7 s was 2 ms short beside a CPU hog)
    wound_down_us = (time.time() + 0.3) * 1e6
    wait_for(
        lambda: all(engines.slot_of(p).heartbeat_us >= wound_down_us for p in (a, b)),
        10,
        what="a heartbeat after the work's end",
    )
    stopped = {p: engines.slot_of(p).busy_total_us for p in (a, b)}
    wait_for(lambda: not engines.slot_of(a).active and not engines.slot_of(b).active, 8, what="both idle")
    time.sleep(1.0)
    tail = {p: engines.slot_of(p).busy_total_us - stopped[p] for p in (a, b)}
    assert all(us <= 500_000 for us in tail.values()), tail  # not the ~2 s activity tail, nor idle time


@pytest.mark.parametrize("proxy", [True, False], ids=["proxied", "no-proxy"])
def test_an_ipv6_host_is_served(proxy, engines):
    """Issue 26 item 8: `--host ::1` exited "port P on ::1 is already in use" (the port helpers were IPv4 only)."""
    sup, pid, _ = engines.run(1, "--host", "::1", options=() if proxy else ("--no-proxy",))
    port = port_of(pid)
    assert httpx.get(f"http://[::1]:{port}/health", timeout=10).status_code == 200
    body = {"prompt": "the a of", "n_predict": 8, "ignore_eos": True}
    assert httpx.post(f"http://[::1]:{port}/completion", json=body, timeout=60).status_code == 200
    assert sup.poll() is None


def test_a_host_that_names_no_address_is_one_line(gpu_key, llama_server, tiny_model, runtime_dir):  # noqa: F811
    r = run_cli("run", "--gpu-key", gpu_key, "--", llama_server, "-m", tiny_model, "--host", "no-such-host.invalid")
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith(
        "gpushare-tui: --host no-such-host.invalid: host 'no-such-host.invalid':"
    ), r.stderr
