"""Waiting for what another process makes."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import pytest


def wait_for(pred: Callable[[], object], timeout: float, interval: float = 0.02, what: str = "condition") -> object:
    """Poll `pred` until truthy; fail the test with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def read_json_file(path: str | os.PathLike) -> dict | None:
    """The JSON object in `path`; None while it is missing or not whole yet."""
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None
