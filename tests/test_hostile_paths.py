"""Files and directories another local user controls (issue 17, "paths"), played for real: a second
uid (`other_user`, 65534) owns XDG_RUNTIME_DIR / XDG_STATE_HOME and plants symbolic links in them;
a FIFO, /dev/zero and a 17-engine file as `up`'s config; a 2 GiB sparse log. Every blocking step
runs under a timeout, so a regression fails instead of hanging."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import threading
import time

import pytest
from up_env import UpProc, write

from gpushare_tui.core.engines.spawn import spawn
from gpushare_tui.core.host import budgets, paths
from gpushare_tui.core.host.errors import ControlError
from gpushare_tui.core.pacing import control
from gpushare_tui.up import config
from testkit.cli import run_cli
from testkit.other_user import OTHER_UID
from testkit.wait import wait_for

ATTACKER_DIR = """
import os, sys, tempfile
d = tempfile.mkdtemp(prefix="gst-atk-", dir="/tmp")
os.chmod(d, 0o755)
print(d)
"""


@pytest.fixture
def attacker_dir(other_user):
    """A directory of /tmp owned by the other uid (mode 0755: we can traverse it), removed after."""
    made: list[str] = []

    def make() -> str:
        d = other_user(ATTACKER_DIR).stdout.strip()
        assert os.stat(d).st_uid == OTHER_UID
        made.append(d)
        return d

    yield make
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def private_home(tmp_path, monkeypatch: pytest.MonkeyPatch) -> str:
    """HOME: a private directory of ours (the state directory's fallback lands there)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    return str(home)


@pytest.fixture
def victim(tmp_path) -> str:
    """A root-only directory holding a file the attacker wants us to write or unlink."""
    d = tmp_path / "victim"
    d.mkdir(mode=0o700)
    f = d / "precious"
    f.write_text("keep me\n")
    return str(f)


# -- the check itself ------------------------------------------------------------------------------


def test_a_trusted_path_is_walked_component_by_component(tmp_path) -> None:
    ok = tmp_path / "ok"
    ok.mkdir(mode=0o700)
    with paths.trusted_dir(str(ok)) as fd:
        assert stat.S_ISDIR(os.fstat(fd).st_mode)
    (tmp_path / "link").symlink_to(ok)
    with pytest.raises(paths.UntrustedPathError, match="link is a symbolic link"):
        paths.open_trusted_dir(str(tmp_path / "link"))
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)  # world-writable, not sticky
    (loose / "sub").mkdir(mode=0o700)
    with pytest.raises(paths.UntrustedPathError, match="loose is group/world-writable"):
        paths.open_trusted_dir(str(loose / "sub"))
    os.chmod(loose, 0o1777)  # sticky, as /tmp: allowed above the last component, not as it
    os.close(paths.open_trusted_dir(str(loose / "sub")))
    with pytest.raises(paths.UntrustedPathError, match="group/world-writable"):
        paths.open_trusted_dir(str(loose))


def test_another_users_directory_is_refused(attacker_dir) -> None:
    d = attacker_dir()
    with pytest.raises(paths.UntrustedPathError, match=f"owned by uid {OTHER_UID}"):
        paths.open_trusted_dir(d)


# -- the runtime directory (control sockets, up's lock) ----------------------------------------------


def _symlinked(attacker_dir, tmp_path) -> str:
    target = tmp_path / "root-only"
    target.mkdir(mode=0o700)
    d = attacker_dir()
    link = os.path.join(d, "run")
    os.symlink(str(target), link)  # (as root, in the attacker's directory: the attacker could replace it)
    return link


def _world_writable(_attacker_dir, tmp_path) -> str:
    d = tmp_path / "ww"
    d.mkdir()
    os.chmod(d, 0o777)
    return str(d)


