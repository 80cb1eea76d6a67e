"""Helpers for the serve tests: a real `gpushare-tui serve` on a free loopback port, and segments
written by the independent writer (tests/raw_writer.py)."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx

from testkit.cli import cli_argv
from testkit.paths import REPO
from testkit.procs import Procs

RAW_WRITER = str(REPO / "tests" / "raw_writer.py")


def start_serve(procs: Procs, *args: str) -> tuple[subprocess.Popen, str]:
    """A `serve --listen 127.0.0.1:0 ARGS` and its URL (from its first stderr line)."""
    p = procs.start(cli_argv("serve", "--listen", "127.0.0.1:0", *args))
    line = p.stderr.readline()  # type: ignore[union-attr]
    m = re.search(r"listening on (http://\S+)", line)
    assert m, f"serve did not start: {line!r} {p.stderr.read() if p.poll() is not None else ''}"  # type: ignore[union-attr]
    return p, m.group(1)


def start_writer(procs: Procs, key: str, *slots: str) -> subprocess.Popen:
    """The independent writer owning `key`'s segment with `slots` (WEIGHT:NAME[:dead]); waits until written."""
    p = procs.start([sys.executable, RAW_WRITER, key, *slots])
    assert p.stdout.readline().strip() == "ready", p.stderr.read()  # type: ignore[union-attr]
    return p


def get(url: str, timeout_s: float = 10.0) -> httpx.Response:
    return httpx.get(url, timeout=timeout_s)
