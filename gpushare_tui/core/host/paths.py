"""The per-user directories, and the one trusted-directory check every path we write through passes.

Runtime (control sockets, `up`'s locks): `$XDG_RUNTIME_DIR/gpushare-tui`, else (unset, or not
trusted) `/tmp/gpushare-tui-<uid>`, mode 0700.
State (logs): `$XDG_STATE_HOME/gpushare-tui`, else `$HOME/.local/state/gpushare-tui`, else (not
trusted) the same under the home directory the password database gives our uid.

A directory is *trusted* as OpenSSH trusts `~/.ssh` (`safe_path`): walked from `/` one component
at a time, each opened relative to the last with O_NOFOLLOW (a symbolic link anywhere is refused,
never followed), each owned by us or root and not group/world-writable (a sticky one such as /tmp
is allowed above the last), the last owned by us. Nobody else can then rename or replace anything
on the path, so a file opened or unlinked in it (relative to the checked directory's fd) is ours.
When the directory the environment names is not trusted (root after `sudo -E` with another user's
XDG_RUNTIME_DIR, say) the next candidate is used and one line on stderr says so.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from .errors import ControlError

APP_DIR = "gpushare-tui"
CREATE_DEPTH = 64  # a missing runtime or state directory is made, parents included (under a trusted part)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UntrustedPathError(ControlError):
    """A directory (or a file in one) we must not write through; the message names it and why."""


class _Refused(Exception):
    """Why one walk stopped. `trust`: another user could change what is there (owned by someone
    else, writable by others, a link): a candidate to fall back from. Otherwise a mistake to
    report (missing and cannot be made, not a directory, our own directory with a loose mode)."""

    def __init__(self, reason: str, *, trust: bool = False, loose_own: str = "") -> None:
        super().__init__(reason)
        self.trust, self.loose_own = trust, loose_own


def _check(fd: int, where: str, *, last: bool, private: bool) -> None:
    st = os.fstat(fd)
    euid = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (euid, 0) or (last and st.st_uid != euid):
        raise _Refused(f"{where} is owned by uid {st.st_uid}, not by us (uid {euid})", trust=True)
    if st.st_mode & 0o022 and not (st.st_mode & stat.S_ISVTX and not last):
        raise _Refused(f"{where} is group/world-writable (mode {mode:04o})", trust=True)
    if last and private and st.st_mode & 0o077:  # ours, readable by others: a mistake of ours to fix
        raise _Refused(f"{where} is not private to this user (mode {mode:04o})", loose_own=where)


def open_trusted_dir(path: str, *, create: int = 0, private: bool = False) -> int:
    """An O_DIRECTORY fd of `path` once every component is checked (see the module docstring);
    the last `create` components are made (mode 0700, under the trusted part) when missing. `private`: the
    last must also have no group/other bits. UntrustedPathError (one line) otherwise."""
    try:
        fd = _walk(path, create, private)
    except _Refused as e:
        raise UntrustedPathError(str(e)) from None
    assert fd is not None
    return fd


def _walk(path: str, create: int, private: bool, *, dry: bool = False) -> int | None:
    """The checked fd of `path`; `dry`: None at the first missing component it may create (nothing is)."""
    parts = [p for p in os.path.abspath(path).split("/") if p]
    fd = os.open("/", _DIR_FLAGS)
    where = ""
    try:
        _check(fd, "/", last=not parts, private=private)
        for i, name in enumerate(parts):
            where += "/" + name
            last = i == len(parts) - 1
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if i < len(parts) - create:
                    raise _Refused(f"{where} does not exist") from None
                if dry:
                    os.close(fd)
                    return None
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as e:
                    raise _Refused(f"cannot create {where} ({e.strerror})") from None
                nfd = _open_component(name, fd, where)
            except OSError as e:
                nfd = _refuse_component(name, fd, where, e)
            os.close(fd)
            fd = nfd
            _check(fd, where, last=last, private=private)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _open_component(name: str, dir_fd: int, where: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        return _refuse_component(name, dir_fd, where, e)


def _refuse_component(name: str, dir_fd: int, where: str, e: OSError) -> int:
    try:
        if stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode):
            raise _Refused(f"{where} is a symbolic link (not followed)", trust=True)
    except OSError:
        pass
    if e.errno == errno.ENOTDIR:
        raise _Refused(f"{where} is not a directory")
    raise _Refused(f"{where} is unusable ({e.strerror})")


@contextmanager
def trusted_dir(path: str, *, create: int = 0, private: bool = False) -> Iterator[int]:
    """`open_trusted_dir` as a context: the fd is closed after."""
    fd = open_trusted_dir(path, create=create, private=private)
    try:
        yield fd
    finally:
        os.close(fd)


# -- the runtime and state directories -----------------------------------------------------------

_said: set[str] = set()


def _say_once(line: str) -> None:
    if line not in _said:
        _said.add(line)
        print(f"gpushare-tui: {line}", file=sys.stderr, flush=True)


def _choose(kind: str, candidates: list[tuple[str, str]], *, private: bool, fix: str, dry: bool = False) -> str:
    """The first candidate (label, path of the app directory) that is trusted, made (0700, parents
    included) if missing. One another user could change is fallen back from, said once (one line);
    ControlError (one line, with `fix`) for any other problem, or when none is trusted. `dry`:
    nothing is created or said, and the answer is the candidate `runtime_dir` would take or fail on."""
    refusals: list[str] = []
    for label, path in candidates:
        try:
            fd = _walk(path, CREATE_DEPTH, private, dry=dry)
        except _Refused as e:
            if not e.trust:
                if dry:
                    return path
                if e.loose_own == os.path.abspath(path):
                    raise ControlError(f"{kind} directory {path} is not private to this user") from None
                raise ControlError(f"{kind} directory {path} is unusable: {e}; {fix}") from None
            refusals.append(f"{label} ({e})")
            continue
        if fd is not None:
            os.close(fd)
        if refusals and not dry:
            _say_once(f"not using {refusals[0]}; {kind} directory {path}")
        return path
    if dry:
        return candidates[-1][1]
    raise ControlError(f"no usable {kind} directory: {'; '.join(refusals)}; {fix}")


def _runtime_candidates() -> list[tuple[str, str]]:
    base = os.environ.get("XDG_RUNTIME_DIR")
    fallback = ("/tmp", f"/tmp/{APP_DIR}-{os.geteuid()}")
    return ([("XDG_RUNTIME_DIR", os.path.join(base, APP_DIR))] if base else []) + [fallback]


def runtime_dir_path() -> str:
    """Where the runtime directory is (as `runtime_dir` would choose it; nothing is created)."""
    return _choose("runtime", _runtime_candidates(), private=True, fix="", dry=True)


def runtime_dir() -> str:
    """The private per-user socket directory (trusted, mode 0700), created if missing. ControlError
    (one line naming the path and the fix) when none can be used."""
    fix = "set XDG_RUNTIME_DIR to a private directory you can write" + (
        "" if os.environ.get("XDG_RUNTIME_DIR") else " (it is unset)"
    )
    return _choose("runtime", _runtime_candidates(), private=True, fix=fix)


def _state_candidates() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    if os.environ.get("XDG_STATE_HOME"):
        out.append(("XDG_STATE_HOME", os.path.join(os.environ["XDG_STATE_HOME"], APP_DIR)))
    homes = [os.path.expanduser("~")]
    try:
        homes.append(pwd.getpwuid(os.geteuid()).pw_dir)
    except KeyError:
        pass
    for home in dict.fromkeys(homes):
        if home and home != "~":
            out.append((f"home {home}", os.path.join(home, ".local", "state", APP_DIR)))
    return out


def state_dir() -> str:
    """Per-user state directory for logs (trusted), created if missing; ControlError (one line) if none is usable."""
    return _choose(
        "state",
        _state_candidates(),
        private=False,
        fix="set XDG_STATE_HOME to a directory of yours that you can write",
    )


# -- files in trusted directories ----------------------------------------------------------------


def open_log(path: str) -> int:
    """A write-only, appending descriptor of the log file `path` in a trusted directory: created
    0600 if missing, never through a symbolic link, and only a regular file of ours with one link
    (open_in_trusted). UntrustedPathError (one line) otherwise."""
    return open_in_trusted(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, label="log", one_link=True)


def open_lock(path: str) -> int:
    """A read-write descriptor of the lock file `path` in a trusted directory (created 0600); the
    open's OSError as it is (open_in_trusted)."""
    return open_in_trusted(path, os.O_RDWR | os.O_CREAT)


