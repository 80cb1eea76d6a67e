"""Engines by name: `status chat`, `weight chat 3`, `logs chat`, `stop chat` in real CLI processes against
real synthetic engines (core/pacing/control.resolve_engine, one resolver for every command)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from gpushare_tui.core.pacing.control import socket_path
from gpushare_tui.core.registry.segment import Segment, shm_path
from testkit.cli import cli_argv, run_cli
from testkit.wait import wait_for

pytestmark = pytest.mark.slow


def start_synth(procs, key: str, name: str, log_path: str):
    """A synthetic engine named `name` writing to `log_path`, once its control socket is there."""
    argv = cli_argv("synth", "--weight", "1", "--name", name, "--gpu-key", key, "--step-ms", "2", "-q")
    with open(log_path, "ab") as out:
        p = procs.start(argv, stdout=out, stderr=out)
    wait_for(lambda: p.poll() is not None or os.path.exists(socket_path(p.pid)), 20, what=f"{name}'s control socket")
    assert p.poll() is None, f"synth {name} exited"
    return p


def weight_of(key: str, pid: int) -> float:
    with Segment.attach_readonly(shm_path(key)) as seg:
        return next(r.weight for r in seg.read_slots() if r.pid == pid)


def test_commands_take_a_unique_name_or_a_pid(procs, gpu_key: str, runtime_dir: str, tmp_path) -> None:
    chat = start_synth(procs, gpu_key, "chat", str(tmp_path / "chat.log"))
    batch = start_synth(procs, gpu_key, "batch", str(tmp_path / "batch.log"))
    wait_for(lambda: "joined" in (tmp_path / "chat.log").read_text(), 10, what="chat's join line")

    r = run_cli("status", "chat", "--json")
    assert r.returncode == 0, r.stderr
    assert (json.loads(r.stdout)["engine_pid"], json.loads(r.stdout)["name"]) == (chat.pid, "chat")
    r = run_cli("status", str(batch.pid), "--json")  # all digits: a pid, as before
    assert r.returncode == 0 and json.loads(r.stdout)["name"] == "batch", r.stderr

    r = run_cli("weight", "chat", "3")
    assert (r.returncode, r.stdout, r.stderr) == (0, f"engine {chat.pid}: weight 3\n", "")
    assert weight_of(gpu_key, chat.pid) == 3.0 and weight_of(gpu_key, batch.pid) == 1.0

    r = run_cli("logs", "chat", "-n", "1")
    assert r.returncode == 0 and "joined" in r.stdout and r.stdout.count("\n") == 1, r

    r = run_cli("status", "nope")  # unknown: exit 1, one line listing what there is
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == f"gpushare-tui: no managed engine named 'nope' (managed: chat={chat.pid}, batch={batch.pid})\n"

    stopper = subprocess.Popen(cli_argv("stop", "batch"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert batch.wait(15) == 0  # reaped here (our child), so `stop`'s wait sees it gone
    out, err = stopper.communicate(timeout=30)
    assert (stopper.returncode, out) == (0, f"engine {batch.pid}: stopped\n"), err
    r = run_cli("weight", "batch", "2")  # gone: no longer a name
    assert r.returncode == 1
    assert r.stderr == f"gpushare-tui: no managed engine named 'batch' (managed: chat={chat.pid})\n"


def test_a_name_two_engines_have_exits_2_listing_both(procs, gpu_key: str, runtime_dir: str, tmp_path) -> None:
    a = start_synth(procs, gpu_key, "twin", str(tmp_path / "a.log"))
    b = start_synth(procs, gpu_key, "twin", str(tmp_path / "b.log"))
    for argv in (["status", "twin"], ["weight", "twin", "2"], ["stop", "twin"], ["logs", "twin"]):
        r = run_cli(*argv)
        lo, hi = sorted((a.pid, b.pid))
        assert r.returncode == 2 and r.stdout == "", (argv, r)
        assert r.stderr == (
            f"gpushare-tui: 2 managed engines are named 'twin' (twin={lo}, twin={hi}): give the pid instead\n"
        ), argv
    assert a.poll() is None and b.poll() is None  # nothing was done to either
    assert weight_of(gpu_key, a.pid) == weight_of(gpu_key, b.pid) == 1.0
    r = run_cli("weight", str(a.pid), "4")  # the pid still says which
    assert r.returncode == 0 and weight_of(gpu_key, a.pid) == 4.0, r.stderr


def test_no_managed_engine_at_all(runtime_dir: str) -> None:
    r = run_cli("status", "chat")
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == "gpushare-tui: no managed engine named 'chat' (managed: none is running)\n"


def test_a_name_picks_one_of_a_pids_several_engines(new_gpu_key, runtime_dir: str) -> None:
    """Two engines served by one pid (two GpuShare in this process): the name picks the socket, so neither
    --slot nor --gpu-key is needed; the pid alone still asks for them."""
    from gpushare_tui import GpuShare

    key_a, key_b = new_gpu_key("a"), new_gpu_key("b")
    a = GpuShare(weight=1, name="left", gpu_key=key_a).open()
    try:
        b = GpuShare(weight=2, name="right", gpu_key=key_b).open()
        try:
            r = run_cli("status", "right", "--json")
            assert r.returncode == 0, r.stderr
            assert (json.loads(r.stdout)["name"], json.loads(r.stdout)["gpu_key"]) == ("right", key_b)
            r = run_cli("weight", "right", "5")
            assert r.returncode == 0, r.stderr
            assert (a.weight, b.weight) == (1.0, 5.0)
            r = run_cli("status", str(os.getpid()))
            assert r.returncode == 1 and "name one with --slot" in r.stderr
            r = run_cli("status", "left", "--slot", str(b.slot), "--gpu-key", key_b)  # the options narrow a name
            assert r.returncode == 1 and "no managed engine named 'left'" in r.stderr
        finally:
            b.close()
    finally:
        a.close()


def test_a_name_with_format_characters_is_addressed_as_given_or_as_shown(new_gpu_key, runtime_dir: str) -> None:
    """An engine named with U+202E (a GpuShare's name is not ours to refuse) is reached by its exact name and by
    the form the views show: escaped (as the name lists of an error line show it) or, when that is unique, with
    U+FFFD (as the tables and `status` show it). Two names that both show as `ab\ufffdcd` ask for more."""
    from gpushare_tui import GpuShare

    rlo, lro = "ab\u202ecd", "ab\u202dcd"
    a = GpuShare(weight=1, name=rlo, gpu_key=new_gpu_key("a")).open()
    try:
        r = run_cli("status", rlo, "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["name"] == rlo, r.stderr
        r = run_cli("weight", "ab\\u202ecd", "3")  # as escaped: what `no managed engine named` lists
        assert (r.returncode, r.stderr) == (0, ""), r.stderr
        assert a.weight == 3.0
        r = run_cli("status", "ab\ufffdcd", "--json")  # as the table shows it: the only one that shows so
        assert r.returncode == 0 and json.loads(r.stdout)["name"] == rlo, r.stderr
        b = GpuShare(weight=1, name=lro, gpu_key=new_gpu_key("b")).open()
        try:
            r = run_cli("weight", "ab\ufffdcd", "2")
            assert r.returncode == 2 and r.stderr.count("\n") == 1, r
            assert "ab\\u202ecd=" in r.stderr and "ab\\u202dcd=" in r.stderr, r.stderr
            r = run_cli("weight", "ab\\u202dcd", "2")  # its escaped form still says which
            assert r.returncode == 0 and (a.weight, b.weight) == (3.0, 2.0), r.stderr
            r = run_cli("status", "nope")
            assert r.returncode == 1 and "ab\\u202ecd=" in r.stderr and "\u202e" not in r.stderr, r.stderr
        finally:
            b.close()
    finally:
        a.close()


@pytest.mark.llama
def test_a_real_llama_server_by_name(procs, gpu_key, llama_server, tiny_model, runtime_dir) -> None:
    """`run --name chat` of a real llama-server: `status chat` renders the signal lateness as text (not
    a Python dict), `weight chat 2`, `logs chat`, `stop chat` all reach it by name."""
    from llama_env import Engines

    engines = Engines(procs, gpu_key, llama_server, tiny_model)
    try:
        sup, pid, line = engines.run(1.0, name="chat")
        assert line.strip().endswith("(weight 1, 1 peer alive)"), line
        r = run_cli("status", "chat")
        assert r.returncode == 0, r.stderr
        (lateness,) = [ln for ln in r.stdout.splitlines() if ln.split(":")[0].strip() == "signal_lateness"]
        value = lateness.split(": ", 1)[1]
        assert "{" not in value and "_us" not in value, lateness
        assert value.endswith(")") and "(n=" in value, lateness  # "p50 0.3 ms, p99 1.2 ms, max 4 ms (n=12)"
        assert run_cli("weight", "chat", "2").stdout == f"engine {pid}: weight 2\n"
        assert weight_of(gpu_key, pid) == 2.0
        r = run_cli("logs", "chat", "-n", "3")
        assert r.returncode == 0 and r.stdout.count("\n") == 3, r
        stopper = subprocess.Popen(cli_argv("stop", "chat"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = stopper.communicate(timeout=60)
        assert (stopper.returncode, out) == (0, f"engine {pid}: stopped\n"), err
        sup.wait(30)
    finally:
        engines.end()


def test_a_name_in_an_unusable_runtime_dir_says_why(runtime_dir: str) -> None:
    d = os.path.join(runtime_dir, "gpushare-tui")
    os.makedirs(d, exist_ok=True)
    os.chmod(d, 0o755)
    try:
        for engine in ("chat", "123"):  # a name and a pid: the same one line, not "no engine named"
            r = run_cli("status", engine)
            assert (r.returncode, r.stderr) == (1, f"gpushare-tui: runtime directory {d} is not private to this user\n")
    finally:
        os.chmod(d, 0o700)


def test_the_candidates_listed_are_bounded() -> None:
    from gpushare_tui.core.pacing.control import NAMED_SHOWN_MAX, EngineRef, ManagedEntry, StatusReply, _named

    entries = [ManagedEntry(EngineRef(100 + i), StatusReply(name=f"e{i}")) for i in range(NAMED_SHOWN_MAX + 5)]
    text = _named(entries)
    assert text.startswith("e0=100, e1=101") and text.endswith(
        f"e{NAMED_SHOWN_MAX - 1}={99 + NAMED_SHOWN_MAX} and 5 more"
    )
    assert _named([ManagedEntry(EngineRef(7), StatusReply(name="\x1b[31mred"))]) == "\\x1b[31mred=7"  # typed back as is
