"""The headless `--once` path never imports Textual; core/ never imports UI code."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

UI_MODULES = ("textual", "textual_plotext", "plotext", "gpushare_tui.app", "gpushare_tui.widgets")
FORBIDDEN_IN_CORE = ("textual", "textual_plotext", "plotext", "gpushare_tui.app", "gpushare_tui.widgets")

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


def _imports(path: Path, package: str) -> list[str]:
    """Absolute module names imported by a file (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append(mod)
            out.extend(f"{mod}.{a.name}" for a in node.names)
    return out


def _is_forbidden(mod: str) -> bool:
    return any(mod == f or mod.startswith(f + ".") for f in FORBIDDEN_IN_CORE)


def test_core_never_imports_ui() -> None:
    core = REPO / "gpushare_tui" / "core"
    files = sorted(core.rglob("*.py"))
    assert len(files) >= 10
    bad = {}
    for f in files:
        rel = f.relative_to(REPO).with_suffix("")
        package = ".".join(rel.parts[:-1])
        found = [m for m in _imports(f, package) if _is_forbidden(m)]
        if found:
            bad[str(rel)] = found
    assert bad == {}


def test_import_scan_catches_relative_and_absolute_ui_imports(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("from .. import app\nfrom ..widgets.plot import Plot\nimport textual.app\nfrom . import abi\n")
    found = [m for m in _imports(f, "gpushare_tui.core") if _is_forbidden(m)]
    assert found == ["gpushare_tui.app", "gpushare_tui.widgets.plot", "gpushare_tui.widgets.plot.Plot", "textual.app"]
    f.write_text("from ..engines import synthetic\nfrom . import abi\nimport json\n")
    assert [m for m in _imports(f, "gpushare_tui.core.engines") if _is_forbidden(m)] == []


def test_dashboard_data_never_imports_ui() -> None:
    """dashboard/ builds what the widgets render: it imports neither them nor Textual."""
    files = sorted((REPO / "gpushare_tui" / "dashboard").rglob("*.py"))
    assert len(files) >= 3
    bad = {}
    for f in files:
        rel = f.relative_to(REPO).with_suffix("")
        found = [m for m in _imports(f, ".".join(rel.parts[:-1])) if _is_forbidden(m)]
        if found:
            bad[str(rel)] = found
    assert bad == {}