@pytest.mark.parametrize(
    "make",
    [lambda a, _t: a(), _symlinked, _world_writable],
    ids=["owned-by-another-user", "symlinked", "world-writable-not-sticky"],
)
def test_an_untrusted_runtime_dir_is_fallen_back_from(make, attacker_dir, tmp_path, monkeypatch, capfd) -> None:
    """As after `sudo -E`: root must not create its sockets where another user can swap them."""
    bad = make(attacker_dir, tmp_path)
    monkeypatch.setenv("XDG_RUNTIME_DIR", bad)
    paths._said.clear()
    used = paths.runtime_dir()
    assert not used.startswith(bad) and used == f"/tmp/gpushare-tui-{os.geteuid()}"
    assert paths.runtime_dir_path() == used  # clients find the sockets there too
    assert control.socket_path(4242).startswith(used + "/")
    (line,) = [ln for ln in capfd.readouterr().err.splitlines() if ln]
    assert line.startswith("gpushare-tui: not using XDG_RUNTIME_DIR") and used in line, line
    assert not os.path.exists(os.path.join(bad, "gpushare-tui"))  # nothing made in it


def test_root_never_unlinks_through_a_swapped_runtime_dir(attacker_dir, victim, monkeypatch, other_user) -> None:
    """The attacker owns XDG_RUNTIME_DIR; once our socket is there, it renames our directory away and
    puts a link to a root-only directory in its place, hoping our close() unlinks a file there."""
    d = attacker_dir()
    os.chmod(d, 0o777)  # (so that the old code, which made its directory in it, could be played)
    monkeypatch.setenv("XDG_RUNTIME_DIR", d)
    name = f"{os.getpid()}.sock"
    os.rename(victim, os.path.join(os.path.dirname(victim), name))
    victim = os.path.join(os.path.dirname(victim), name)
    server = control.ControlServer(os.getpid(), {"status": lambda _r: {}})
    try:
        swap = (
            "import os, sys; d = sys.argv[1]; os.rename(d + '/gpushare-tui', d + '/old'); "
            "os.symlink(sys.argv[2], d + '/gpushare-tui')"
        )
        if os.path.isdir(os.path.join(d, "gpushare-tui")):  # the old code: our directory inside theirs
            other_user(swap, d, os.path.dirname(victim))
    finally:
        server.close()
    assert os.path.exists(victim), "root unlinked a file through the attacker's link"
    assert not server.path.startswith(d)


def test_up_lock_is_opened_in_the_trusted_dir(runtime_dir, tmp_path) -> None:
    from gpushare_tui.up.lock import UpLock, lock_path

    cfg = str(tmp_path / "up.toml")
    lock = lock_path(cfg)
    os.symlink(str(tmp_path / "elsewhere"), lock)  # a link where the lock goes (by us: the dir is ours)
    with pytest.raises(OSError):
        UpLock(cfg)
    assert not os.path.exists(tmp_path / "elsewhere")
    os.unlink(lock)
    held = UpLock(cfg)
    held.release()


# -- the state directory (logs) ------------------------------------------------------------------------


def test_root_never_writes_a_log_through_the_attackers_state_dir(
    attacker_dir, victim, private_home, monkeypatch, other_user, capfd
) -> None:
    """XDG_STATE_HOME owned by the attacker, its gpushare-tui/ theirs too with a link where `up`'s log goes."""
    d = attacker_dir()
    plant = (
        "import os, sys; g = sys.argv[1] + '/gpushare-tui'; os.mkdir(g); os.chmod(g, 0o777); "
        "os.symlink(sys.argv[2], g + '/up-chat.log')"
    )
    other_user(plant, d, victim)
    monkeypatch.setenv("XDG_STATE_HOME", d)
    paths._said.clear()
    logs = paths.state_dir()
    assert logs == os.path.join(private_home, ".local", "state", "gpushare-tui")
    assert "not using XDG_STATE_HOME" in capfd.readouterr().err
    p = spawn(["sh", "-c", "echo written"], os.path.join(logs, "up-chat.log"))
    assert p.wait(10) == 0
    assert open(victim).read() == "keep me\n"
    assert open(os.path.join(logs, "up-chat.log")).read() == "written\n"
    # and a log path in the attacker's directory itself is refused, never opened
    with pytest.raises(paths.UntrustedPathError, match=f"owned by uid {OTHER_UID}"):
        paths.open_log(os.path.join(d, "gpushare-tui", "up-chat.log"))
    assert open(victim).read() == "keep me\n"


