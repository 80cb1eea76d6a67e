"""Where the control sockets are: `<runtime dir>/<pid>.sock`, or `<pid>.<n>.sock` for a process that
serves several engines (core/pacing/control.py), and the one listing of them a client finds engines by.

Apart from the control socket's protocol (control.py) so that a reader that only asks which pids have
a socket (the dashboard's sources, `--once`) imports neither the protocol's types nor `socket`.
"""

from __future__ import annotations

import os

from ..host.errors import ControlError
from ..host.paths import runtime_dir, runtime_dir_path

SUN_PATH_MAX = 107  # bytes of an AF_UNIX path, without the NUL (sun_path is 108 on Linux)
PID_DIGITS_MAX = 7  # the largest Linux pid_max, 4194304


def _check_length(path: str) -> None:
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise ControlError(
            f"control socket path {path} is longer than {SUN_PATH_MAX} bytes (the AF_UNIX limit); "
            "set XDG_RUNTIME_DIR to a shorter private directory"
        )


def socket_name(engine_pid: int, index: int = 0) -> str:
    """`<pid>.sock` (index 0, the common one engine per pid), else `<pid>.<index>.sock`."""
    return f"{engine_pid}.sock" if index == 0 else f"{engine_pid}.{index}.sock"


def parse_socket_name(name: str) -> tuple[int, int] | None:
    """(pid, index) of a name `socket_name` makes, else None."""
    parts = name.split(".")
    if parts[-1:] != ["sock"] or len(parts) not in (2, 3) or not all(_is_number(x) for x in parts[:-1]):
        return None
    index = int(parts[1]) if len(parts) == 3 else 0
    if len(parts) == 3 and (index == 0 or parts[1] != str(index)):
        return None  # `<pid>.0.sock`, `<pid>.01.sock`: not names we make
    return int(parts[0]), index


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit() and text == str(int(text))


def socket_path(engine_pid: int, index: int = 0) -> str:
    """`<runtime dir>/<socket_name>`; ControlError if the directory is unusable or the path too long to bind."""
    path = os.path.join(runtime_dir_path(), socket_name(engine_pid, index))
    _check_length(path)  # before runtime_dir(): no directory is created for a path that cannot work
    runtime_dir()
    return path


def socket_index() -> dict[int, list[str]]:
    """pid -> the paths of its control sockets (index order), from one listing of the runtime
    directory; ControlError if it cannot be listed."""
    directory = runtime_dir()
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise ControlError(f"control socket directory {directory}: {e.strerror or e}") from None
    found: dict[int, list[tuple[int, str]]] = {}
    for name in names:
        parsed = parse_socket_name(name)
        if parsed is not None:
            found.setdefault(parsed[0], []).append((parsed[1], os.path.join(directory, name)))
    return {pid: [path for _i, path in sorted(entries)] for pid, entries in found.items()}


def socket_paths(engine_pid: int) -> list[str]:
    """The paths of `engine_pid`'s control sockets that exist now, `<pid>.sock` first; [] when the
    directory cannot be read."""
    try:
        return socket_index().get(engine_pid, [])
    except ControlError:
        return []


def check_socket_dir() -> str:
    """The runtime directory, if a socket for any pid fits in it; else ControlError (fail fast
    before an engine is started whose pid is not known yet)."""
    _check_length(os.path.join(runtime_dir_path(), "9" * PID_DIGITS_MAX + ".sock"))
    return runtime_dir()
