"""Engines other than llama-server under the supervisor (issue 19), real processes throughout: a small
HTTP engine (/health 503 then 200, CPU work in a worker process, an in-flight gauge) paced by
`--activity metrics`; a multi-process job under `--activity cpu` (its workers stop and continue
together; a SIGKILLed supervisor's tree is continued, then ended); `--activity always`; each health source."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time

import httpx
import pytest
from llama_env import proc_state, read_join_line

from gpushare_tui.core.registry.segment import Segment, shm_path
from testkit.cli import cli_argv, run_cli, run_cli_here
from testkit.engines import engine_command
from testkit.engines.http_engine import DEFAULT_GAUGE, HttpLoad
from testkit.wait import wait_for

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Runs:
    """`gpushare-tui run` supervisors started by a test; their engines' process groups ended at teardown."""

    def __init__(self, procs, key: str, state_dir: str) -> None:
        self.procs, self.key = procs, key
        self.env = {**os.environ, "XDG_STATE_HOME": state_dir}
        self.engine_pids: list[int] = []

    def run(self, *options: str, engine: list[str], weight: float = 1.0, name: str = "e"):
        """(supervisor, engine pid) once it joined."""
        notice_r, notice_w = os.pipe2(os.O_CLOEXEC)
        argv = cli_argv("run", "--weight", str(weight), "--gpu-key", self.key, "--name", name)
        argv += ["--notify-fd", str(notice_w), *options, "--", *engine]
        try:
            sup = self.procs.start(argv, pass_fds=(notice_w,), env=self.env)
        finally:
            os.close(notice_w)
        with os.fdopen(notice_r, "rb") as pipe:
            wait_for(lambda: read_join_line(sup), 60, what="supervisor join line")
            assert select.select([pipe], [], [], 30)[0], "no ready notice"
            notice = json.loads(pipe.readline())
        pid = int(notice["engine_pid"])
        self.engine_pids.append(pid)
        return sup, pid

    def slot_of(self, pid: int):
        with Segment.attach_readonly(shm_path(self.key)) as seg:
            return next((r for r in seg.read_slots() if r.pid == pid), None)

    def end(self) -> None:
        for pid in self.engine_pids:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(pid, sig)
                except (ProcessLookupError, PermissionError):
                    break


@pytest.fixture
def runs(procs, gpu_key, runtime_dir, tmp_path):
    r = Runs(procs, gpu_key, str(tmp_path))
    yield r
    r.end()


def http_engine(port: int, *extra: str) -> list[str]:
    return engine_command("http_engine", "--port", str(port), *extra)


def tree_engine(workers: int = 2) -> list[str]:
    return engine_command("multiproc_engine", "--workers", str(workers))


def metrics_options(port: int) -> list[str]:
    return [
        "--activity", "metrics", "--metrics-url", f"http://127.0.0.1:{port}/metrics",
        "--gauge", DEFAULT_GAUGE, "--health-url", f"http://127.0.0.1:{port}/health",
    ]  # fmt: skip


def tree_of(pid: int) -> list[int]:
    import psutil

    return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]


SPLIT_PERSIST_S = 0.1  # a SIGSTOP is taken as each process next runs: tens of ms on this box under load