def test_a_log_is_never_opened_through_a_link(tmp_path, victim) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    os.symlink(victim, logs / "x.log")
    with pytest.raises(paths.UntrustedPathError, match="symbolic link"):
        paths.open_log(str(logs / "x.log"))
    os.link(victim, logs / "y.log")  # a second name of a file: not a log of ours to append to
    with pytest.raises(paths.UntrustedPathError, match="one link"):
        paths.open_log(str(logs / "y.log"))
    assert open(victim).read() == "keep me\n"


@pytest.mark.slow
def test_run_never_writes_a_log_through_the_attackers_state_dir(
    attacker_dir, runtime_dir, victim, private_home, tmp_path, other_user, gpu_key
) -> None:
    """`run` as root with another user's XDG_STATE_HOME (a link where its engine log goes)."""
    d = attacker_dir()
    plant = (
        "import os, sys; g = sys.argv[1] + '/gpushare-tui'; os.mkdir(g); os.chmod(g, 0o777); "
        "os.symlink(sys.argv[2], g + '/m-8080.log')"
    )
    other_user(plant, d, victim)
    (model := tmp_path / "m.gguf").write_bytes(b"GGUF")
    env = {**os.environ, "XDG_STATE_HOME": d}
    argv = ["run", "--gpu-key", gpu_key, "--activity", "llama", "--", "true", "-m", str(model), "--port", "8080"]
    r = run_cli(*argv, env=env, timeout=60)  # a llama-server stand-in: its log is named after its model
    assert "not using XDG_STATE_HOME" in r.stderr, r.stderr
    assert open(victim).read() == "keep me\n", r.stderr
    assert os.path.exists(os.path.join(private_home, ".local", "state", "gpushare-tui", "m-8080.log"))


# -- up's config file ---------------------------------------------------------------------------------

ONE_ENGINE = '[[engine]]\nname = "e{i}"\nweight = 1\nsynth = {{ step_ms = 5 }}\n'


def _check(path: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return run_cli("up", "--check", path, timeout=timeout)


def test_a_fifo_config_is_refused_at_once(tmp_path) -> None:
    fifo = str(tmp_path / "up.toml")
    os.mkfifo(fifo)
    got: list[BaseException | None] = []

    def load() -> None:
        try:
            config.load(fifo)
            got.append(None)
        except BaseException as e:
            got.append(e)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():  # the old code blocks in open(): give it a writer so the thread ends, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("config.load blocked on a FIFO")
    assert isinstance(got[0], config.ConfigError) and "not a regular file" in str(got[0]), got


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "too-large", "17-engines"])
def test_up_check_refuses_hostile_files(kind: str, tmp_path, gpu_key) -> None:
    path = str(tmp_path / "up.toml")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path = "/dev/zero"
    elif kind == "too-large":
        write(path, f'gpu_key = "{gpu_key}"\n' + "#" * budgets.CONFIG_MAX_BYTES + "\n" + ONE_ENGINE.format(i=0))
    else:
        write(path, f'gpu_key = "{gpu_key}"\n' + "\n".join(ONE_ENGINE.format(i=i) for i in range(17)))
    t0 = time.monotonic()
    r = _check(path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.strip()]
    expected = {
        "fifo": f"{path}: not a regular file",
        "dev-zero": "/dev/zero: not a regular file",
        "too-large": f"{path}: too large",
        "17-engines": f"{path}:{1 + 16 * 5 + 1}: engine 'e16': more than 16 engines on one GPU key",
    }[kind]
    assert expected in line, line
    assert time.monotonic() - t0 < 15


def test_sixteen_engines_on_one_key_pass_and_two_keys_hold_more(tmp_path, new_gpu_key) -> None:
    a, b = new_gpu_key("a"), new_gpu_key("b")
    text = "\n".join(ONE_ENGINE.format(i=i) for i in range(16))
    assert len(config.load(write(tmp_path / "16.toml", f'gpu_key = "{a}"\n' + text)).engines) == 16
    more = text + f'\n[[engine]]\nname = "x"\nweight = 1\ngpu_key = "{b}"\nsynth = {{}}\n'
    assert len(config.load(write(tmp_path / "17.toml", f'gpu_key = "{a}"\n' + more)).engines) == 17


