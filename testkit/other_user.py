"""The hostile local user of the security tests: uid/gid 65534 running the system interpreter."""

from __future__ import annotations

import os

OTHER_UID = OTHER_GID = 65534  # nobody / nogroup: the hostile local user
SYSTEM_PYTHON = "/usr/bin/python3"  # the venv's interpreter may live where uid 65534 cannot read


def why_not_other_user() -> str | None:
    """Why the hostile-user tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root: the attacker's steps run as uid 65534"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} not found (the attacker's interpreter)"
    return None