def continued_ratio(a: list[int], b: list[int], seconds: float) -> tuple[float, float, dict]:
    """(continued samples of a / of b, the fraction of the time a's processes disagreed (some stopped,
    some not) for longer than SPLIT_PERSIST_S at a stretch, counts): /proc states of two engines'
    processes sampled every 2 ms. Each SIGSTOP takes effect only as its target next runs, tens of ms
    on a loaded 2-core box: that lag is a short disagreement at each edge (counted in `split`, not in
    the persistent fraction) and shortens both engines' stopped spans alike, which pulls a 2:1
    continued-time ratio towards 1; `only_a`/`only_b`: the samples where one ran alone."""
    cont = {"a": 0, "b": 0, "split": 0, "n": 0, "stopped_a": 0, "stopped_b": 0, "only_a": 0, "only_b": 0}
    persistent_s = 0.0
    split_since: float | None = None
    t0 = time.monotonic()
    t_end = t0 + seconds
    while (now := time.monotonic()) < t_end:
        sa = [proc_state(p) for p in a]
        sb = [proc_state(p) for p in b]
        cont["a"] += sa[0] != "T"
        cont["b"] += sb[0] != "T"
        cont["stopped_a"] += sa[0] == "T"
        cont["stopped_b"] += sb[0] == "T"
        cont["only_a"] += sa[0] != "T" and sb[0] == "T"
        cont["only_b"] += sb[0] != "T" and sa[0] == "T"
        split = len({s == "T" for s in sa}) > 1
        cont["split"] += split
        cont["n"] += 1
        if split and split_since is None:
            split_since = now
        elif not split and split_since is not None:
            persistent_s += max(0.0, now - split_since - SPLIT_PERSIST_S)
            split_since = None
        time.sleep(0.002)
    if split_since is not None:
        persistent_s += max(0.0, time.monotonic() - split_since - SPLIT_PERSIST_S)
    return cont["a"] / max(1, cont["b"]), persistent_s / (time.monotonic() - t0), cont


def assert_two_to_one(ratio: float, counts: dict) -> None:
    """Paced 2:1, by test_supervisor's measure (continued time) and bounds. Measured 1.65 at load 7; at load
    11-13 (eight engineers' test runs on 2 cores) 1.17-1.73 here and the base branch's llama-server 2:1
    test failed alike: an overloaded box, not this code (the integrator re-measures on a quiet one)."""
    alone = counts["only_a"] / max(1, counts["only_b"])
    print(f"continued {ratio:.2f}, ran alone {alone:.2f}")
    assert 1.6 <= ratio <= 2.5, (ratio, alone, counts)


# -- the HTTP engine under --activity metrics -----------------------------------------------------------


def test_metrics_source_raises_and_releases_within_2_5_s(runs) -> None:
    port = free_port()
    sup, pid = runs.run(*metrics_options(port), engine=http_engine(port))
    st = json.loads(run_cli("status", str(pid), "--json").stdout)
    assert (st["kind"], st["activity"], st["state"]) == ("command", "metrics", "running")
    assert not runs.slot_of(pid).active
    load = HttpLoad(port).start()
    wait_for(lambda: runs.slot_of(pid).active, 2.0, 0.005, "active raised")
    time.sleep(1.0)
    load.stop()  # joins the request in flight
    t_last = time.monotonic()
    wait_for(lambda: not runs.slot_of(pid).active, 5.0, 0.01, "active dropped")
    release_s = time.monotonic() - t_last
    print(f"metrics source: idle release {release_s:.2f} s")
    assert release_s <= 2.5, release_s  # issue 19's target (the 2 s window + one active probe at most)


def test_a_short_window_is_probed_as_its_engine_is_continued(runs, tmp_path) -> None:
    """Weight 1 beside a peer of weight 2: a 40 ms window in 120, and a probe may start only while the engine
    runs and 30 ms before its window ends (9.5 ms of every 120). A probe refused goes out as the engine is next
    continued: the gauge is read every ~0.36 s, not about once a second (measured 0.36-1.67 s apart: a 50 ms tick
    had to land in those 9.5 ms), and a gauge read between two requests then let the activity lapse. The gauge
    is served by the engine itself (only the engine's own listener is believed) and logs each read's time."""
    import statistics

    from gpushare_tui.core.registry.membership import Membership

    port, hits_path = free_port(), tmp_path / "hits"
    gauge_engine = (
        "import http.server, sys, time\n"
        "port, hits, body = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode()\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        with open(hits, 'a') as f: f.write(f'{time.monotonic()}\\n')\n"
        "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
        "        self.wfile.write(body)\n"
        "    def log_message(self, *a): pass\n"
        "http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()\n"
    )
    peer = Membership(runs.key, 2.0, "peer", ext1=True)  # this process: it holds DEMAND, nothing stops it
    peer.join()
    peer.set_demand(True)

    def hits() -> list[float]:
        return [float(x) for x in hits_path.read_text().split()] if hits_path.exists() else []

    try:
        engine = [sys.executable, "-c", gauge_engine, str(port), str(hits_path), f"{DEFAULT_GAUGE} 1\n"]
        _, pid = runs.run(*metrics_options(port), engine=engine)
        wait_for(lambda: proc_state(pid) == "T", 10, 0.002, what="the engine paced (stopped outside its window)")
        time.sleep(0.5)
        seen = len(hits())
        time.sleep(6.0)
        got = hits()
        gaps = [b - a for a, b in zip(got[seen:], got[seen + 1 :])]
        long = [g for g in gaps if g > 0.5]  # 3 periods (0.36 s) or one more: a continue missed under load
        print(f"gauge read every {statistics.median(gaps):.2f} s (median; max {max(gaps):.2f} s), {len(gaps)} gaps")
        assert len(gaps) >= 10 and statistics.median(gaps) <= 0.45 and len(long) <= 2, gaps
    finally:
        peer.leave()


