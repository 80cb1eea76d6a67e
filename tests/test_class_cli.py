"""`--class` on the supervised commands (issue 20): `launch --class interactive` publishes INTERACTIVE for a
real llama-server and `status` says `class`; `gpushare-tui class PID batch` changes it live; a bad class is
one line and exit 2 before anything starts."""

from __future__ import annotations

import json

import pytest
from llama_env import end_pid

from gpushare_tui.core.pacing import control
from gpushare_tui.core.registry import abi
from gpushare_tui.core.registry.segment import Segment, shm_path


@pytest.mark.parametrize("command", ["run", "launch"])
def test_a_bad_class_is_a_usage_error_before_anything_starts(command: str, cli, gpu_key: str) -> None:
    r = cli(command, "--class", "urgent", "--gpu-key", gpu_key, "--", "llama-server", "-m", "x.gguf")
    assert (
        r.returncode == 2
        and r.stderr.strip() == "gpushare-tui: invalid --class 'urgent': must be one of interactive, batch"
    )


def test_synth_bad_class(cli, gpu_key: str) -> None:
    r = cli("synth", "--weight", "1", "--gpu-key", gpu_key, "--class", "")
    assert r.returncode == 2 and "invalid --class ''" in r.stderr


@pytest.mark.slow
@pytest.mark.llama
def test_launch_class_interactive_then_batch(
    cli, gpu_key: str, runtime_dir: str, llama_server: str, tiny_model: str
) -> None:
    from gpushare_tui.core.engines.llama_server import free_port

    engine = [llama_server, "-m", tiny_model, "-t", "1", "-c", "512", "--port", str(free_port())]
    r = cli("launch", "--json", "--class", "interactive", "--gpu-key", gpu_key, "--", *engine, timeout=120)
    assert r.returncode == 0, r.stderr
    pid = json.loads(r.stdout)["engine_pid"]
    try:
        with Segment.attach_readonly(shm_path(gpu_key)) as seg:
            flags = lambda: next(x.flags for x in seg.read_slots() if x.pid == pid)  # noqa: E731
            assert flags() & abi.FLAG_INTERACTIVE
            assert control.request(pid, "status")["class"] == "interactive"
            assert cli("class", str(pid), "batch").stdout.strip() == f"engine {pid}: class batch"
            assert not flags() & abi.FLAG_INTERACTIVE and control.request(pid, "status")["class"] == "batch"
        assert cli("stop", str(pid), timeout=60).returncode == 0
    finally:
        end_pid(pid)
