"""The `up` config file (TOML, stdlib tomllib): what is declared, checked in full before
anything starts. Every problem is a ConfigError (a UsageError: exit 2) of one line naming
the file, the line where one is known, the engine and the key."""

from __future__ import annotations

import math
import os
import shutil
import tomllib
from dataclasses import dataclass, field, replace

from ..core import abi
from ..core.errors import UsageError
from .lines import key_line

RESTART_POLICIES = ("always", "on-failure", "never")
TOP_KEYS = ("gpu_key", "gpu", "share_group", "serve", "engine")
SERVE_KEYS = ("listen",)
ENGINE_KEYS = ("name", "weight", "command", "synth", "restart", "env", "gpu_key", "gpu", "load_timeout_s")
SYNTH_KEYS = ("step_ms", "work_units")


class ConfigError(UsageError, ValueError):
    """An invalid config file; the message is one line: `FILE[:LINE]: [engine 'N': ]key: problem`."""


@dataclass(frozen=True)
class SynthDecl:
    step_ms: float = 5.0
    work_units: int = 0  # 0: calibrate to step_ms


@dataclass(frozen=True)
class EngineDecl:
    """One `[[engine]]`: a command (llama-server ARGS...) or a synthetic engine."""

    name: str
    weight: float = 1.0
    command: tuple[str, ...] = ()
    synth: SynthDecl | None = None
    restart: str = "on-failure"
    env: tuple[tuple[str, str], ...] = ()
    gpu_key: str | None = None
    gpu: int | None = None
    load_timeout_s: float = 600.0

    def same_but_weight(self, other: EngineDecl) -> bool:
        """Whether `other` differs from this at most in its weight (a live re-weight, no restart)."""
        return replace(self, weight=other.weight) == other


@dataclass(frozen=True)
class ServeDecl:
    listen: str


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