def test_two_http_engines_paced_two_to_one_by_their_gauges(runs) -> None:
    pa, pb = free_port(), free_port()
    _, a = runs.run(*metrics_options(pa), engine=http_engine(pa), weight=2, name="a")
    _, b = runs.run(*metrics_options(pb), engine=http_engine(pb), weight=1, name="b")
    loads = [HttpLoad(pa).start(), HttpLoad(pb).start()]
    wait_for(lambda: runs.slot_of(a).active and runs.slot_of(b).active, 5, what="both active")
    time.sleep(1.0)
    ratio, split, counts = continued_ratio(tree_of(a), tree_of(b), 8.0)
    for lo in loads:
        lo.stop()
    done = [len(lo.done) for lo in loads]
    print(f"metrics 2:1 twins: continued ratio {ratio:.2f}, split {split:.3f}, {counts}, done {done}")
    # the pacing's own measure, as test_supervisor's 2:1 test: continued time 2:1 (tolerant on a loaded box)
    assert counts["stopped_a"] > 0 and counts["stopped_b"] > 0, counts
    assert_two_to_one(ratio, counts)
    assert split < 0.05, (split, counts)  # the worker stops and continues with its engine


@pytest.mark.llama
def test_http_engine_paced_beside_a_real_llama_server(runs, llama_server, tiny_model) -> None:
    from testkit.load import StreamLoad
    from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS

    port, lport = free_port(), free_port()
    _, a = runs.run(*metrics_options(port), engine=http_engine(port), weight=2, name="http")
    _, b = runs.run(engine=[llama_server, "-m", tiny_model, "-t", "1", "-c", "1024", "--port", str(lport)], name="ll")
    st = json.loads(run_cli("status", str(b), "--json").stdout)
    assert (st["kind"], st["activity"]) == ("llama-server", "llama")
    work = HttpLoad(port).start()
    tokens = StreamLoad(lport, 2000, banned_tokens=NON_TEXT_TOKEN_IDS).start()
    try:
        wait_for(lambda: runs.slot_of(a).active and runs.slot_of(b).active, 10, what="both active")
        time.sleep(1.0)
        ratio, _, counts = continued_ratio(tree_of(a), [b], 8.0)
    finally:
        work.stop()
        tokens.stop()
    print(f"metrics 2:1 beside llama-server: continued ratio {ratio:.2f}, {counts}")
    assert counts["stopped_a"] > 0 and counts["stopped_b"] > 0, counts
    assert_two_to_one(ratio, counts)


# -- a multi-process job under --activity cpu -----------------------------------------------------------


CPU_OPTIONS = ("--activity", "cpu", "--cpu-cores", "0.1")  # an idle tree (sleeping) reads 0


def workers_of(pid: int, n: int = 2) -> list[int]:
    """The `n` worker processes of a multiproc_engine (its other child is multiprocessing's resource tracker)."""
    import psutil

    def workers() -> list[int] | None:
        kids = [c for c in psutil.Process(pid).children() if "spawn_main" in " ".join(c.cmdline())]
        return [c.pid for c in kids] if len(kids) == n else None

    return wait_for(workers, 20, what=f"{n} workers")