@pytest.mark.slow
def test_a_fifo_swapped_in_under_a_running_up_fails_the_reload_only(procs, gpu_key, runtime_dir, tmp_path) -> None:
    path = write(tmp_path / "up.toml", f'gpu_key = "{gpu_key}"\n' + ONE_ENGINE.format(i=0))
    up = UpProc(procs, path, gpu_key, env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")})
    try:
        up.slot("e0")
        os.unlink(path)
        os.mkfifo(path)
        up.proc.send_signal(signal.SIGHUP)
        line = up.wait_line("reload failed", timeout=10)
        assert "not a regular file" in line, line
        assert up.proc.poll() is None
        up.proc.send_signal(signal.SIGTERM)
        assert up.proc.wait(30) == 0  # (the old code: stuck in open(), SIGTERM ignored)
        wait_for(lambda: "all engines stopped" in up.text(), 10, what="up's last line")
    finally:
        up.end()


# -- logs -n / -f on a 2 GiB hole ---------------------------------------------------------------------

HOLE_BYTES = 2 * 1024**3


def test_tail_of_a_sparse_log_is_bounded(tmp_path) -> None:
    from gpushare_tui.core.host.logtail import LogFollower, tail_lines

    log = tmp_path / "e.log"
    log.write_text("first\nsecond\n")
    os.truncate(log, log.stat().st_size + HOLE_BYTES)  # costs no disk
    t0 = time.monotonic()
    got = sum(len(s) for s in tail_lines(str(log), 5, budgets.LOG_TAIL_MAX_BYTES))
    assert got <= budgets.LOG_TAIL_MAX_BYTES
    with LogFollower(str(log), 5, max_read_bytes=budgets.LOG_FOLLOW_READ_MAX_BYTES) as f:
        assert sum(len(s) for s in f.first_lines()) <= budgets.LOG_FOLLOW_READ_MAX_BYTES
        assert sum(len(s) for s in f.poll().lines) <= budgets.LOG_FOLLOW_READ_MAX_BYTES
    assert time.monotonic() - t0 < 5


@pytest.mark.slow
@pytest.mark.parametrize("follow", [False, True], ids=["-n", "-f"])
def test_logs_of_a_sparse_log_print_at_most_the_budget(follow: bool, procs, gpu_key, runtime_dir, tmp_path) -> None:
    from test_cli_logs import start_synth

    from testkit.cli import cli_argv

    log = tmp_path / "engine.log"
    with open(log, "ab") as out:
        p = start_synth(procs, gpu_key, out)
    wait_for(lambda: "joined" in log.read_text(), 10, what="the engine's join line")
    os.truncate(log, log.stat().st_size + HOLE_BYTES)
    argv = cli_argv("logs", str(p.pid), "-n", "5", *(["-f"] if follow else []))
    q = procs.start(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    size = 0

    def count() -> None:  # counted, not stored: a regression prints gigabytes
        nonlocal size
        while (chunk := q.stdout.read(65536)) and size <= budgets.LOG_OUTPUT_MAX_BYTES:  # type: ignore[union-attr]
            size += len(chunk)
        q.kill()

    reader = threading.Thread(target=count, daemon=True)
    reader.start()
    reader.join(20 if not follow else 4)
    try:
        code = q.wait(0 if reader.is_alive() else 10)
    except subprocess.TimeoutExpired:
        code = None
    q.kill()
    reader.join(5)
    assert size <= budgets.LOG_OUTPUT_MAX_BYTES, size
    assert follow or code == 0, "logs -n 5 did not end within 20 s"


def test_unlink_in_skips_an_untrusted_directory(attacker_dir, victim) -> None:
    d = attacker_dir()
    paths.unlink_in(os.path.join(d, "x"))  # nothing, no error
    paths.unlink_in(victim + ".missing")
    with pytest.raises(ControlError):
        paths.open_log(os.path.join(d, "x.log"))
