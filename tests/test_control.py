"""Control socket (one JSON line each way) against a real synth engine process."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import stat
import subprocess
import sys

import pytest

from gpushare_tui.core.host import paths
from gpushare_tui.core.pacing import control
from gpushare_tui.core.pacing.control import ControlError, ControlServer, SignalLateness, StatusReply
from gpushare_tui.core.registry import abi, ownership
from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.registry.ownership import Owner
from gpushare_tui.core.registry.segment import Segment
from testkit.cli import cli_argv
from testkit.shm import shm_file
from testkit.wait import wait_for


def _raw(path: str, payload: bytes) -> dict:
    return json.loads(control.exchange(path, payload, 5))


@pytest.fixture
def engine(procs, gpu_key: str, runtime_dir: str):
    p = procs.start(cli_argv("synth", "--weight", "1.5", "--name", "ctl", "--gpu-key", gpu_key, "--step-ms", "1", "-q"))
    path = os.path.join(runtime_dir, "gpushare-tui", f"{p.pid}.sock")
    wait_for(lambda: os.path.exists(path), 15, what="the control socket")
    assert control.socket_path(p.pid) == path
    return p


@pytest.mark.slow
def test_socket_is_private(engine, runtime_dir: str) -> None:
    d = os.path.join(runtime_dir, "gpushare-tui")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(control.socket_path(engine.pid)).st_mode) == 0o600
    assert control.is_managed(engine.pid) and not control.is_managed(os.getpid())


@pytest.mark.slow
def test_status(engine, gpu_key: str) -> None:
    r = control.request(engine.pid, "status")
    assert r["ok"] is True
    assert r["engine_pid"] == engine.pid and r["kind"] == "synth" and r["gpu_key"] == gpu_key
    assert r["weight"] == 1.5 and r["slot"] == 0 and r["state"] == "running"
    assert r["share_pct"] in (0.0, 100.0) and r["uptime_s"] >= 0
    for k in ("tok_s", "busy_pct", "port", "model"):
        assert k in r
    assert set(r) == {"ok", *StatusReply().to_json()}  # every field of the typed reply, null when unknown
    st = StatusReply.from_json(r)
    assert (st.name, st.port, st.log, st.signal_lateness) == ("ctl", None, None, None)


def test_status_reply_round_trip() -> None:
    full = StatusReply(
        engine_pid=1, port=8080, model="m.gguf", name="n", kind="llama-server", state="running", tok_s=1.5,
        solo_tok_s=3.0, weight=2.0, share_pct=50.0, busy_pct=10.0, uptime_s=3.0, slot=0, gpu_key="k", log="/l.log",
        signal_lateness=SignalLateness(n=3, p50_us=1, p99_us=2, max_us=3), klass="interactive",
    )  # fmt: skip
    doc = full.to_json()
    assert list(doc) == [{"klass": "class"}.get(k, k) for k in StatusReply.__dataclass_fields__]
    assert doc["class"] == "interactive" and StatusReply.from_json({"klass": "batch"}).klass is None
    assert doc["signal_lateness"] == {"n": 3, "p50_us": 1, "p99_us": 2, "max_us": 3}
    assert StatusReply.from_json(json.loads(json.dumps({"ok": True, **doc}))) == full


def test_status_reply_solo_tok_s() -> None:
    """An engine's best rate alone parses as a float; an old engine without the field still parses (None)."""
    assert StatusReply.from_json({"ok": True, "tok_s": 10, "solo_tok_s": 40.5}).solo_tok_s == 40.5
    old = {"ok": True, "state": "running", "tok_s": 12.0, "kind": "synth"}  # a reply from before solo_tok_s
    assert StatusReply.from_json(old) == StatusReply(state="running", tok_s=12.0, kind="synth")
    assert StatusReply.from_json({"solo_tok_s": "fast"}).solo_tok_s is None
    assert StatusReply.from_json({"solo_tok_s": math.inf}).solo_tok_s is None


def test_status_reply_from_json_is_tolerant() -> None:
    hostile = {
        "engine_pid": "12", "port": 80.5, "tok_s": "fast", "weight": True, "share_pct": 10**400,
        "uptime_s": math.nan, "busy_pct": 3, "state": 7, "model": "\x1b[31mred", "slot": -1,
        "signal_lateness": {"n": "x", "p50_us": 5}, "unknown": {"a": 1},
    }  # fmt: skip
    assert StatusReply.from_json(hostile) == StatusReply(
        busy_pct=3.0, model="\x1b[31mred", slot=-1, signal_lateness=SignalLateness(p50_us=5)
    )  # strings stay strings (the dashboard sanitises them), an int counts as a float
    assert StatusReply.from_json({"signal_lateness": [1]}).signal_lateness is None
    for junk in (None, [], "status", 3):
        assert StatusReply.from_json(junk) == StatusReply()