def open_existing_lock(path: str) -> int:
    """`open_lock` without creating: FileNotFoundError when the lock is missing."""
    return open_in_trusted(path, os.O_RDWR)


def open_in_trusted(path: str, flags: int, *, label: str | None = None, one_link: bool = False) -> int:
    """The one opener of a file in a trusted directory: a blocking descriptor of `path` opened with
    `flags` (0600 if O_CREAT creates it) relative to the checked directory's fd, never through a
    symbolic link (O_NOFOLLOW), and only a regular file of ours; with `one_link` (the link rule), only
    one with a single hard link. `label` (the error text): the open's OSError becomes an
    UntrustedPathError naming `{label} {path}` and why; without one it is raised as it is (a
    caller tells FileNotFoundError apart). UntrustedPathError when the file is not one of ours."""
    directory, name = os.path.split(os.path.abspath(path))
    named = f"{label} {path}" if label else path
    with trusted_dir(directory) as dfd:
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, 0o600, dir_fd=dfd)
        except OSError as e:
            if label is None:
                raise
            why = "is a symbolic link (not followed)" if e.errno == errno.ELOOP else f"cannot be opened ({e.strerror})"
            raise UntrustedPathError(f"{named} {why}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or (one_link and st.st_nlink != 1):
            raise UntrustedPathError(f"{named} is not a regular file of ours{' with one link' if one_link else ''}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlink_in(path: str) -> None:
    """Remove `path` relative to its (trusted) directory's fd; nothing if it is missing or its
    directory is not trusted (nothing is ever unlinked through a path another user can swap)."""
    directory, name = os.path.split(os.path.abspath(path))
    try:
        with trusted_dir(directory) as dfd:
            os.unlink(name, dir_fd=dfd)
    except (FileNotFoundError, UntrustedPathError):
        pass


def rename_in(path: str, new_name: str) -> None:
    """Rename `path` to `new_name` in the same (trusted) directory, through the directory's fd: atomic,
    replacing what had that name. OSError (UntrustedPathError among them) on failure."""
    directory, name = os.path.split(os.path.abspath(path))
    with trusted_dir(directory) as dfd:
        os.rename(name, new_name, src_dir_fd=dfd, dst_dir_fd=dfd)


def replace_file(path: str, data: bytes) -> None:
    """Write `data` to `path` atomically: a new file created exclusively (O_EXCL, O_NOFOLLOW, a
    random name) beside it, then renamed over it (a rename replaces a symbolic link, never follows
    it). OSError on failure (no temporary file left)."""
    import tempfile

    directory, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def file_name_part(name: str) -> str:
    """`name` (an engine's, from the user) made safe as part of a file name in these directories:
    `[A-Za-z0-9._-]` kept, anything else `-`, at most 64 characters."""
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name)[:64]


def real_path_digest(path: str, length: int = 16) -> str:
    """A short hex digest of `path`'s real path: the identity of a file (`up`'s config) in the names
    of what belongs to it (its lock, its engines' logs), the same however the file is named."""
    import hashlib

    return hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:length]


def up_log_path(log_dir: str, config_path: str, engine: str) -> str:
    """The log of engine `engine` of the `up` of `config_path`: `up-STEM-DIGEST-ENGINE.log`, one per
    (file, engine), so two files that both declare `chat` never share a log, and the same file's
    `up` appends to the same one after a restart."""
    stem = file_name_part(os.path.splitext(os.path.basename(config_path))[0])[:32]
    return os.path.join(log_dir, f"up-{stem}-{real_path_digest(config_path, 8)}-{file_name_part(engine)}.log")
