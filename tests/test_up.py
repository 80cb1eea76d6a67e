"""`gpushare-tui up` with synthetic engines (no GPU, no model): start with the file's weights,
live reload, restart with backoff, stop for good from the control socket, clean stop, the
owner's death, one `up` per file, sd_notify, and what the dashboard shows of the owner.
The same behaviours with real llama-servers: test_up_llama.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import time

import pytest
from up_env import UpProc, alive_slots, used_slots, write

from gpushare_tui.core.engines.llama_server import free_port
from gpushare_tui.core.pacing import control
from gpushare_tui.up import config as up_config
from gpushare_tui.up.child import GIVE_UP_AT, PREDECESSORS, Child, IllegalTransition, State
from testkit.cli import run_cli
from testkit.procs import Procs
from testkit.wait import wait_for

pytestmark = pytest.mark.slow

TWO = """\
gpu_key = "{key}"

[[engine]]
name = "a"
weight = 2
synth = {{ step_ms = 5 }}

[[engine]]
name = "b"
weight = 1
synth = {{ step_ms = 5 }}
"""


@pytest.fixture
def state_home(tmp_path, monkeypatch) -> str:
    path = tmp_path / "state"
    path.mkdir()
    monkeypatch.setenv("XDG_STATE_HOME", str(path))  # up's and the engines' logs
    return str(path)


@pytest.fixture
def start_up(procs, gpu_key, runtime_dir, state_home, tmp_path):
    made: list[UpProc] = []

    def start(text: str = TWO, env: dict | None = None) -> UpProc:
        path = write(tmp_path / "gpushare.toml", text.format(key=gpu_key))
        u = UpProc(procs, path, gpu_key, env=env)
        made.append(u)
        return u

    yield start
    for u in made:
        u.end()


def test_up_starts_every_engine_with_the_files_weight_and_reports_the_owner(start_up) -> None:
    up = start_up()
    a_pid, a_w = up.slot("a")
    b_pid, b_w = up.slot("b")
    assert (a_w, b_w) == (2.0, 1.0)
    up.wait_line(f"a: ready: engine pid {a_pid}, slot ")
    up.wait_line(f"b: ready: engine pid {b_pid}, slot ")
    st = control.StatusReply.from_json(control.request(a_pid, "status"))
    assert st.owner == "up" and st.owner_pid == up.proc.pid and st.config == up.path
    assert st.config_weight == 2.0 and st.restarts == 0 and st.weight == 2.0


def test_sighup_reweights_in_place_starts_added_and_stops_removed(start_up) -> None:
    up = start_up()
    a_pid, _ = up.slot("a")
    b_pid, _ = up.slot("b")
    write(up.path, TWO.format(key=up.key).replace("weight = 2", "weight = 4").replace('name = "b"', 'name = "c"'))
    up.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: alive_slots(up.key).get("a") == (a_pid, 4.0), 10, what=f"a re-weighted in place:\n{up.text()}")
    c_pid, c_w = up.slot("c")
    assert c_w == 1.0
    wait_for(lambda: "b" not in alive_slots(up.key) and b_pid not in used_slots(up.key), 15, what="b's slot left")
    wait_for(lambda: not os.path.exists(f"/proc/{b_pid}"), 15, what="b's process gone")
    assert control.StatusReply.from_json(control.request(a_pid, "status")).config_weight == 4.0
    up.wait_line("reloaded ")


def test_invalid_reload_changes_nothing_and_says_so_in_one_line(start_up) -> None:
    up = start_up()
    a_pid, _ = up.slot("a")
    up.slot("b")
    good = open(up.path).read()
    write(up.path, good.replace("weight = 2", "weight = -3"))
    r = run_cli("up", "--reload", up.path)  # checked before it signals
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "weight: must be a number > 0" in r.stderr
    up.proc.send_signal(signal.SIGHUP)  # the running up checks it too
    line = up.wait_line("reload failed, nothing changed")
    assert f"{up.path}:5: engine 'a': weight" in line
    time.sleep(0.5)
    assert alive_slots(up.key)["a"] == (a_pid, 2.0)
    write(up.path, good.replace("weight = 2", "weight = 6"))
    r = run_cli("up", "--reload", up.path)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: alive_slots(up.key).get("a") == (a_pid, 6.0), 10, what="a re-weighted by --reload")


def test_reload_returns_a_weight_edited_by_hand_to_the_files(start_up) -> None:
    """`weight a 5` sets a's weight live (the file says 2: `up ≠file` on the dashboard); `up --reload` with the
    file unchanged sets it back to the file's 2 (the file wins on reload) and says so; b, unedited, is left."""
    up = start_up()
    a_pid, _ = up.slot("a")
    b_pid, _ = up.slot("b")
    r = run_cli("weight", "a", "5")
    assert r.returncode == 0, r.stderr
    assert alive_slots(up.key)["a"] == (a_pid, 5.0)
    r = run_cli("up", "--reload", up.path)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: alive_slots(up.key).get("a") == (a_pid, 2.0), 10, what=f"a back at the file's 2:\n{up.text()}")
    line = up.wait_line("reloaded ")
    assert line.endswith(": a weight 5 → 2 (the file's)"), line
    assert alive_slots(up.key)["b"] == (b_pid, 1.0)
    st = control.StatusReply.from_json(control.request(a_pid, "status"))
    assert (st.weight, st.config_weight) == (2.0, 2.0)
    run_cli("up", "--reload", up.path)
    assert up.wait_line("reloaded ", count=2).endswith(": no change")