@pytest.mark.slow
def test_set_weight(engine, gpu_key: str) -> None:
    with Segment.attach_readonly(shm_file(gpu_key)) as seg:
        assert seg.read_slot(0).weight == 1.5
        assert control.request(engine.pid, "set_weight", weight=3.25) == {"ok": True, "weight": 3.25}
        assert seg.read_slot(0).weight == 3.25  # written at once
        r = control.request(engine.pid, "set_weight", weight=0.1)
        assert r["weight"] == pytest.approx(0.1) and r["weight"] != 0.1  # the f32 that was stored
        assert seg.read_slot(0).weight == r["weight"]
        for bad in (math.nan, math.inf, 0, -1, "abc", None, 1e39):
            with pytest.raises(ControlError, match=f"engine {engine.pid}: invalid weight"):
                control.request(engine.pid, "set_weight", weight=bad)
            assert seg.read_slot(0).weight == r["weight"]
        with pytest.raises(ControlError, match="invalid weight"):
            control.request(engine.pid, "set_weight")  # missing
        assert control.request(engine.pid, "status")["weight"] == r["weight"]


@pytest.mark.slow
def test_set_class(engine, gpu_key: str, cli) -> None:
    """`set_class` (and `gpushare-tui class PID CLASS`) publishes INTERACTIVE at once (spec §7); `status`
    says `class`; a bad class is one line, exit 2, and changes nothing."""
    with Segment.attach_readonly(shm_file(gpu_key)) as seg:
        assert control.request(engine.pid, "status")["class"] == "batch"
        assert not seg.read_slot(0).flags & abi.FLAG_INTERACTIVE  # EXT1 is set (every engine of ours), not INTERACTIVE
        r = cli("class", str(engine.pid), "interactive")
        assert r.returncode == 0 and r.stdout.strip() == f"engine {engine.pid}: class interactive"
        assert seg.read_slot(0).flags & abi.FLAG_INTERACTIVE
        assert control.request(engine.pid, "status")["class"] == "interactive"
        bad = cli("class", str(engine.pid), "urgent")
        assert bad.returncode == 2 and bad.stderr.strip().endswith(
            "invalid class 'urgent': must be one of interactive, batch"
        )
        assert seg.read_slot(0).flags & abi.FLAG_INTERACTIVE
        with pytest.raises(ControlError, match="invalid class"):
            control.request(engine.pid, "set_class")
        assert control.request(engine.pid, "set_class", **{"class": "batch"})["class"] == "batch"
        assert not seg.read_slot(0).flags & abi.FLAG_INTERACTIVE


@pytest.mark.slow
def test_synth_class_option(procs, gpu_key: str, runtime_dir: str) -> None:
    p = procs.start(
        cli_argv("synth", "--weight", "1", "--gpu-key", gpu_key, "--step-ms", "1", "-q", "--class", "interactive")
    )
    wait_for(lambda: control.is_managed(p.pid), 15, what="the control socket")
    assert control.request(p.pid, "status")["class"] == "interactive"
    with Segment.attach_readonly(shm_file(gpu_key)) as seg:
        assert seg.read_slot(0).flags & abi.FLAG_INTERACTIVE


@pytest.mark.slow
def test_bad_requests(engine) -> None:
    path = control.socket_path(engine.pid)
    assert _raw(path, b"not json\n") == {"ok": False, "error": "bad request: expected one JSON object with a 'cmd'"}
    assert _raw(path, b'{"nocmd": 1}\n')["ok"] is False
    assert _raw(path, b"[1, 2]\n")["ok"] is False
    r = _raw(path, b'{"cmd": "reboot"}\n')
    assert r == {"ok": False, "error": "unknown command 'reboot'"}
    with pytest.raises(ControlError, match="unknown command"):
        control.request(engine.pid, "reboot")
    assert control.request(engine.pid, "status")["ok"]  # still serving


@pytest.mark.slow
def test_stop(engine, gpu_key: str, runtime_dir: str) -> None:
    with Segment.attach_readonly(shm_file(gpu_key)) as seg:
        assert seg.read_slot(0).pid == engine.pid
        assert control.request(engine.pid, "stop") == {"ok": True, "state": "exiting"}
        assert engine.wait(timeout=15) == 0
        r = seg.read_slot(0)
        assert (r.pid, r.active, r.heartbeat_us) == (0, 0, 0)  # it left its slot
    assert not os.path.exists(os.path.join(runtime_dir, "gpushare-tui", f"{engine.pid}.sock"))
    with pytest.raises(ControlError, match="no process|not managed"):
        control.request(engine.pid, "status")


