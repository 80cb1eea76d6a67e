"""The type check: mypy over the package, configured in pyproject.toml ([tool.mypy]), passes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testkit.paths import REPO

pytestmark = pytest.mark.slow


def test_mypy_passes() -> None:
    r = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=240)
    if r.returncode != 0:
        pytest.fail(f"mypy exit {r.returncode}:\n{r.stdout}{r.stderr}", pytrace=False)