def test_reload_restarts_only_an_engine_whose_declaration_changed(start_up) -> None:
    up = start_up()
    a_pid, _ = up.slot("a")
    b_pid, _ = up.slot("b")
    write(up.path, TWO.format(key=up.key).replace("step_ms = 5 }", "step_ms = 6 }", 1))
    assert "step_ms = 6" in open(up.path).read()
    up.proc.send_signal(signal.SIGHUP)
    new_a, _ = up.slot("a", not_pid=a_pid, timeout=20)
    # a read of the segment as the new a joins may be torn (alive_slots: nothing then): b's slot, read again
    b_now = wait_for(lambda: alive_slots(up.key).get("b"), 5, what=f"b's slot:\n{up.text()}")
    assert new_a != a_pid and b_now[0] == b_pid  # b, unchanged in the file, kept running


def test_killed_engine_is_restarted_with_a_new_pid(start_up) -> None:
    up = start_up()
    a_pid, _ = up.slot("a")
    os.kill(a_pid, signal.SIGKILL)
    t0 = time.monotonic()
    new_pid, w = up.slot("a", not_pid=a_pid, timeout=15)
    assert w == 2.0 and new_pid != a_pid
    assert time.monotonic() - t0 >= 0.9  # the first backoff is 1 s
    # "after N s healthy", or "before it was ready" when up had not seen it ready yet (a loaded box);
    # no cause: a killed engine's last log line is not why it ended
    line = up.wait_line("a: exited (signal 9) ")
    assert line.endswith("; restart 1 in 1 s") and ": gpushare-tui:" not in line, line
    up.wait_line("restart 1 in 1 s")
    assert control.StatusReply.from_json(control.request(new_pid, "status")).restarts == 1


def test_a_crash_loop_backs_off_and_is_reported(start_up, tmp_path) -> None:
    # a health check it never meets: with none, a command is ready once joined, and a loaded box can let
    # the supervisor join before `sh` exits (then "ready", and not the same never-ready failure 5 times)
    crash = TWO.replace(
        "synth = {{ step_ms = 5 }}\n\n[[engine]]",
        'command = ["sh", "-c", "echo no such model here >&2; exit 3"]\nhealth = {{ log = "never said" }}'
        "\n\n[[engine]]",
        1,
    )
    up = start_up(crash)
    up.slot("b")
    up.wait_line("a: failed to start: engine exited with code 3 while loading")
    up.wait_line("restart 1 in 1 s")
    up.wait_line("restart 2 in 2 s", timeout=30)
    line = up.wait_line("restart 3 in 4 s", timeout=30)
    assert "crash loop: 3 failures in a row" in line
    # the same cause every time, never ready: given up (not a crash loop for ever), saying why
    line = up.wait_line("a: exited (code ", timeout=60, count=GIVE_UP_AT)
    assert "gave up: 5 starts in a row not ready, failing the same way" in line, up.text()
    assert "engine exited with code 3 while loading; its log's last line: no such model here" in line
    assert f"up --reload {up.path}" in line
    time.sleep(2.5)
    assert sum("a: starting" in x for x in up.lines) == GIVE_UP_AT
    assert "b" in alive_slots(up.key)


