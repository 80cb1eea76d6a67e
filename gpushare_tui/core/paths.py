"""The per-user directories: runtime (control sockets, `up`'s locks) and state (logs).

Runtime: `$XDG_RUNTIME_DIR/gpushare-tui`, else `/tmp/gpushare-tui-<uid>`, mode 0700.
State: `$XDG_STATE_HOME/gpushare-tui`, else `~/.local/state/gpushare-tui`.
"""

from __future__ import annotations

import os
import stat

from .errors import ControlError


def runtime_dir_path() -> str:
    """Where the runtime directory is (nothing is created or checked)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(base, "gpushare-tui") if base else f"/tmp/gpushare-tui-{os.getuid()}"


def _fix_hint() -> str:
    return "set XDG_RUNTIME_DIR to a private directory you can write" + (
        "" if os.environ.get("XDG_RUNTIME_DIR") else " (it is unset)"
    )


def runtime_dir() -> str:
    """The private per-user socket directory, created if missing. ControlError (one line
    naming the path and the fix) when it cannot be created or is not a private directory."""
    path = runtime_dir_path()
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise ControlError(f"runtime directory {path} is unusable ({e.strerror}); {_fix_hint()}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ControlError(f"runtime directory {path} is not a directory; {_fix_hint()}")
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ControlError(f"runtime directory {path} is not private to this user")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ControlError(f"runtime directory {path} is not writable; {_fix_hint()}")
    return path


def state_dir() -> str:
    """Per-user state directory for supervisor logs, created if missing; ControlError (one line) if unusable."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    path = os.path.join(base, "gpushare-tui")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
        raise ControlError(
            f"state directory {path} is unusable ({e.strerror}); set XDG_STATE_HOME to a writable directory"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ControlError(f"state directory {path} is not writable; set XDG_STATE_HOME to a writable directory")
    return path


def file_name_part(name: str) -> str:
    """`name` (an engine's, from the user) made safe as part of a file name in these directories:
    `[A-Za-z0-9._-]` kept, anything else `-`, at most 64 characters."""
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name)[:64]
