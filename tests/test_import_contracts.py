"""import-linter contracts (pyproject.toml [tool.importlinter]): core/ never imports UI code, its layers
(host < registry < schedule < observe < pacing < engines) import only downward, the cli
command modules are independent, the headless cli modules never import typer, and no import cycle
anywhere inside the package (function-level imports included)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testkit.paths import REPO

pytestmark = pytest.mark.slow

LINT = "from importlinter.cli import lint_imports; raise SystemExit(lint_imports(no_cache=True))"


def test_import_contracts_are_kept() -> None:
    r = subprocess.run([sys.executable, "-c", LINT], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kept, 0 broken." in r.stdout


def test_the_engines_per_key_budget_is_the_registrys_slot_count() -> None:
    """host/budgets.py sits below the ABI, so it spells 16 itself: the two must agree."""
    from gpushare_tui.core.host.budgets import ENGINES_PER_KEY_MAX
    from gpushare_tui.core.registry.abi import SLOT_COUNT

    assert ENGINES_PER_KEY_MAX == SLOT_COUNT