def test_serve_on_a_port_in_use_says_why_and_is_given_up_until_reload(start_up) -> None:
    """The cause (the serve child's error line) on up's stderr, never "listening" before it has
    bound; restarts back off, then stop; a reload once the port is free starts it again."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        up = start_up(TWO + f'\n[serve]\nlisten = "127.0.0.1:{port}"\n'.replace("{", "{{").replace("}", "}}"))
        up.slot("a")
        first = up.wait_line("serve: exited (code 1)", timeout=30)
        cause = f"gpushare-tui: cannot listen on 127.0.0.1:{port}: the port is in use"
        assert f"serve: exited (code 1) before it was ready: {cause}; restart 1 in 1 s" in first
        line = up.wait_line("serve: exited (code 1)", timeout=60, count=GIVE_UP_AT)
        assert "the port is in use; gave up: 5 starts in a row not ready" in line
        assert not any("serve: listening" in x for x in up.lines)
    finally:
        taken.close()
    time.sleep(1.5)
    assert sum("serve: starting" in x for x in up.lines) == GIVE_UP_AT
    up.proc.send_signal(signal.SIGHUP)
    up.wait_line("started serve again")
    up.wait_line(f"serve: listening on 127.0.0.1:{port} (pid ", timeout=30)


def test_two_files_declaring_the_same_engine_name_have_their_own_logs(
    procs, gpu_key, runtime_dir, state_home, tmp_path
) -> None:
    one = 'gpu_key = "{key}"\n\n[[engine]]\nname = "chat"\nweight = {w}\nsynth = {{ step_ms = 2 }}\n'
    ups = []
    for i, w in ((1, 1), (2, 3)):
        (tmp_path / f"d{i}").mkdir()
        path = write(tmp_path / f"d{i}" / "gpushare.toml", one.format(key=gpu_key, w=w))
        ups.append(UpProc(procs, path, gpu_key))
    try:
        logs, weights = {}, {}
        for u, w in zip(ups, (1, 3)):
            u.wait_line("chat: ready: engine pid ")
            pid = next(int(x.split("engine pid ")[1].split(",")[0]) for x in u.lines if "chat: ready" in x)
            u.seen_pids.add(pid)
            status = json.loads(run_cli("status", str(pid), "--json").stdout)
            logs[pid], weights[pid] = status["log"], w
            assert os.path.dirname(status["log"]) == os.path.join(state_home, "gpushare-tui")
        assert len(set(logs.values())) == 2, logs
        for pid, log in logs.items():
            r = run_cli("logs", str(pid), "-n", "1000")
            assert r.returncode == 0, r.stderr
            assert r.stdout.splitlines() == open(log).read().splitlines()
            other = 4 - weights[pid]  # each log is its own engine's only: its "joined" line has its weight
            assert f"(weight {weights[pid]}, " in r.stdout and f"(weight {other}, " not in r.stdout, r.stdout
    finally:
        for u in ups:
            u.end()


def test_stop_from_the_control_socket_is_for_good_until_reload(start_up) -> None:
    up = start_up()
    a_pid, _ = up.slot("a")
    r = run_cli("stop", str(a_pid))  # what the dashboard's `s` sends
    assert r.returncode == 0, r.stderr
    up.wait_line("a: stopped on request")
    time.sleep(2.5)  # longer than the first backoff
    assert "a" not in alive_slots(up.key)
    up.proc.send_signal(signal.SIGHUP)
    up.slot("a", not_pid=a_pid)
    up.wait_line("started a again")


def test_sigterm_stops_every_engine_leaves_slots_and_exits_0(start_up) -> None:
    up = start_up()
    pids = [up.slot("a")[0], up.slot("b")[0]]
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(15) == 0
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}")
    assert used_slots(up.key) == []
    assert "all engines stopped" in up.text()


def test_sigkill_of_up_ends_its_engines_and_leaves_none_stopped(start_up) -> None:
    up = start_up()
    pids = [up.slot("a")[0], up.slot("b")[0]]
    up.proc.kill()
    up.proc.wait(5)
    for pid in pids:
        wait_for(lambda p=pid: not os.path.exists(f"/proc/{p}"), 10, what=f"engine {pid} gone")
    wait_for(lambda: used_slots(up.key) == [], 5, what="slots left")


def test_one_up_per_file_and_reload_needs_a_running_up(start_up) -> None:
    up = start_up()
    up.slot("a")
    r = run_cli("up", up.path)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"gpushare-tui: an up for {up.path} is already running (pid {up.proc.pid}); "
        f"reload it with: gpushare-tui up --reload {up.path}"
    ]
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(15) == 0
    r = run_cli("up", "--reload", up.path)
    assert r.returncode == 1 and r.stderr.splitlines() == [f"gpushare-tui: no up is running for {up.path}"]


def test_sd_notify_ready_and_stopping(start_up, tmp_path) -> None:
    addr = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(addr)
        s.settimeout(30)
        up = start_up(env={**os.environ, "NOTIFY_SOCKET": addr})
        assert s.recv(100) == b"READY=1"
        assert len(alive_slots(up.key)) == 2  # ready means every engine is up
        up.proc.send_signal(signal.SIGTERM)
        assert s.recv(100) == b"STOPPING=1"
        assert up.proc.wait(15) == 0


def test_dashboard_shows_the_owner_and_a_live_edit_as_differing(start_up) -> None:
    from gpushare_tui.dashboard.source import LiveSource
    from gpushare_tui.widgets.peers_table import cell_text

    up = start_up()
    a_pid, _ = up.slot("a")
    up.slot("b")
    src = LiveSource(up.key, status_every_s=0.0)
    try:

        def row():
            rows = [r for r in src.collect().rows() if r.peer.pid == a_pid and r.engine and r.engine.state]
            return rows[0] if rows else None

        r = wait_for(row, 10, what="a's row with its status")
        assert r.engine.owner_config == up.path and r.engine.config_weight == 2.0
        assert not r.differs_from_config and cell_text(r, "engine") == "up run"
        assert run_cli("weight", str(a_pid), "5").returncode == 0
        r = wait_for(lambda: (x := row()) and x.peer.weight == 5.0 and x, 10, what="weight 5 shown")
        assert r.differs_from_config and cell_text(r, "engine") == "up ≠file"
    finally:
        src.close()


def test_serve_table_starts_the_exporter(start_up) -> None:
    port = free_port()
    up = start_up(TWO + f'\n[serve]\nlisten = "127.0.0.1:{port}"\n'.replace("{", "{{").replace("}", "}}"))
    up.wait_line(f"serve: listening on 127.0.0.1:{port}")
    import httpx

    wait_for(lambda: _get(httpx, f"http://127.0.0.1:{port}/metrics"), 20, what="the exporter answering")
    assert json.dumps  # the body's content is issue 9's to test


def _get(httpx, url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# -- up/child.Child: the state machine, driven directly (real synth processes) ------------------


@pytest.fixture
def make_child(gpu_key, runtime_dir, state_home, tmp_path):
    """make_child(text) -> (Child of the file's first engine, the lines it said); its processes
    are ended at teardown."""
    made: list[Child] = []

    def make(text: str = TWO) -> tuple[Child, list[str]]:
        cfg = up_config.load(write(tmp_path / "gpushare.toml", text.format(key=gpu_key)))
        lines: list[str] = []
        c = Child(cfg.engines[0], gpu_key, cfg, state_home, lines.append)
        made.append(c)
        return c, lines

    yield make
    for c in made:
        if c.proc is not None:
            Procs.kill(c.proc)
        c._close_pipes()


def _tick_until(c: Child, state: State, timeout: float = 30) -> None:
    def reached() -> bool:
        c.tick(time.monotonic())
        return c.state is state

    wait_for(reached, timeout, 0.05, f"{c.name} {state.value} (now {c.state.value})")


def test_child_goes_new_starting_running_stopping_stopped_saying_each(make_child) -> None:
    c, lines = make_child()
    assert c.state is State.NEW
    c.start()
    assert c.state is State.STARTING and lines[-1].startswith(f"a: starting (pid {c.proc.pid}, log ")
    pid = c.proc.pid
    _tick_until(c, State.RUNNING)
    assert lines[-1].startswith(f"a: ready: engine pid {pid}, slot ") and ", weight 2, " in lines[-1]
    c.stop()
    assert c.state is State.STOPPING and lines[-1] == f"a: stopping (SIGTERM to pid {pid})"
    _tick_until(c, State.STOPPED)
    assert lines[-1].startswith("a: stopped (") and c.proc is None
    assert len(lines) == 4  # one line per change
    with pytest.raises(IllegalTransition, match="stopped -> running"):
        c._to(State.RUNNING)


def test_a_child_exiting_with_invalid_input_is_given_up_at_once_saying_why(make_child) -> None:
    """A usage error (exit 2) before it was ready cannot be fixed by restarting: stopped, not backed off,
    with the child's own error line (here: a share group this host does not have, which `up`
    itself checks first; a Child made directly does not)."""
    c, lines = make_child('share_group = "no-such-group-i18"\n' + TWO)
    c.start()
    _tick_until(c, State.STOPPED)
    assert "a: exited (code 2): gpushare-tui: " in lines[-1] and "no-such-group-i18" in lines[-1], lines
    assert "gave up: exit 2 is invalid input, which a restart cannot fix" in lines[-1]
    assert c.restarts == 0 and not any("restart 1" in x for x in lines)


def test_illegal_transitions_are_refused() -> None:
    assert all(State.REMOVED not in before for before in PREDECESSORS.values())  # REMOVED is final
    assert all(PREDECESSORS[s] for s in State if s is not State.NEW)  # every other state is reachable
    assert PREDECESSORS[State.RUNNING] == {State.STARTING}
    cfg = up_config.UpConfig("x.toml", engines=(up_config.EngineDecl("a", synth=up_config.SynthDecl()),))
    c = Child(cfg.engines[0], "k", cfg, "/nonexistent", lambda _line: None)
    with pytest.raises(IllegalTransition, match="a: new -> running"):
        c._to(State.RUNNING)
    c.stop(then="remove")  # never started: removed at once
    assert c.state is State.REMOVED
    with pytest.raises(IllegalTransition, match="a: removed -> starting"):
        c.start()  # refused before anything is spawned
    assert c.proc is None


def test_redeclare_reweights_live_restarts_on_change_and_starts_a_stopped_one(make_child) -> None:
    c, lines = make_child()
    c.start()
    _tick_until(c, State.RUNNING)
    pid, cfg = c.proc.pid, c.cfg
    decl = c.decl
    heavier = dataclasses.replace(decl, weight=3.0)
    assert c.redeclare(heavier, c.key, cfg) == ["a weight 3"]
    assert c.state is State.RUNNING and c.proc.pid == pid and c.decl == heavier
    assert control.StatusReply.from_json(control.request(pid, "status")).config_weight == 3.0
    assert c.redeclare(heavier, c.key, cfg) == []  # no change, nothing done
    slower = dataclasses.replace(heavier, synth=up_config.SynthDecl(step_ms=6.0))
    assert c.redeclare(slower, c.key, cfg) == ["restarted a"]
    assert c.state is State.STOPPING
    _tick_until(c, State.STARTING)  # stopped, then started again at once
    assert c.proc.pid != pid and "--step-ms" in c.argv(-1) and "6.0" in c.argv(-1)
    _tick_until(c, State.RUNNING)
    c.stop()
    _tick_until(c, State.STOPPED)
    assert c.redeclare(slower, c.key, cfg) == ["started a again"] and c.state is State.STARTING


def test_redeclared_while_being_removed_it_restarts_instead(make_child) -> None:
    c, lines = make_child()
    c.start()
    _tick_until(c, State.RUNNING)
    pid = c.proc.pid
    c.stop(then="remove")
    assert c.redeclare(c.decl, c.key, c.cfg) == ["restarted a"]
    _tick_until(c, State.RUNNING)
    assert c.proc.pid != pid


def test_a_declared_class_reaches_the_engine(start_up) -> None:
    """`class = "interactive"` (issue 20): the engine publishes INTERACTIVE and says so in `status`;
    an engine without the key is batch."""
    from gpushare_tui.core.registry import abi
    from gpushare_tui.core.registry.segment import Segment, shm_path

    up = start_up(TWO.replace('name = "a"\n', 'name = "a"\nclass = "interactive"\n'))
    a_pid, _ = up.slot("a")
    b_pid, _ = up.slot("b")
    up.wait_line(f"a: ready: engine pid {a_pid}, slot ")
    assert control.request(a_pid, "status")["class"] == "interactive"
    assert control.request(b_pid, "status")["class"] == "batch"
    with Segment.attach_readonly(shm_path(up.key)) as seg:
        flags = {r.pid: r.flags for r in seg.read_slots()}
    assert flags[a_pid] & abi.FLAG_INTERACTIVE and not flags[b_pid] & abi.FLAG_INTERACTIVE