def test_unknown_pid(runtime_dir: str) -> None:
    with open("/proc/sys/kernel/pid_max") as f:
        pid = int(f.read()) + 1  # no such process can exist
    with pytest.raises(ControlError, match=f"^no process {pid}$"):
        control.request(pid, "status")
    assert not control.is_managed(pid)


def test_unmanaged_pid(runtime_dir: str, gpu_key: str) -> None:
    """A process with no slot anywhere is no engine; one with a slot but no socket is a foreign peer."""
    pid = os.getpid()
    with pytest.raises(ControlError, match=f"^process {pid} is not a gpushare-tui engine "):
        control.request(pid, "status")
    foreign = Membership(gpu_key, 1.0, "foreign", pid=pid, log=lambda _m: None)
    foreign.join()
    try:
        with pytest.raises(ControlError, match=f"engine {pid} is not managed by gpushare-tui .a foreign peer"):
            control.request(pid, "status")
    finally:
        foreign.leave()


def test_stale_socket(runtime_dir: str) -> None:
    pid = os.getpid()
    path = control.socket_path(pid)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)  # bound, never listening: a supervisor that died
    s.close()
    try:
        with pytest.raises(ControlError, match="stale socket"):
            control.request(pid, "status")
    finally:
        os.unlink(path)


def test_server_in_process_replaces_stale_socket_and_cleans_up(runtime_dir: str) -> None:
    pid = os.getpid()
    path = control.socket_path(pid)
    open(path, "w").close()  # stale leftover of the same pid

    def refuse(_req: dict) -> dict:
        raise ValueError("foo is not allowed")

    server = ControlServer(pid, {"status": lambda req: {"echo": req.get("x")}, "refuse": refuse})
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert control.request(pid, "status", x=[1, "a"]) == {"ok": True, "echo": [1, "a"]}
        with pytest.raises(ControlError, match=f"^engine {pid}: foo is not allowed$"):
            control.request(pid, "refuse")
    finally:
        server.close()
    assert not os.path.exists(path)


def test_a_client_that_finds_the_socket_is_never_refused(runtime_dir: str, monkeypatch) -> None:
    """The socket's name appears only once it listens: a client that connects the moment it sees the name
    (`status` right after a start) is served, not refused. The set-up is slowed between bind and listen,
    where the old order (bind to the name, then listen) refused such a client."""
    import threading
    import time

    real_chmod = os.chmod
    monkeypatch.setattr(control.os, "chmod", lambda *a, **k: (time.sleep(0.3), real_chmod(*a, **k))[1])
    pid = os.getpid()
    path = control.socket_path(pid)
    made: list[ControlServer] = []
    starter = threading.Thread(target=lambda: made.append(ControlServer(pid, {"status": lambda _r: {"up": 1}})))
    starter.start()
    try:
        wait_for(lambda: os.path.exists(path), 10, interval=0.001, what="the socket's name")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)  # ConnectionRefusedError when the name came before listen()
        starter.join(10)
        assert control.request(pid, "status") == {"ok": True, "up": 1}
        assert [n for n in os.listdir(os.path.dirname(path)) if n.endswith(".part")] == []
    finally:
        starter.join(10)
        for server in made:
            server.close()


def test_runtime_dir_must_be_private(runtime_dir: str) -> None:
    d = os.path.join(runtime_dir, "gpushare-tui")
    os.makedirs(d, exist_ok=True)
    os.chmod(d, 0o755)
    try:
        with pytest.raises(ControlError, match="not private"):
            paths.runtime_dir()
    finally:
        os.chmod(d, 0o700)


@pytest.mark.slow
def test_status_command_leaves_out_unknown_fields(engine, cli) -> None:
    """A synth engine has no port, model or log: `status` does not print `port: None`."""
    r = cli("status", str(engine.pid))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "None" not in r.stdout and not any(line.split(":")[0].strip() in ("port", "log") for line in lines)
    assert any(line.split(":")[0].strip() == "name" and line.endswith(": ctl") for line in lines)


# -- one control surface: the engine kinds, the handler builder, up's owner hooks ------------------

IDLE_ENGINE = os.path.join(os.path.dirname(__file__), "data", "idle_engine.py")


def test_every_engine_kind_is_a_managed_engine(gpu_key: str, tmp_path) -> None:
    from gpushare_tui.core.engines import llama_server as ls
    from gpushare_tui.core.engines.supervisor import Supervisor
    from gpushare_tui.core.engines.synthetic import SynthStats, _SynthShare
    from gpushare_tui.core.pacing.share import GpuShare

    args = ls.EngineArgs(("llama-server",), ls.HOST_DEFAULT, 8080, None, False)
    engines = [
        GpuShare(gpu_key=gpu_key, control=False),
        _SynthShare(SynthStats(), None, gpu_key, 1.0, "synth", None),
        Supervisor(args, gpu_key=gpu_key, weight=1.0, name="llama", log_path=str(tmp_path / "e.log")),
    ]
    for engine in engines:
        assert isinstance(engine, control.ManagedEngine), type(engine)
        assert isinstance(engine.status(), StatusReply)  # before it runs too: nothing joined, nothing raised
    assert [e.status().kind for e in engines] == ["python", "synth", "llama-server"]


