"""The headless `--once` path never imports Textual (core/ never importing UI code is an import-linter
contract: test_import_contracts.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO

UI_MODULES = ("textual", "textual_plotext", "plotext", "gpushare_tui.app", "gpushare_tui.widgets")

CLIRUNNER = r"""
import json, sys
from typer.testing import CliRunner
from gpushare_tui import cli
r = CliRunner().invoke(cli.app, ["--once", "--json", "--gpu-key", sys.argv[1]])
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


@pytest.mark.parametrize("script", [CLIRUNNER, AS_MODULE], ids=["clirunner", "python-m"])
def test_once_json_does_not_import_textual(script: str, gpu_key: str) -> None:
    r = subprocess.run([sys.executable, "-c", script, gpu_key], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["exit"] in (0, None)
    assert json.loads(res["out"])["gpus"] == []  # it really ran the --once path
    assert "gpushare_tui.cli" in res["mods"] and "gpushare_tui.core.snapshot" in res["mods"]
    assert "textual" not in res["mods"]
    assert _ui_loaded(res["mods"]) == []
