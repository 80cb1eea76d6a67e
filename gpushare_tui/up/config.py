"""The `up` config file (TOML, stdlib tomllib): what is declared, checked in full before
anything starts. Every problem is a ConfigError (a UsageError: exit 2) of one line naming
the file, the line where one is known, the engine and the key."""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TypeVar

from ..core.engines import declaration
from ..core.engines.declaration import DeclarationError, EngineDecl, SynthDecl
from ..core.host import budgets
from ..core.host.errors import UsageError
from ..serve.listen import DEFAULT_LISTEN, parse_listen
from .lines import key_line

__all__ = ["ConfigError", "EngineDecl", "ServeDecl", "SynthDecl", "UpConfig", "load", "parse"]

TOP_KEYS = ("gpu_key", "gpu", "share_group", "serve", "engine")
T = TypeVar("T")


class ConfigError(UsageError, ValueError):
    """An invalid config file; the message is one line: `FILE[:LINE]: [engine 'N': ]key: problem`."""


@dataclass(frozen=True)
class ServeDecl:
    listen: str = DEFAULT_LISTEN  # checked by serve.listen.parse_listen, as `serve --listen` is


SERVE_KEYS = tuple(f.name for f in fields(ServeDecl))


@dataclass(frozen=True)
class UpConfig:
    path: str  # as given (messages)
    gpu_key: str | None = None
    gpu: int | None = None
    share_group: str | None = None
    serve: ServeDecl | None = None
    engines: tuple[EngineDecl, ...] = field(default_factory=tuple)

    @property
    def directory(self) -> str:
        """Relative paths in commands are relative to the file: engines run here."""
        return os.path.dirname(os.path.abspath(self.path))

    def engine(self, name: str) -> EngineDecl | None:
        return next((e for e in self.engines if e.name == name), None)


class _Where:
    """Builds the one-line errors for one file."""

    def __init__(self, path: str, text: str) -> None:
        self.path, self.text = path, text

    def error(
        self, msg: str, *, table: str | None = None, index: int = 0, key: str | None = None, engine: str | None = None
    ) -> ConfigError:
        line = key_line(self.text, table, key.split(".")[0] if key else None, index)
        where = f"{self.path}:{line}" if line else self.path
        who = f"engine {engine}: " if engine else ""
        what = f"{table + '.' if table == 'serve' else ''}{key}: " if key else ""
        return ConfigError(f"{where}: {who}{what}{msg}")