def _check_owned(pid: int, owner: Owner, owner_r: int, kind: str, stop_state: str) -> None:
    """What an engine `up` owns answers on its socket: the owner's fields in `status`, `config_weight`
    moved by the owner's set_weight ("config": true) only, and a stop said on the owner's pipe first."""
    st = control.request(pid, "status")
    assert list(st) == ["ok", *StatusReply().to_json()]  # the reply's bytes keep their order
    assert (st["kind"], st["name"], st["weight"], st["state"]) == (kind, "owned", 2.0, "running")
    owned = (st["owner"], st["owner_pid"], st["config"], st["config_weight"], st["restarts"])
    assert owned == ("up", owner.pid, owner.config, 2.0, owner.restarts)
    assert control.request(pid, "set_weight", weight=5) == {"ok": True, "weight": 5.0}
    st = control.request(pid, "status")
    assert (st["weight"], st["config_weight"]) == (5.0, 2.0)  # a live edit is not the file's
    control.request(pid, "set_weight", weight=4, config=True)
    st = control.request(pid, "status")
    assert (st["weight"], st["config_weight"]) == (4.0, 4.0)  # a reload is
    with pytest.raises(ControlError, match="invalid weight"):
        control.request(pid, "set_weight", weight="nan", config=True)
    assert control.request(pid, "status")["config_weight"] == 4.0
    assert control.request(pid, "stop") == {"ok": True, "state": stop_state}
    assert os.read(owner_r, 64) == ownership.STOP_EVENT  # written before the stop was carried out


def test_owner_hooks_apply_to_a_python_engine_through_the_one_builder(gpu_key: str, runtime_dir: str) -> None:
    from gpushare_tui.core.pacing.share import GpuShare

    r, w = os.pipe()
    owner = Owner("/x/up.toml", 4242, 2.0, 1, w)
    try:
        with GpuShare(weight=2, name="owned", gpu_key=gpu_key, control=False) as share:
            server = ControlServer(os.getpid(), control.control_handlers(share, owner))
            try:
                _check_owned(os.getpid(), owner, r, "python", "exiting")
                assert share.stop_requested.is_set() and share.state == "exiting"
            finally:
                server.close()
        with GpuShare(weight=2, name="free", gpu_key=gpu_key):  # its own socket, no owner
            st = control.request(os.getpid(), "status")
            assert st["owner"] is None and st["config_weight"] is None and st["kind"] == "python"
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("kind", ["synth", "llama-server"])
def test_owner_hooks_apply_to_a_real_engine_process(kind: str, procs, gpu_key: str, runtime_dir: str, tmp_path) -> None:
    """`synth` and `run` (its supervisor, the engine a stand-in) started as `up` starts them."""
    r, w = os.pipe()
    owner = Owner(str(tmp_path / "up.toml"), os.getpid(), 2.0, 3, w)
    env = {**os.environ, ownership.ENV: owner.to_env(), "XDG_STATE_HOME": str(tmp_path)}
    common = ("--weight", "2", "--name", "owned", "--gpu-key", gpu_key)
    if kind == "synth":
        argv = cli_argv("synth", *common, "--step-ms", "1", "-q")
    else:
        argv = cli_argv("run", *common, "--activity", "llama", "--", sys.executable, IDLE_ENGINE)
    with open(tmp_path / "stderr", "w") as err:
        p = procs.start(argv, env=env, pass_fds=(w,), stdout=subprocess.DEVNULL, stderr=err)
    os.close(w)
    sockets = os.path.join(runtime_dir, "gpushare-tui")

    def socket_pid() -> int | None:
        assert p.poll() is None, (tmp_path / "stderr").read_text()
        names = os.listdir(sockets) if os.path.isdir(sockets) else []
        return next((int(n[:-5]) for n in names if n.endswith(".sock")), None)

    try:
        pid = wait_for(socket_pid, 60, what="the engine's control socket")
        _check_owned(pid, owner, r, kind, {"synth": "exiting", "llama-server": "stopping"}[kind])
        code = p.wait(timeout=30)
        assert code == 0 if kind == "synth" else code == 128 + signal.SIGTERM  # the stand-in dies of its SIGTERM
        assert not os.path.exists(os.path.join(sockets, f"{pid}.sock"))
    finally:
        os.close(r)