def load(path: str) -> UpConfig:
    """Read and check `path`; ConfigError (one line) for anything wrong, nothing started."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(_syntax_error(path, str(e))) from None
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
    _no_unknown(w, data, TOP_KEYS, table=None, engine=None)
    gpu_key = _key(w, data, None, None)
    gpu = _gpu(w, data, None, None)
    if gpu_key is not None and gpu is not None:
        raise w.error("give gpu_key or gpu, not both", key="gpu")
    share_group = data.get("share_group")
    if share_group is not None and (not isinstance(share_group, str) or not share_group):
        raise w.error("must be a group name (a non-empty string)", key="share_group")
    serve = _serve(w, data.get("serve"))
    engines_raw = data.get("engine")
    if engines_raw is None:
        raise w.error("no engine declared (add an [[engine]] table with name, weight and command)")
    if not isinstance(engines_raw, list) or not all(isinstance(e, dict) for e in engines_raw):
        raise w.error("must be an array of tables: [[engine]]", key="engine")
    engines: list[EngineDecl] = []
    ports: dict[int, str] = {}
    for i, raw in enumerate(engines_raw):
        e = _engine(w, raw, i)
        for seen in engines:
            if seen.name == e.name:
                raise w.error(
                    f"duplicate name {e.name!r} (names must be unique)",
                    table="engine",
                    index=i,
                    key="name",
                    engine=repr(e.name),
                )
        port = _explicit_port(e.command)
        if port is not None:
            if port in ports:
                raise w.error(
                    f"port {port} is also that of engine {ports[port]!r}",
                    table="engine",
                    index=i,
                    key="command",
                    engine=repr(e.name),
                )
            ports[port] = e.name
        engines.append(e)
    return UpConfig(path, gpu_key, gpu, share_group, serve, tuple(engines))


def _no_unknown(w: _Where, given: dict, allowed: tuple[str, ...], **where: object) -> None:
    for k in given:
        if k not in allowed:
            raise w.error(f"unknown key (known: {', '.join(allowed)})", key=k, **where)  # type: ignore[arg-type]


def _key(w: _Where, t: dict, index: int | None, engine: str | None) -> str | None:
    v = t.get("gpu_key")
    if v is None:
        return None
    table = "engine" if index is not None else None
    if not isinstance(v, str):
        raise w.error("must be a string", table=table, index=index or 0, key="gpu_key", engine=engine)
    try:
        return abi.validate_gpu_key(v)
    except abi.BadKeyError:
        raise w.error(
            f"invalid {v!r}: use 1..64 characters of [A-Za-z0-9._-]",
            table=table,
            index=index or 0,
            key="gpu_key",
            engine=engine,
        ) from None


def _gpu(w: _Where, t: dict, index: int | None, engine: str | None) -> int | None:
    v = t.get("gpu")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise w.error(
            f"must be a GPU index (an integer >= 0), got {v!r}",
            table="engine" if index is not None else None,
            index=index or 0,
            key="gpu",
            engine=engine,
        )
    return v


def _serve(w: _Where, t: object) -> ServeDecl | None:
    if t is None:
        return None
    if not isinstance(t, dict):
        raise w.error("must be a table: [serve]", key="serve")
    _no_unknown(w, t, SERVE_KEYS, table="serve")
    listen = t.get("listen", "127.0.0.1:9464")
    host, sep, port = listen.rpartition(":") if isinstance(listen, str) else ("", "", "")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise w.error(f'must be HOST:PORT (e.g. "127.0.0.1:9464"), got {listen!r}', table="serve", key="listen")
    return ServeDecl(listen)


def _engine(w: _Where, t: dict, i: int) -> EngineDecl:
    name = t.get("name")
    label = repr(name) if isinstance(name, str) and name else f"#{i + 1}"

    def err(msg: str, key: str | None = None) -> ConfigError:
        return w.error(msg, table="engine", index=i, key=key, engine=label)

    _no_unknown(w, t, ENGINE_KEYS, table="engine", index=i, engine=label)
    if name is None:
        raise err("missing (every engine needs a unique name)", "name")
    if not isinstance(name, str) or not name.strip() or len(name.encode()) > abi.NAME_BYTES:
        raise err(f"must be a non-empty string of at most {abi.NAME_BYTES} bytes", "name")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise err("must not contain control characters", "name")
    weight = t.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise err(f"must be a number > 0, got {weight!r}", "weight")
    try:
        weight = abi.parse_weight(weight)
    except abi.BadWeightError:
        raise err(f"must be a finite number > 0, got {weight!r}", "weight") from None
    restart = t.get("restart", "on-failure")
    if restart not in RESTART_POLICIES:
        raise err(f"must be one of {', '.join(RESTART_POLICIES)}, got {restart!r}", "restart")
    env = t.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise err('must be a table of strings, e.g. env = { CUDA_VISIBLE_DEVICES = "0" }', "env")
    load_timeout = t.get("load_timeout_s", 600.0)
    if (
        isinstance(load_timeout, bool)
        or not isinstance(load_timeout, int | float)
        or not (math.isfinite(load_timeout) and load_timeout > 0)
    ):
        raise err(f"must be a number of seconds > 0, got {load_timeout!r}", "load_timeout_s")
    gpu_key, gpu = _key(w, t, i, label), _gpu(w, t, i, label)
    if gpu_key is not None and gpu is not None:
        raise err("give gpu_key or gpu, not both", "gpu")
    command, synth = t.get("command"), t.get("synth")
    if command is not None and synth is not None:
        raise err("give command or synth, not both", "synth")
    if command is None and synth is None:
        raise err("missing (or give synth = { step_ms = 5 } for a synthetic engine)", "command")
    decl_synth = _synth(err, synth) if synth is not None else None
    cmd: tuple[str, ...] = ()
    if command is not None:
        if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
            raise err('must be an array of strings, e.g. ["llama-server", "-m", "model.gguf"]', "command")
        if not command or not command[0]:
            raise err("is empty (give the engine's program and its arguments)", "command")
        cmd = tuple(command)
        _check_binary(err, cmd[0], w.path, env)
        port = _flag(cmd, "--port")
        if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
            raise err(f"--port {port!r} is not a port number", "command")
    return EngineDecl(
        name, weight, cmd, decl_synth, restart, tuple(sorted(env.items())), gpu_key, gpu, float(load_timeout)
    )


def _synth(err, t: object) -> SynthDecl:
    if not isinstance(t, dict):
        raise err("must be a table, e.g. synth = { step_ms = 5 }", "synth")
    for k in t:
        if k not in SYNTH_KEYS:
            raise err(f"unknown key {k!r} (known: {', '.join(SYNTH_KEYS)})", "synth")
    step = t.get("step_ms", 5.0)
    if (
        isinstance(step, bool)
        or not isinstance(step, int | float)
        or not (math.isfinite(step) and 0.05 <= step <= 10_000)
    ):
        raise err(f"step_ms must be between 0.05 and 10000, got {step!r}", "synth")
    units = t.get("work_units", 0)
    if isinstance(units, bool) or not isinstance(units, int) or units < 0:
        raise err(f"work_units must be an integer >= 0 (0: calibrate), got {units!r}", "synth")
    return SynthDecl(float(step), units)


def _check_binary(err, argv0: str, path: str, env: dict) -> None:
    """The program must exist and be executable (relative paths: from the file's directory)."""
    if "/" in argv0:
        full = os.path.join(os.path.dirname(os.path.abspath(path)), argv0)
        found = full if os.path.isfile(full) and os.access(full, os.X_OK) else None
    else:
        found = shutil.which(argv0, path=env.get("PATH", os.environ.get("PATH")))
    if found is None:
        raise err(f"program not found or not executable: {argv0}", "command")


def _flag(argv: tuple[str, ...], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _explicit_port(argv: tuple[str, ...]) -> int | None:
    p = _flag(argv, "--port")
    return int(p) if p is not None and p.isdigit() else None