def read_config_bytes(path: str, max_bytes: int = budgets.CONFIG_MAX_BYTES) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes`; ConfigError (one line) for
    anything else. Opened O_NONBLOCK, so a FIFO or a device swapped in never blocks the open,
    and refused (fstat: not S_ISREG) before a byte is read: /dev/zero costs nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: not a regular file (a config is read from a file only)")
        if st.st_size > max_bytes:
            raise ConfigError(f"{path}: too large ({st.st_size} bytes; at most {max_bytes})")
        parts: list[bytes] = []
        got = 0
        while got <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - got)):
            parts.append(chunk)
            got += len(chunk)
        if got > max_bytes:  # it grew after the fstat
            raise ConfigError(f"{path}: too large (more than {max_bytes} bytes)")
        return b"".join(parts)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)


def load(path: str) -> UpConfig:
    """Read and check `path`; ConfigError (one line) for anything wrong, nothing started."""
    raw = read_config_bytes(path)
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(_syntax_error(path, str(e))) from None
    except RecursionError:  # tomllib recurses per nested array/table
        raise ConfigError(f"{path}: invalid TOML: nested too deeply") from None
    return parse(data, path, text)


def _syntax_error(path: str, msg: str) -> str:
    """tomllib says `Problem (at line L, column C)`: `path:L: invalid TOML: problem (column C)`."""
    head, sep, tail = msg.rpartition(" (at line ")
    if sep:
        line, _, col = tail.rstrip(")").partition(", column ")
        return f"{path}:{line}: invalid TOML: {head} (column {col})"
    return f"{path}: invalid TOML: {msg}"


def parse(data: dict, path: str, text: str = "") -> UpConfig:
    """Check a parsed file (`text`: its source, for line numbers)."""
    w = _Where(path, text)
    _no_unknown(w, data, TOP_KEYS)
    gpu_key = _top(w, data, "gpu_key", declaration.check_gpu_key)
    gpu = _top(w, data, "gpu", declaration.check_gpu)
    if gpu_key is not None and gpu is not None:
        raise w.error("give gpu_key or gpu, not both", key="gpu")
    share_group = data.get("share_group")
    if share_group is not None and (not isinstance(share_group, str) or not share_group):
        raise w.error("must be a group name (a non-empty string)", key="share_group")
    serve = _serve(w, data.get("serve"))
    engines_raw = data.get("engine")
    if engines_raw is None or engines_raw == []:
        raise w.error("no engine declared (add an [[engine]] table with name, weight and command)")
    if not isinstance(engines_raw, list) or not all(isinstance(e, dict) for e in engines_raw):
        raise w.error("must be an array of tables: [[engine]]", key="engine")
    engines: list[EngineDecl] = []
    ports: dict[int, str] = {}
    per_key: dict[object, int] = {}
    directory = os.path.dirname(os.path.abspath(path))
    for i, raw in enumerate(engines_raw):
        name = raw.get("name")
        label = repr(name) if isinstance(name, str) and name else f"#{i + 1}"
        try:
            e = declaration.parse_engine(raw, cwd=directory)
        except DeclarationError as err:
            raise w.error(_problem(err), table="engine", index=i, key=err.field, engine=label) from None
        if any(seen.name == e.name for seen in engines):
            raise w.error(
                f"duplicate name {e.name!r} (names must be unique)", table="engine", index=i, key="name", engine=label
            )
        port = declaration.engine_port(e.command)
        if port is not None:
            if port in ports:
                raise w.error(
                    f"port {port} is also that of engine {ports[port]!r}",
                    table="engine",
                    index=i,
                    key="command",
                    engine=label,
                )
            ports[port] = e.name
        key = declared_key(e, gpu_key, gpu)
        per_key[key] = per_key.get(key, 0) + 1
        if per_key[key] > budgets.ENGINES_PER_KEY_MAX:
            raise w.error(
                f"more than {budgets.ENGINES_PER_KEY_MAX} engines on one GPU key (the registry has that many slots)",
                table="engine",
                index=i,
                engine=label,
            )
        engines.append(e)
    return UpConfig(path, gpu_key, gpu, share_group, serve, tuple(engines))


def declared_key(e: EngineDecl, gpu_key: str | None, gpu: int | None) -> object:
    """Which registry an engine is declared on, as the file says it (its own gpu_key or gpu, else
    the file's, else GPU 0): engines with the same one share its slots."""
    if e.gpu_key is not None:
        return e.gpu_key
    if e.gpu is not None:
        return ("gpu", e.gpu)
    return gpu_key if gpu_key is not None else ("gpu", gpu or 0)


def _problem(e: DeclarationError) -> str:
    """A DeclarationError as the file's error says it, after `key: `."""
    given = "" if e.value is None else repr(e.value)
    if e.part != e.field:  # a part of the key's value: the program, model or port of a command, ...
        return f"{e.label} {given}: {e.problem}" if given else f"{e.label}: {e.problem}"
    return f"{e.problem}, got {given}" if given else e.problem


def _no_unknown(w: _Where, given: dict, allowed: tuple[str, ...], table: str | None = None) -> None:
    for k in given:
        if k not in allowed:
            raise w.error(f"unknown key (known: {', '.join(allowed)})", key=k, table=table)


def _top(w: _Where, data: dict, key: str, check: Callable[[object], T]) -> T | None:
    """A top-level value checked as an engine's same key is (None when absent)."""
    if data.get(key) is None:
        return None
    try:
        return check(data[key])
    except DeclarationError as e:
        raise w.error(_problem(e), key=key) from None


def _serve(w: _Where, t: object) -> ServeDecl | None:
    if t is None:
        return None
    if not isinstance(t, dict):
        raise w.error("must be a table: [serve]", key="serve")
    _no_unknown(w, t, SERVE_KEYS, table="serve")
    decl = ServeDecl(**t)
    if not isinstance(decl.listen, str):
        raise w.error(f'must be a string, e.g. "{DEFAULT_LISTEN}", got {decl.listen!r}', table="serve", key="listen")
    try:
        parse_listen(decl.listen)
    except DeclarationError as e:
        raise w.error(_problem(e), table="serve", key="listen") from None
    return decl