def test_tree_workers_stop_and_continue_together_and_a_sigkilled_supervisors_tree_ends(runs) -> None:
    # --cpu-cores 0.1: on a 2-core box with ~12 runnable processes two spinning workers get ~0.3 cores
    sup_a, a = runs.run(*CPU_OPTIONS, engine=tree_engine(), weight=1, name="tree")
    _, b = runs.run("--activity", "always", engine=tree_engine(), weight=1, name="job")
    st = json.loads(run_cli("status", str(a), "--json").stdout)
    assert (st["kind"], st["activity"], st["port"]) == ("command", "cpu", None)
    wa, wb = workers_of(a), workers_of(b)
    ta = tree_of(a)  # the engine, its workers and multiprocessing's resource tracker
    assert set(wa) < set(ta) and {os.getpgid(p) for p in ta} == {a}  # the engine leads its own group, all in it
    wait_for(lambda: runs.slot_of(a).active and runs.slot_of(b).active, 5, what="both active")
    # the engine and both workers stop and continue together: they disagree only briefly at the hand-off
    # (see continued_ratio); a SIGSTOP to the leader alone leaves the workers running through every
    # stopped spell (~50% of the time)
    _, split, counts = continued_ratio(ta, wb, 4.0)
    assert counts["stopped_a"] > 0 and counts["stopped_b"] > 0, counts
    print(f"cpu tree: leader/worker persistent split {split:.3f}, {counts}")
    assert split < 0.05, (split, counts)
    # SIGKILL the supervisor while its tree is stopped: the watchdog continues the whole group, then ends it
    wait_for(lambda: all(proc_state(p) == "T" for p in ta), 10, 0.001, "the tree stopped by its supervisor")
    os.kill(sup_a.pid, signal.SIGKILL)
    wait_for(lambda: all(proc_state(p) in (None, "Z") for p in ta), 15, what="the orphaned tree's end")
    wait_for(lambda: not _watchdogs_of(a), 5, what="the watchdog's exit")  # it ended the group and exited


def _watchdogs_of(pgid: int) -> list[int]:
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        script = next((i for i, a in enumerate(cmd) if a.endswith("watchdog.py")), None)  # watchdog.py PGID GRACE_S
        if script is not None and cmd[script + 1 : script + 2] == [str(pgid)]:
            found.append(p.pid)
    return found


