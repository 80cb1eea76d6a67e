"""Registry segments of tests: unique keys and the /dev/shm file of a key."""

from __future__ import annotations

import os
import uuid

from gpushare_tui.core.registry import abi

SHM_DIR = "/dev/shm"


def shm_file(key: str) -> str:
    """Path of the segment file for `key`."""
    return os.path.join(SHM_DIR, abi.SEGMENT_PREFIX + key)


def unique_key(tag: str = "t") -> str:
    return f"{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def remove(path: str) -> None:
    """Unlink `path`; already gone is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
