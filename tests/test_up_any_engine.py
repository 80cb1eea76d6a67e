"""Acceptance (issue 19): `up` runs one engine of each kind — a llama-server (when one is provisioned),
the HTTP stand-in as a plain command paced by its /metrics gauge, the multi-process stand-in by its
tree's CPU, and an `always` job — each joined, shown with its kind and activity source, and all
ended (none left stopped) on SIGTERM. Needs `run`'s issue-19 options (the runtime branch): skipped
with that reason until they are there."""

from __future__ import annotations

import json
import signal
import subprocess

import psutil
import pytest
from llama_env import find_llama_server
from up_env import UpProc, used_slots, write

from gpushare_tui.core.engines.llama_server import free_port
from testkit.cli import cli_argv, run_cli
from testkit.engines import engine_command
from testkit.engines.http_engine import DEFAULT_GAUGE, HttpLoad
from testkit.procs import Procs
from testkit.wait import wait_for

pytestmark = pytest.mark.slow


def _run_has_issue_19_options() -> bool:
    out = subprocess.run(cli_argv("run", "--help"), capture_output=True, text=True, timeout=60)
    return all(opt in out.stdout for opt in ("--activity", "--metrics-url", "--gauge", "--health-url", "--no-health"))


def _toml_list(argv: list[str]) -> str:
    return "[" + ", ".join(json.dumps(a) for a in argv) + "]"


def test_up_runs_one_engine_of_each_kind(
    procs: Procs, gpu_key, runtime_dir, tmp_path, monkeypatch, tiny_model_path
) -> None:
    if not _run_has_issue_19_options():
        pytest.skip(
            "`gpushare-tui run` has no --activity/--metrics-url/--gauge/--health-url/--no-health yet (issue 19 runtime)"
        )
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    http_port = free_port()
    http = engine_command("http_engine", "--port", str(http_port), "--load-s", "1")
    base = f"http://127.0.0.1:{http_port}"
    engines = [
        f'''[[engine]]
name = "http"
weight = 2
command = {_toml_list(http)}
activity = {{ source = "metrics", metrics_url = "{base}/metrics", gauge = "{DEFAULT_GAUGE}" }}
health = {{ url = "{base}/health" }}
''',
        f"""[[engine]]
name = "tree"
command = {_toml_list(engine_command("multiproc_engine", "--workers", "2"))}
activity = "cpu"
health = "none"
""",
        f"""[[engine]]
name = "job"
command = {_toml_list(engine_command("multiproc_engine", "--workers", "1"))}
activity = "always"
health = "none"
""",
    ]
    expected = {"http": ("command", "metrics"), "tree": ("command", "cpu"), "job": ("command", "always")}
    llama, _why = find_llama_server()
    if llama is not None and tiny_model_path is not None:
        llama_argv = [llama, "-m", tiny_model_path, "-t", "1", "-c", "512"]
        engines.append(f'[[engine]]\nname = "llama"\ncommand = {_toml_list(llama_argv)}\n')
        expected["llama"] = ("llama-server", "llama")
    path = write(tmp_path / "gpushare.toml", f'gpu_key = "{gpu_key}"\n\n' + "\n".join(engines))
    assert run_cli("up", "--check", path).returncode == 0
    up = UpProc(procs, path, gpu_key)
    try:
        pids = {name: up.slot(name, timeout=120)[0] for name in expected}
        report = json.loads(run_cli("--once", "--json", "--gpu-key", gpu_key).stdout)
        peers = {p["name"]: p for g in report["gpus"] for p in g["peers"]}
        assert {n: (peers[n]["engine"]["kind"], peers[n]["engine"]["activity"]) for n in expected} == expected
        # the HTTP engine's gauge raises its slot's `active` while it has work
        load = HttpLoad(http_port, units=50).start()
        try:
            wait_for(lambda: peers_active(gpu_key).get("http"), 30, what="http active under load")
        finally:
            load.stop()
        up.proc.send_signal(signal.SIGTERM)
        assert up.proc.wait(60) == 0, up.text()
        tree = set(pids.values()) | up.seen_pids
        wait_for(lambda: not any(_alive(p) for p in tree), 20, what="every engine process gone")
        assert used_slots(gpu_key) == []
    finally:
        up.end()


def peers_active(key: str) -> dict[str, bool]:
    report = json.loads(run_cli("--once", "--json", "--gpu-key", key).stdout)
    return {p["name"]: p["active"] for g in report["gpus"] for p in g["peers"]}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def tiny_model_path(tmp_path_factory) -> str | None:
    """A tiny model when a llama-server is provisioned (the llama engine is optional here)."""
    if find_llama_server()[0] is None:
        return None
    from testkit.tiny_gguf import write_tiny_llama

    return write_tiny_llama(str(tmp_path_factory.mktemp("models") / "tiny.gguf"), 256, 4)
