"""The headless `--once` path never imports Textual (nor, from the entry point, typer, nor anything heavy:
ONCE_NEVER). core/ never importing UI code, and no import cycle, are import-linter contracts:
test_import_contracts.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpushare_tui.core.registry.membership import Membership
from gpushare_tui.core.registry.segment import Segment
from testkit.paths import REPO

UI_MODULES = ("textual", "textual_plotext", "plotext", "gpushare_tui.app", "gpushare_tui.widgets")

CLIRUNNER = r"""
import json, sys
from typer.testing import CliRunner
from gpushare_tui.cli.typer_app import app
r = CliRunner().invoke(app, ["--once", "--json", "--gpu-key", sys.argv[1]])
print(json.dumps({"exit": r.exit_code, "out": r.stdout, "mods": sorted(sys.modules)}))
"""

AS_MODULE = r"""
import io, json, runpy, sys, contextlib
sys.argv = ["gpushare-tui", "--once", "--json", "--gpu-key", sys.argv[1]]
out = io.StringIO()
code = None
with contextlib.redirect_stdout(out):
    try:
        runpy.run_module("gpushare_tui", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
print(json.dumps({"exit": code, "out": out.getvalue(), "mods": sorted(sys.modules)}))
"""


def _ui_loaded(mods: list[str]) -> list[str]:
    return [m for m in mods if any(m == u or m.startswith(u + ".") for u in UI_MODULES)]


@pytest.mark.slow
@pytest.mark.parametrize("script", [CLIRUNNER, AS_MODULE], ids=["clirunner", "python-m"])
def test_once_json_does_not_import_textual(script: str, gpu_key: str) -> None:
    Segment.create_or_attach(gpu_key).close()  # a filter that matches nothing is an error (exit 1)
    r = subprocess.run([sys.executable, "-c", script, gpu_key], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["exit"] in (0, None)
    assert [g["gpu_key"] for g in json.loads(res["out"])["gpus"]] == [gpu_key]  # it really ran the --once path
    assert "gpushare_tui.cli" in res["mods"] and "gpushare_tui.core.observe.snapshot" in res["mods"]
    assert "textual" not in res["mods"]
    assert _ui_loaded(res["mods"]) == []
    if script is AS_MODULE:  # the entry point serves --once without the full command line
        assert "typer" not in res["mods"] and "pydantic" not in res["mods"]
    assert "pynvml" not in res["mods"]  # a key that is no NVML UUID: asking NVML about it costs nothing


HEADLESS_ONLY = ("textual", "pydantic", "typer", "rich", "click")


def _imported(stderr: str) -> set[str]:
    """Module names from `-X importtime` lines ("import time: self | cumulative | name")."""
    return {ln.rsplit("|", 1)[1].strip() for ln in stderr.splitlines() if ln.startswith("import time:") and "|" in ln}


@pytest.mark.parametrize("how", ["console-script", "python-m"])
def test_entry_point_once_json_imports_no_typer(how: str, gpu_key: str) -> None:
    """The real entry point, as installed, in its own interpreter: --once --json imports neither
    the UI nor the full command line (typer, its click, rich, pydantic)."""
    script = Path(sys.executable).with_name("gpushare-tui")
    if how == "console-script" and not script.exists():
        pytest.skip(f"{script} is not installed (pip install -e .)")
    argv = [str(script)] if how == "console-script" else [sys.executable, "-m", "gpushare_tui"]
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    Segment.create_or_attach(gpu_key).close()
    r = subprocess.run([*argv, "--once", "--json", "--gpu-key", gpu_key], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert [g["gpu_key"] for g in json.loads(r.stdout)["gpus"]] == [gpu_key]
    mods = _imported(r.stderr)
    assert "gpushare_tui.cli" in mods and "gpushare_tui.core.observe.snapshot" in mods  # the report was really made
    loaded = sorted(m for m in mods if m.split(".")[0] in HEADLESS_ONLY or m.startswith("gpushare_tui.cli.typer_app"))
    assert loaded == []
    assert _ui_loaded(sorted(mods)) == []


def test_entry_point_falls_back_to_the_full_command_line(gpu_key: str) -> None:
    """Anything beyond the headless options (here --help) is typer's."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    argv = [sys.executable, "-m", "gpushare_tui", "--once", "--help"]
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "--once" in r.stdout and "Commands" in r.stdout
    assert "typer" in _imported(r.stderr)


# What the headless `--once --json` path must not import (issue 28: its start-up within 2.5x of a bare
# interpreter's): the full command line and the UI, what only other commands need (processes, HTTP,
# the exporter, NVML for a key that is no device), what only asking an engine needs (a host with no
# managed engine asks none), and typing (only type checks need it). A name covers its submodules.
ONCE_NEVER = (
    *HEADLESS_ONLY,
    *UI_MODULES,
    "psutil",
    "httpx",
    "h11",
    "prometheus_client",
    "pynvml",
    "atomics",
    "asyncio",
    "subprocess",
    "tempfile",
    "hashlib",
    "socket",
    "typing",
    "gpushare_tui.cli.typer_app",
    "gpushare_tui.core.pacing.control",
    "gpushare_tui.core.engines",
    "gpushare_tui.dashboard.history",
    "gpushare_tui.serve",
    "gpushare_tui.up",
)


@pytest.mark.parametrize("how", ["console-script", "python-m"])
def test_once_json_imports_nothing_heavy(how: str, gpu_key: str, runtime_dir: str) -> None:
    """The real entry point with a live peer to report: beyond what a bare interpreter imports, none of
    ONCE_NEVER (an import count, not a timing: bench.once_json_wall times it)."""
    script = Path(sys.executable).with_name("gpushare-tui")
    if how == "console-script" and not script.exists():
        pytest.skip(f"{script} is not installed (pip install -e .)")
    argv = [str(script)] if how == "console-script" else [sys.executable, "-m", "gpushare_tui"]
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    bare = _imported(subprocess.run([sys.executable, "-c", "pass"], capture_output=True, text=True, env=env).stderr)
    with Membership(gpu_key, 1.0, "peer", heartbeat_s=3600):
        r = subprocess.run([*argv, "--once", "--json", "--gpu-key", gpu_key], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert [len(g["peers"]) for g in json.loads(r.stdout)["gpus"]] == [1]  # the report was really made
    mods = _imported(r.stderr) - bare
    assert "gpushare_tui.dashboard.report" in mods
    assert sorted(m for m in mods if any(m == n or m.startswith(n + ".") for n in ONCE_NEVER)) == []