def test_launch_a_command_detached_and_stop_it(runs) -> None:
    """`launch` passes the activity and health options through to `run` (spawn.run_argv); a command with no
    --port is shown with it; `stop` ends its whole tree, and its watchdog goes with its supervisor."""
    port = free_port()
    r = run_cli(
        "launch", "--json", "--gpu-key", runs.key, "--name", "web", *metrics_options(port), "--",
        *http_engine(port, "--load-s", "0.5"), env=runs.env, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    pid = info["engine_pid"]
    runs.engine_pids.append(pid)
    assert info["port"] == port and httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
    st = json.loads(run_cli("status", str(pid), "--json").stdout)
    assert (st["kind"], st["activity"], st["name"]) == ("command", "metrics", "web")
    workers = tree_of(pid)[1:]
    assert workers and _watchdogs_of(pid)
    assert run_cli("stop", str(pid)).returncode == 0
    wait_for(lambda: proc_state(info["supervisor_pid"]) in (None, "Z"), 20, what="supervisor exit")
    assert all(proc_state(p) in (None, "Z") for p in (pid, *workers))
    wait_for(lambda: not _watchdogs_of(pid), 5, what="the watchdog's exit")


def test_cpu_source_releases_an_idle_tree_within_2_5_s(runs) -> None:
    """A tree that stops working (its workers' --work-cpu-s done: they sleep) drops `active` within 2.5 s."""
    _, a = runs.run(*CPU_OPTIONS, engine=[*tree_engine(), "--work-cpu-s", "3"], name="tree")
    wa = workers_of(a)
    wait_for(lambda: runs.slot_of(a).active, 10, 0.005, "active raised by the tree's CPU")
    # a spinning worker is R (running or runnable); one done with its work sleeps (S)
    wait_for(lambda: all(proc_state(w) == "S" for w in wa), 60, 0.005, "the workers idle")
    t_last = time.monotonic()
    wait_for(lambda: not runs.slot_of(a).active, 5, 0.01, "active dropped")
    print(f"cpu source: idle release {time.monotonic() - t_last:.2f} s")
    assert time.monotonic() - t_last <= 2.5


# -- --activity always beside a llama-server that goes idle ---------------------------------------------


@pytest.mark.llama
def test_always_job_gets_the_machine_back_within_2_5_s_of_llama_going_idle(runs, llama_server, tiny_model) -> None:
    from testkit.load import StreamLoad
    from testkit.tiny_gguf import NON_TEXT_TOKEN_IDS

    lport = free_port()
    _, job = runs.run("--activity", "always", engine=tree_engine(1), name="job")
    _, ll = runs.run(engine=[llama_server, "-m", tiny_model, "-t", "1", "-c", "1024", "--port", str(lport)], name="ll")
    tokens = StreamLoad(lport, 2000, banned_tokens=NON_TEXT_TOKEN_IDS).start()
    wait_for(lambda: proc_state(job) == "T", 10, 0.001, "the job paced beside the busy llama-server")
    tokens.stop()
    t_idle = time.monotonic()
    last_stopped = t_idle
    while time.monotonic() < t_idle + 4.0:
        if proc_state(job) == "T":
            last_stopped = time.monotonic()
        time.sleep(0.002)
    print(f"always beside llama-server: last stopped {last_stopped - t_idle:.2f} s after the load ended")
    assert last_stopped - t_idle <= 2.5, last_stopped - t_idle
    assert runs.slot_of(job).active and not runs.slot_of(ll).active


# -- health sources, and errors -------------------------------------------------------------------------


@pytest.mark.parametrize("health", ["http", "tcp", "log", "none"])
def test_each_health_source_starts_an_engine(runs, health) -> None:
    port = free_port()
    options = {
        "http": ["--health-url", f"http://127.0.0.1:{port}/health"],
        "tcp": ["--health-port", str(port)],
        "log": ["--health-log", r"^ready \d+ workers"],
        "none": ["--no-health"],
    }[health]
    t0 = time.monotonic()
    _, pid = runs.run(*options, engine=http_engine(port, "--load-s", "1.0"))
    joined_s = time.monotonic() - t0
    ready = httpx.get(f"http://127.0.0.1:{port}/health").status_code if health != "none" else None
    if health in ("http", "log"):
        assert ready == 200 and joined_s >= 1.0, (ready, joined_s)  # waited for the end of loading
    if health == "tcp":
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert proc_state(pid) not in (None, "T", "Z")


@pytest.mark.parametrize("health", ["--no-health", "--health-log=never printed"])
def test_an_exit_during_load_fails_with_the_log_tail(runs, health) -> None:
    port = free_port()
    argv = cli_argv("run", "--gpu-key", runs.key, health, "--", *http_engine(port, "--exit-during-load", "3"))
    r = run_cli(*argv[3:], env=runs.env, timeout=60)
    if health == "--no-health":  # ready at once: joined, then the engine's own exit code
        assert r.returncode == 3, r.stderr
        return
    assert r.returncode == 1, r.stderr
    assert "exited with code 3 while loading" in r.stderr and "out of memory while loading" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_activity_and_health_values_are_one_line_exit_2(runs) -> None:
    engine = [sys.executable, "-c", "pass"]
    cases = [
        ("--activity", "gpu"),  # no NVML on this host (a GPU host with the key of a device passes)
        ("--activity", "bogus"),
        ("--activity", "metrics"),
        ("--activity", "cpu", "--gauge", "g"),
        ("--health-port", "0"),
        ("--health-log", "("),
        ("--health-url", "ftp://x"),
        ("--no-health", "--health-port", "80"),
        ("--cpu-cores", "0", "--activity", "cpu"),
    ]
    for command in ("run", "launch"):
        for i, case in enumerate(cases):  # the first in a real process, the others here: the message is the subject
            argv = (command, "--gpu-key", runs.key, *case, "--", *engine)
            r = run_cli(*argv, env=runs.env) if i == 0 else run_cli_here(*argv)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (command, case, r.stderr)
    r = run_cli("run", "--gpu-key", runs.key, "--activity", "gpu", "--", *engine, env=runs.env)
    assert "--activity gpu needs NVML" in r.stderr
