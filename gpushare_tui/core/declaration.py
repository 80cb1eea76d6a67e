"""An engine declaration and the one validator of what a user declares: `up`'s `[[engine]]` tables,
the dashboard's launch form, `run`/`launch` and `synth` all check here, and each only maps a
DeclarationError to its own form (file:line, an inline field message, one line on stderr).

The `[[engine]]` keys are EngineDecl's fields, each parsed by the function in its metadata: the
declaration that parses is the one that validates."""

from __future__ import annotations

import math
import os
import shutil
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

from . import abi
from .errors import UsageError

RESTART_POLICIES = ("always", "on-failure", "never")
MODEL_FLAGS = ("-m", "--model")
PORT_FLAG = "--port"
STEP_MS_MIN, STEP_MS_MAX = 0.05, 10_000.0
_LABELS = {"binary": "engine binary", "model": "model", "port": PORT_FLAG}


class DeclarationError(UsageError, ValueError):
    """One invalid value. `field`: the declaration's field (an `[[engine]]` key); `part`: what in it
    (`binary`, `model` or `port` of a command, `step_ms` of synth; else the field); `label`: how a
    person names it; `value`: what was given (None: nothing); `problem`: what is wrong with it.
    `str(e)`, the command line's form: `invalid LABEL 'VALUE': PROBLEM`."""

    def __init__(
        self, field: str, value: object, problem: str, *, part: str | None = None, label: str | None = None
    ) -> None:
        self.field, self.value, self.problem = field, value, problem
        self.part = part or field
        self.label = label or _LABELS.get(self.part, self.part)
        given = "" if value is None else f" {value!r}"
        super().__init__(f"invalid {self.label}{given}: {problem}")

    @property
    def at_field(self) -> str:
        """The form's form, shown at the field it belongs to: `'VALUE': PROBLEM` (the value named, as
        the field may show only its start), or PROBLEM when nothing was given."""
        return self.problem if self.value is None else f"{self.value!r}: {self.problem}"


def check_name(name: object, *, label: str = "name") -> str:
    """A display name: non-empty, at most abi.NAME_BYTES bytes of UTF-8 (the slot's name field:
    longer would be truncated), no control characters."""
    if not isinstance(name, str) or not name.strip():
        raise DeclarationError("name", name, "must be a non-empty string", label=label)
    if len(name.encode("utf-8")) > abi.NAME_BYTES:
        raise DeclarationError("name", name, f"must be at most {abi.NAME_BYTES} bytes (UTF-8)", label=label)
    if any(unicodedata.category(c) == "Cc" for c in name):
        raise DeclarationError("name", name, "must not contain control characters", label=label)
    return name


def check_weight(value: str | float) -> float:
    """The weight as the slot stores it (abi.parse_weight: a finite f32 > 0) from text or a number."""
    try:
        return abi.parse_weight(value)
    except abi.BadWeightError:
        raise DeclarationError("weight", value, abi.WEIGHT_RULE) from None


def check_port(text: str, *, any_port: bool = False) -> int:
    """A TCP port given as text: 1..65535, or 0 too where it means any free port (`any_port`)."""
    low = 0 if any_port else 1
    if text.isascii() and text.isdigit() and low <= int(text) <= 65535:
        return int(text)
    raise DeclarationError("command", text, f"must be {low}..65535", part="port")


def check_gpu_key(value: object) -> str:
    if not isinstance(value, str):
        raise DeclarationError("gpu_key", value, "must be a string", label="gpu key")
    try:
        return abi.validate_gpu_key(value)
    except abi.BadKeyError:
        raise DeclarationError("gpu_key", value, "use 1..64 characters of [A-Za-z0-9._-]", label="gpu key") from None


