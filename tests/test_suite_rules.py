"""The run's own rules (testkit/suite.py), each in a real nested pytest run on xdist workers: an `alone` test
runs while no other test does, and a run that leaves a process or a file of its own behind fails, naming it."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from testkit.paths import REPO
from testkit.shm import remove

pytestmark = pytest.mark.slow

INI = """[pytest]
markers =
    alone: runs alone
"""

SPELLS = """
import os, time, pytest

def spell(name):
    t0 = time.monotonic()
    time.sleep(0.3)
    with open(os.environ["SPELLS_LOG"], "a") as f:
        f.write(f"{name} {t0} {time.monotonic()}\\n")

@pytest.mark.parametrize("i", range(8))
def test_shared(i):
    spell("shared")

@pytest.mark.alone
@pytest.mark.parametrize("i", range(2))
def test_alone(i):
    spell("alone")
"""


def nested_run(tmp_path: Path, tests: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "test_nested.py").write_text(tests)
    argv = [sys.executable, "-m", "pytest", "-p", "testkit.suite", "-p", "no:cacheprovider", "-q", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_an_alone_test_runs_while_no_other_test_does(tmp_path: Path) -> None:
    log = tmp_path / "spells.log"
    r = nested_run(tmp_path, SPELLS, "-n", "3", "--dist", "loadgroup", env={"SPELLS_LOG": str(log)})
    assert r.returncode == 0, r.stdout + r.stderr
    spells = [(name, float(t0), float(t1)) for name, t0, t1 in (ln.split() for ln in log.read_text().splitlines())]
    alone = [(t0, t1) for name, t0, t1 in spells if name == "alone"]
    shared = [(t0, t1) for name, t0, t1 in spells if name == "shared"]
    assert len(alone) == 2 and len(shared) == 8
    overlapping = [(a, s) for a in alone for s in shared if s[0] < a[1] and a[0] < s[1]]
    assert overlapping == []
    # and the others did run side by side (3 workers): the lock is no global serialisation
    assert any(x[0] < y[1] and y[0] < x[1] for i, x in enumerate(shared) for y in shared[i + 1 :])


def test_a_run_that_leaves_a_process_or_a_segment_fails_naming_them(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    leaks = f"""
import os, subprocess, sys
def test_leaks():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    # a test's key holds its pid (testkit.shm.unique_key): so the run tells the segment as its own
    os.close(os.open(f"/dev/shm/opencoti-gpu-left-{{os.getpid()}}-{tag}", os.O_CREAT | os.O_RDWR, 0o600))
"""
    out = ""
    try:
        r = nested_run(tmp_path, leaks, "-n", "2")
        out = r.stdout
        assert r.returncode == 1, r.stdout + r.stderr
        assert "1 passed" in out and "the run left 2 things behind" in out, out
        assert re.search(rf"^  /dev/shm/opencoti-gpu-left-\d+-{tag}$", out, re.M), out
        assert re.search(r"^  process \d+: .* -c import time; time.sleep\(30\)$", out, re.M), out
    finally:
        for path in glob.glob(f"/dev/shm/opencoti-gpu-left-*-{tag}"):
            remove(path)
        for pid in re.findall(r"^  process (\d+): ", out, re.M):
            os.kill(int(pid), signal.SIGKILL)


def test_by_file_says_where_the_time_went_slowest_file_first(tmp_path: Path) -> None:
    (tmp_path / "test_quick.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    r = nested_run(tmp_path, SPELLS, "-n", "2", "--dist", "loadgroup", "--by-file", env={"SPELLS_LOG": "/dev/null"})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = re.findall(r"^(test_\w+\.py) +(\d+) +([\d.]+) +([\d.]+)%$", r.stdout, re.M)
    assert [(f, n) for f, n, _s, _p in rows] == [("test_nested.py", "10"), ("test_quick.py", "2")], r.stdout
    seconds = float(rows[0][2])
    assert 10 * 0.3 <= seconds < 10 * 0.3 + 5  # ten tests that sleep 0.3 s each, summed over the workers
