"""examples/share_loop.py runs (numpy without a CUDA PyTorch), joins the registry, answers the
control socket, and ends on `stop`; a bad key is one line and exit 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpushare_tui.core.pacing.control import request
from testkit.paths import REPO
from testkit.wait import wait_for

pytestmark = pytest.mark.slow

EXAMPLE = str(Path(REPO) / "examples" / "share_loop.py")


def test_share_loop_runs_paced_and_stops_on_request(gpu_key: str, runtime_dir: str, procs) -> None:
    p = procs.start(
        [sys.executable, EXAMPLE, "--gpu-key", gpu_key, "--weight", "2", "--seconds", "60"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = p.stdout.readline()
    assert "slot 0 of " + gpu_key in first and "weight 2" in first, first + p.stderr.read()
    status = wait_for(lambda: (s := request(p.pid, "status"))["tok_s"] and s, 10, what="steps/s in status")
    assert status["name"] == "example" and status["kind"] == "python" and status["weight"] == 2.0
    assert status["model"] in ("numpy/cpu", "torch/cuda")
    once = subprocess.run(
        [sys.executable, "-m", "gpushare_tui", "--once", "--json", "--gpu-key", gpu_key],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    peers = json.loads(once.stdout)["gpus"][0]["peers"]
    assert [(x["pid"], x["name"], x["active"]) for x in peers] == [(p.pid, "example", True)]
    request(p.pid, "stop")
    out, err = p.communicate(timeout=20)
    assert p.returncode == 0, err
    assert out.strip().splitlines()[-1].endswith(" steps")


def test_share_loop_bad_key_is_one_line(runtime_dir: str) -> None:
    r = subprocess.run(
        [sys.executable, EXAMPLE, "--gpu-key", "bad/key", "--seconds", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert r.returncode == 1
    assert r.stderr.startswith("share_loop: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_share_loop_runs_in_pure_python_without_numpy(gpu_key: str, runtime_dir: str) -> None:
    """After `pip install .` alone (no numpy, no PyTorch) the example still runs and joins."""
    hide = (
        "import runpy, sys; sys.modules['numpy'] = None; sys.modules['torch'] = None; "  # their imports now fail
        f"runpy.run_path({EXAMPLE!r}, run_name='__main__')"
    )
    r = subprocess.run(
        [sys.executable, "-c", hide, "--gpu-key", gpu_key, "--seconds", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith(f"share_loop: python/cpu, slot 0 of {gpu_key}, weight 1"), r.stdout
    assert int(lines[-1].split()[1]) > 0 and lines[-1].endswith(" steps"), r.stdout