def check_gpu(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DeclarationError("gpu", value, "must be a GPU index (an integer >= 0)")
    return value


def check_load_timeout(value: object, *, label: str = "load_timeout_s") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
        raise DeclarationError("load_timeout_s", value, "must be a number of seconds > 0", label=label)
    return float(value)


def check_step_ms(value: object, *, label: str = "step_ms") -> float:
    """A synthetic engine's CPU work per step."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and STEP_MS_MIN <= value <= STEP_MS_MAX)
    ):
        raise DeclarationError(
            "synth", value, f"must be between {STEP_MS_MIN:g} and {STEP_MS_MAX:g}", part="step_ms", label=label
        )
    return float(value)


def check_work_units(value: object, *, label: str = "work_units") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DeclarationError(
            "synth", value, "must be an integer >= 0 (0: calibrate to step_ms)", part="work_units", label=label
        )
    return value


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the first of `names` in a command line (`--flag V` or `--flag=V`), or None."""
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def engine_port(argv: Sequence[str]) -> int | None:
    """The checked --port of an engine's command line, or None when it gives none."""
    text = flag_value(argv, PORT_FLAG)
    return None if text is None else check_port(text)


def check_binary(argv0: str, *, cwd: str | None = None, path: str | None = None) -> str:
    """The full path of a command's program: one with a `/` is relative to `cwd` (default: here),
    a bare name is looked up on `path` (default: $PATH). It must be an executable file."""

    def bad(problem: str) -> DeclarationError:
        return DeclarationError("command", argv0 or None, problem, part="binary")

    if not argv0:
        raise bad("required (the engine's program)")
    if "/" in argv0:
        full = os.path.join(cwd or os.getcwd(), argv0)
        if not os.path.isfile(full):
            raise bad("no such file")
        if not os.access(full, os.X_OK):
            raise bad("not executable")
        return full
    found = shutil.which(argv0, path=path)
    if found is None:
        raise bad("not on PATH (give its full path)")
    return found


def check_model(model: str, *, cwd: str | None = None) -> str:
    """A model file the engine will read (relative to `cwd`, default: here)."""

    def bad(problem: str) -> DeclarationError:
        return DeclarationError("command", model or None, problem, part="model")

    if not model:
        raise bad("required (the model file)")
    full = os.path.join(cwd or os.getcwd(), model)
    if not os.path.isfile(full):
        raise bad("no such file")
    if not os.access(full, os.R_OK):
        raise bad("not readable")
    return model


def command_problems(argv: Sequence[str], *, cwd: str | None = None, path: str | None = None) -> list[DeclarationError]:
    """Every problem of an engine's command line (llama-server ARGS...): its program, its model
    (-m/--model, when given) and its --port (when given); [] when it may be started."""
    checks: list[Callable[[], object]] = [lambda: check_binary(argv[0] if argv else "", cwd=cwd, path=path)]
    model = flag_value(argv, *MODEL_FLAGS)
    if model is not None:
        checks.append(lambda: check_model(model, cwd=cwd))
    checks.append(lambda: engine_port(argv))
    return _problems(checks)


def _problems(checks: Sequence[Callable[[], object]]) -> list[DeclarationError]:
    """The DeclarationError of each check that raises one."""
    problems: list[DeclarationError] = []
    for check in checks:
        try:
            check()
        except DeclarationError as e:
            problems.append(e)
    return problems


def check_command(argv: Sequence[str], *, cwd: str | None = None, path: str | None = None) -> tuple[str, ...]:
    """`argv` if it may be started (see command_problems), else its first problem."""
    for problem in command_problems(argv, cwd=cwd, path=path):
        raise problem
    return tuple(argv)


def launch_problems(
    command: Sequence[str], *, weight: str | float, name: str | None = None, load_timeout_s: float = 600.0
) -> list[DeclarationError]:
    """Every problem of an engine to start from here (`run`, `launch`, the launch form), in the order
    of its fields: its name (None: the model's, unchecked), weight, command and load timeout."""
    named: list[Callable[[], object]] = [] if name is None else [lambda: check_name(name, label="--name")]
    return [
        *_problems([*named, lambda: check_weight(weight)]),
        *command_problems(command),
        *_problems([lambda: check_load_timeout(load_timeout_s, label="--load-timeout")]),
    ]


def check_launch(
    command: Sequence[str], *, weight: str | float, name: str | None = None, load_timeout_s: float = 600.0
) -> float:
    """The weight of an engine to start from here, once launch_problems finds none; else the first."""
    for problem in launch_problems(command, weight=weight, name=name, load_timeout_s=load_timeout_s):
        raise problem
    return check_weight(weight)


def synth_problems(
    *, weight: str | float, name: str, step_ms: str | float, work_units: str | int
) -> list[DeclarationError]:
    """Every problem of a synthetic engine to start from here (the launch form, its values as typed:
    text that is a number is that number), in the order of its fields."""
    return _problems(
        [
            lambda: check_name(name),
            lambda: check_weight(weight),
            lambda: check_step_ms(_typed(step_ms, float)),
            lambda: check_work_units(_typed(work_units, int)),
        ]
    )


def _typed(value: object, kind: type[int] | type[float]) -> object:
    """`value`, or the number of `kind` its text is (text that is none stays text, for the check to name)."""
    if isinstance(value, str):
        try:
            return kind(value.strip())
        except ValueError:
            return value
    return value


def _toml_weight(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DeclarationError("weight", value, "must be a number > 0")
    return check_weight(value)


def _toml_command(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise DeclarationError(
            "command", None, 'must be an array of strings, e.g. ["llama-server", "-m", "model.gguf"]'
        )
    if not value or not value[0]:
        raise DeclarationError("command", None, "is empty (give the engine's program and its arguments)")
    return tuple(value)


def _toml_restart(value: object) -> str:
    if value not in RESTART_POLICIES:
        raise DeclarationError("restart", value, f"must be one of {', '.join(RESTART_POLICIES)}")
    return str(value)


def _toml_env(value: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise DeclarationError("env", None, 'must be a table of strings, e.g. env = { CUDA_VISIBLE_DEVICES = "0" }')
    return tuple(sorted(value.items()))


@dataclass(frozen=True)
class SynthDecl:
    """A synthetic engine's work (`synth = { step_ms = 5 }`)."""

    step_ms: float = field(default=5.0, metadata={"parse": check_step_ms})
    work_units: int = field(default=0, metadata={"parse": check_work_units})  # 0: calibrate to step_ms


SYNTH_KEYS = tuple(f.name for f in fields(SynthDecl))


def _toml_synth(value: object) -> SynthDecl:
    if not isinstance(value, dict):
        raise DeclarationError("synth", None, "must be a table, e.g. synth = { step_ms = 5 }")
    unknown = next((k for k in value if k not in SYNTH_KEYS), None)
    if unknown is not None:
        raise DeclarationError("synth", None, f"unknown key {unknown!r} (known: {', '.join(SYNTH_KEYS)})")
    return SynthDecl(**{f.name: f.metadata["parse"](value[f.name]) for f in fields(SynthDecl) if f.name in value})


@dataclass(frozen=True)
class EngineDecl:
    """One declared engine: a command (llama-server ARGS...) or a synthetic engine. Each field's
    `parse` (metadata) checks its `[[engine]]` value; parse_engine checks the whole."""

    name: str = field(metadata={"parse": check_name})
    weight: float = field(default=1.0, metadata={"parse": _toml_weight})
    command: tuple[str, ...] = field(default=(), metadata={"parse": _toml_command})
    synth: SynthDecl | None = field(default=None, metadata={"parse": _toml_synth})
    restart: str = field(default="on-failure", metadata={"parse": _toml_restart})
    env: tuple[tuple[str, str], ...] = field(default=(), metadata={"parse": _toml_env})
    gpu_key: str | None = field(default=None, metadata={"parse": check_gpu_key})
    gpu: int | None = field(default=None, metadata={"parse": check_gpu})
    load_timeout_s: float = field(default=600.0, metadata={"parse": check_load_timeout})

    def same_but_weight(self, other: EngineDecl) -> bool:
        """Whether `other` differs from this at most in its weight (a live re-weight, no restart)."""
        return replace(self, weight=other.weight) == other


ENGINE_KEYS = tuple(f.name for f in fields(EngineDecl))


def parse_engine(table: Mapping[str, object], *, cwd: str) -> EngineDecl:
    """An `[[engine]]` table checked in full (its command's program and model relative to `cwd`,
    the program looked up on its env's PATH); DeclarationError for the first problem."""
    unknown = next((k for k in table if k not in ENGINE_KEYS), None)
    if unknown is not None:
        raise DeclarationError(unknown, None, f"unknown key (known: {', '.join(ENGINE_KEYS)})")
    if "name" not in table:
        raise DeclarationError("name", None, "missing (every engine needs a unique name)")
    decl = EngineDecl(**{f.name: f.metadata["parse"](table[f.name]) for f in fields(EngineDecl) if f.name in table})
    if decl.gpu_key is not None and decl.gpu is not None:
        raise DeclarationError("gpu", None, "give gpu_key or gpu, not both")
    if decl.command and decl.synth is not None:
        raise DeclarationError("synth", None, "give command or synth, not both")
    if not decl.command and decl.synth is None:
        raise DeclarationError("command", None, "missing (or give synth = { step_ms = 5 } for a synthetic engine)")
    if decl.command:
        check_command(decl.command, cwd=cwd, path=dict(decl.env).get("PATH"))
    return decl
