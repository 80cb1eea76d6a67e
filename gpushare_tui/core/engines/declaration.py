"""An engine declaration and the one validator of what a user declares: `up`'s `[[engine]]` tables,
the dashboard's launch form, `run`/`launch` and `synth` all check here, and each only maps a
DeclarationError to its own form (file:line, an inline field message, one line on stderr).

The `[[engine]]` keys are EngineDecl's fields, each parsed by the function in its metadata: the
declaration that parses is the one that validates."""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

from ..host.errors import UsageError
from ..host.text import printable
from ..pacing.governor import GovernorBounds, GovernorConfigError, SloTarget
from ..registry import abi
from .kinds import (
    ACTIVITY_SOURCES,
    COMMAND,
    FORM_KINDS,
    LLAMA_SERVER,
    PRESETS,
    SUPERVISED_KINDS,
    SYNTH,
    SYNTH_STEP_MS_DEFAULT,
    command_kind,
    is_llama_server,
    kind,
    kind_named,
)

RESTART_POLICIES = ("always", "on-failure", "never")
LATENCY_CLASSES = abi.LATENCY_CLASSES
MODEL_FLAGS = ("-m", "--model")
PORT_FLAG = "--port"
STEP_MS_MIN, STEP_MS_MAX = 0.05, 10_000.0
_LABELS = {"binary": "engine binary", "model": "model", "port": PORT_FLAG}


class DeclarationError(UsageError, ValueError):
    """One invalid value. `field`: the declaration's field (an `[[engine]]` key); `part`: what in it
    (`binary`, `model` or `port` of a command, `step_ms` of synth; else the field); `label`: how a
    person names it; `value`: what was given (None: nothing); `problem`: what is wrong with it; `subkey`: the key
    of a table's value the problem is about where `part` does not say it (slo's `weight_max`: the launch form
    shows it there). `str(e)`, the command line's form: `invalid LABEL 'VALUE': PROBLEM`."""

    def __init__(
        self,
        field: str,
        value: object,
        problem: str,
        *,
        part: str | None = None,
        label: str | None = None,
        subkey: str | None = None,
    ) -> None:
        self.field, self.value, self.problem, self.subkey = field, value, problem, subkey
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
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON's "\\udcff", or argv's undecodable byte
        raise DeclarationError("name", name, "must be valid UTF-8 text", label=label) from None
    if len(encoded) > abi.NAME_BYTES:
        raise DeclarationError("name", name, f"must be at most {abi.NAME_BYTES} bytes (UTF-8)", label=label)
    if printable(name) != name:  # what a view would replace, refused in our own names at once
        raise DeclarationError("name", name, "must not contain control or format characters", label=label)
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


def check_class(value: object, *, label: str = "class") -> str:
    """A latency class (spec §7): "interactive" (runs first, within its weight share) or "batch"."""
    try:
        return abi.validate_class(value, label=label)
    except abi.BadClassError:
        raise DeclarationError("class", value, f"must be one of {', '.join(LATENCY_CLASSES)}", label=label) from None


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
    """Every problem of an engine's command line: its program, its model (llama-server's -m/--model,
    when given) and its --port (when given); [] when it may be started."""
    checks: list[Callable[[], object]] = [lambda: check_binary(argv[0] if argv else "", cwd=cwd, path=path)]
    model = flag_value(argv, *MODEL_FLAGS) if is_llama_server(argv) else None  # `python -m MODULE` is no model
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
    *, weight: str | float, name: str, step_ms: str | float, work_units: str | int | None
) -> list[DeclarationError]:
    """Every problem of a synthetic engine to start from here (the launch form, its values as typed:
    text that is a number is that number; `work_units` empty or None: step_ms's), in the order of its fields."""
    checks: list[Callable[[], object]] = [
        lambda: check_name(name),
        lambda: check_weight(weight),
        lambda: check_step_ms(_typed(step_ms, float)),
    ]
    if work_units not in ("", None):
        checks.append(lambda: check_work_units(_typed(work_units, int)))
    return _problems(checks)


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


# -- a latency target and the governor's bounds (`slo = {...}`, run/launch's --slo-* options) -------------------


@dataclass(frozen=True)
class SloDecl:
    """An engine's latency target (p99s in ms; at least one) and the bounds its governor may use (None: the
    default, from the engine's weight: core/pacing/governor.py default_bounds)."""

    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    weight_min: float | None = None
    weight_max: float | None = None
    classes: tuple[str, ...] | None = None

    def run_options(self) -> dict[str, object]:
        """`run`'s --slo-* options for it (spawn.gpushare_argv's keys; None: not given)."""
        return {
            "slo_ttft_p99_ms": self.ttft_p99_ms,
            "slo_itl_p99_ms": self.itl_p99_ms,
            "slo_weight_min": self.weight_min,
            "slo_weight_max": self.weight_max,
            "slo_classes": ",".join(self.classes) if self.classes is not None else None,
        }

    def governed(self, weight: float) -> tuple[SloTarget, GovernorBounds]:
        """The target and the bounds for an engine of `weight` (the declaration was checked: check_slo)."""
        wmin = self.weight_min if self.weight_min is not None else min(weight, self.weight_max or weight)
        wmax = self.weight_max if self.weight_max is not None else max(wmin, min(3e38, weight * 8.0))
        return SloTarget(self.ttft_p99_ms, self.itl_p99_ms), GovernorBounds(wmin, wmax, self.classes or CLASSES_UP)


SLO_KEYS = tuple(f.name for f in fields(SloDecl))
CLASSES_UP = ("batch", "interactive")  # the governor's ladder, least GPU first (governor.CLASS_ORDER)


def check_slo(
    ttft_p99_ms: object = None,
    itl_p99_ms: object = None,
    weight_min: object = None,
    weight_max: object = None,
    classes: object = None,
) -> SloDecl | None:
    """The checked declaration (None when nothing is given); DeclarationError (field `slo`) for the first problem:
    a p99 or a weight that is no number > 0, neither p99 given, bounds the wrong way round, an unknown class.
    `classes`: a list of class names, or their text comma-separated."""
    given = (ttft_p99_ms, itl_p99_ms, weight_min, weight_max, classes)
    if all(v is None for v in given):
        return None
    nums: dict[str, float | None] = {}
    for name, v in zip(SLO_KEYS, given[:4]):
        v = _typed(v, float)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < 3.4e38):
            raise DeclarationError("slo", v, "must be a number > 0", part=name, label=f"slo {name}")
        nums[name] = None if v is None else float(v)
    if isinstance(classes, str):
        classes = [c.strip() for c in classes.split(",")]
    if classes is not None and (not isinstance(classes, list | tuple) or not all(isinstance(c, str) for c in classes)):
        raise DeclarationError(
            "slo", None, 'classes: a list of class names, e.g. ["batch", "interactive"]', subkey="classes"
        )
    decl = SloDecl(**nums, classes=tuple(classes) if classes is not None else None)
    try:
        decl.governed(decl.weight_min or 1.0)
    except GovernorConfigError as e:
        raise DeclarationError("slo", None, str(e), subkey=e.field) from None
    return decl


def _toml_slo(value: object) -> SloDecl | None:
    if not isinstance(value, dict):
        raise DeclarationError("slo", None, "must be a table, e.g. slo = { ttft_p99_ms = 300 }")
    _known(value, SLO_KEYS, "slo")
    if "ttft_p99_ms" not in value and "itl_p99_ms" not in value:
        raise DeclarationError("slo", None, "needs ttft_p99_ms or itl_p99_ms, e.g. slo = { ttft_p99_ms = 300 }")
    for k in ("ttft_p99_ms", "itl_p99_ms", "weight_min", "weight_max"):
        if isinstance(value.get(k), str):  # a TOML number is a number: "300" is a mistake to say
            raise DeclarationError("slo", value[k], "must be a number > 0", part=k, label=f"slo {k}")
    return check_slo(*(value.get(k) for k in SLO_KEYS))


HEALTH_KINDS = ("http", "tcp", "log", "none")


@dataclass(frozen=True)
class ActivitySpec:
    """What "this engine is working now" means for the supervisor (core/engines/activity/ implements each
    `source`): `llama` (its /metrics and /slots), `metrics` (the Prometheus gauge `gauge` at
    `metrics_url` counts work in flight), `cpu` (the process tree uses >= `cpu_cores` cores; None:
    the source's default), `gpu` (NVML per-process utilisation of the tree), `always` (working while it runs)."""

    source: str = "llama"
    metrics_url: str | None = None
    gauge: str | None = None
    cpu_cores: float | None = None


@dataclass(frozen=True)
class HealthSpec:
    """When a started engine is ready: `http` (GET `url` answers 200), `tcp` (`port` accepts a
    connection), `log` (a line of its log matches `log_regex`), `none` (at once)."""

    kind: str = "http"
    url: str | None = None
    port: int | None = None
    log_regex: str | None = None


ACTIVITY_CHOICES = (*ACTIVITY_SOURCES, *PRESETS)  # a source, or a kind's preset (core/engines/kinds.py)


def check_activity(spec: ActivitySpec) -> ActivitySpec:
    """`spec` if complete and valid, else a DeclarationError on field `activity` (one line)."""
    if spec.source not in ACTIVITY_SOURCES:
        raise DeclarationError("activity", spec.source, f"must be one of {', '.join(ACTIVITY_CHOICES)}")
    if spec.source == "metrics":
        if not spec.metrics_url or not spec.metrics_url.startswith(("http://", "https://")):
            raise DeclarationError("activity", spec.metrics_url, "needs a metrics URL (http://HOST:PORT/metrics)")
        if not spec.gauge:
            raise DeclarationError("activity", None, "needs the gauge that counts work in flight (a metric name)")
    if spec.cpu_cores is not None and not (math.isfinite(spec.cpu_cores) and spec.cpu_cores > 0):
        raise DeclarationError("activity", spec.cpu_cores, "cpu_cores must be a number of cores > 0")
    return spec


def check_health(spec: HealthSpec) -> HealthSpec:
    """`spec` if complete and valid, else a DeclarationError on field `health` (one line)."""
    if spec.kind not in HEALTH_KINDS:
        raise DeclarationError("health", spec.kind, f"must be one of {', '.join(HEALTH_KINDS)}")
    if spec.kind == "http" and spec.url is not None and not spec.url.startswith(("http://", "https://")):
        raise DeclarationError("health", spec.url, "must be an http:// or https:// URL")
    if spec.kind == "tcp" and not (isinstance(spec.port, int) and 1 <= spec.port <= 65535):
        raise DeclarationError("health", spec.port, "needs a TCP port 1..65535")
    if spec.kind == "log":
        if not spec.log_regex:
            raise DeclarationError("health", spec.log_regex, "needs a regular expression for the ready line")
        try:
            re.compile(spec.log_regex)
        except re.error as e:
            raise DeclarationError("health", spec.log_regex, f"is not a valid regular expression ({e})") from None
    return spec


# -- what an engine's command and its `run`/`launch` options declare (issue 19) ----------------------


@dataclass(frozen=True)
class SourceOptions:
    """The activity and health options of `run`/`launch` as given (None/False: not given); `up`
    maps its `activity`/`health` keys to these, and spawn.run_argv writes them on `run`'s line."""

    activity: str | None = None
    metrics_url: str | None = None
    gauge: str | None = None
    cpu_cores: float | None = None
    health_url: str | None = None
    health_port: int | None = None
    health_log: str | None = None
    no_health: bool = False


@dataclass(frozen=True)
class EngineSources:
    """What an engine declares once resolved: its kind, activity and health sources (complete,
    checked), and its port where known. A llama-server's URLs are None: they are on the port the
    supervisor gives it (its /metrics, its /health)."""

    kind: str
    activity: ActivitySpec
    health: HealthSpec
    port: int | None


def resolve_sources(command: Sequence[str], options: SourceOptions = SourceOptions()) -> EngineSources:
    """The one resolution of `run`/`launch`/`up` options and an engine's command into (kind, activity,
    health, port); DeclarationError (field `activity` or `health`) for what is wrong.

    Kind: llama-server when the program is, or with `--activity llama` (whose /metrics is probed on
    the port it is given: --port/--host/--metrics/--slots are added to llama-server's command only);
    vllm/sglang/tgi with that preset, or when the command runs one; else `command`. Activity (default:
    llama for llama-server, else cpu; `--metrics-url`/`--gauge` alone mean metrics): a preset is the
    metrics source with its gauge at http://127.0.0.1:PORT/metrics, PORT the command's --port, else
    its kind's default_port (core/engines/kinds.py). Health (default: llama-server's /health; vllm, sglang,
    tgi: http://127.0.0.1:PORT/health; a command: none) is overridden by one of --health-url,
    --health-port, --health-log, --no-health."""
    o = options
    choice = o.activity
    if choice is None:
        choice = "metrics" if (o.metrics_url or o.gauge) else ("llama" if is_llama_server(command) else "cpu")
    if choice not in ACTIVITY_CHOICES:
        check_activity(ActivitySpec(source=choice))  # raises: the one message naming the choices
    k = kind(LLAMA_SERVER if choice == "llama" else choice if choice in PRESETS else command_kind(command))
    port = None if k.rewrites_command else engine_port(command)
    if port is None:
        port = k.default_port
    _check_pairs(choice, bool(o.metrics_url or o.gauge), o.cpu_cores, RUN_WORDS)
    if choice in PRESETS:
        url = o.metrics_url or f"http://127.0.0.1:{port}/metrics"
        activity = ActivitySpec("metrics", url, o.gauge or k.gauge, o.cpu_cores)
    else:
        activity = ActivitySpec(choice, o.metrics_url, o.gauge, o.cpu_cores)
    return EngineSources(k.key, check_activity(activity), check_health(_health(k.key, port, o)), port)


@dataclass(frozen=True)
class _Words:
    """How a surface names the activity options: `run`'s flags or the `[[engine]]` table's keys."""

    metrics: str
    cpu_cores: str
    source: str


RUN_WORDS = _Words("--metrics-url and --gauge", "--cpu-cores", "--activity")
TOML_WORDS = _Words("metrics_url and gauge", "cpu_cores", "source")


def _check_pairs(source: str, has_metrics: bool, cpu_cores: object, words: _Words) -> None:
    """The activity options that go only with some source (the one rule for `run`'s flags and `up`'s keys)."""
    if has_metrics and source != "metrics" and source not in PRESETS:
        presets = ", ".join(PRESETS)
        raise DeclarationError("activity", source, f"{words.metrics} go with {words.source} metrics (or {presets})")
    if cpu_cores is not None and source not in ("cpu", "llama"):
        raise DeclarationError("activity", cpu_cores, f"{words.cpu_cores} goes with {words.source} cpu (not {source})")


def _health(kind_key: str, port: int | None, o: SourceOptions) -> HealthSpec:
    given = [
        HealthSpec("http", url=o.health_url) if o.health_url is not None else None,
        HealthSpec("tcp", port=o.health_port) if o.health_port is not None else None,
        HealthSpec("log", log_regex=o.health_log) if o.health_log is not None else None,
        HealthSpec("none") if o.no_health else None,
    ]
    chosen = [h for h in given if h is not None]
    if len(chosen) > 1:
        raise DeclarationError("health", None, "give one of --health-url, --health-port, --health-log, --no-health")
    if chosen:
        return chosen[0]
    k = kind(kind_key)
    if k.rewrites_command:
        return HealthSpec("http")  # its /health, on the port it is given
    if k.own_health:
        return HealthSpec("http", url=f"http://127.0.0.1:{port}/health")
    return HealthSpec("none")


@dataclass(frozen=True)
class SynthDecl:
    """A synthetic engine's work (`synth = { step_ms = 5 }`)."""

    step_ms: float = field(default=SYNTH_STEP_MS_DEFAULT, metadata={"parse": check_step_ms})
    # None: step_ms at the reference rate (the same work in every process); 0: calibrated to step_ms here
    work_units: int | None = field(default=None, metadata={"parse": check_work_units})


SYNTH_KEYS = tuple(f.name for f in fields(SynthDecl))


def _toml_synth(value: object) -> SynthDecl:
    if not isinstance(value, dict):
        raise DeclarationError("synth", None, "must be a table, e.g. synth = { step_ms = 5 }")
    _known(value, SYNTH_KEYS, "synth")
    return SynthDecl(**{f.name: f.metadata["parse"](value[f.name]) for f in fields(SynthDecl) if f.name in value})


# -- `up`'s kind, activity and health keys (issue 19): checked here, passed to `run` as its options --------

ACTIVITY_KEYS = ("source", "metrics_url", "gauge", "cpu_cores")
HEALTH_KEYS = ("url", "port", "log")
_HEALTH_EXAMPLES = {"tcp": "health = { port = 8080 }", "log": 'health = { log = "ready" }'}


def _toml_kind(value: object) -> str:
    if value not in SUPERVISED_KINDS:
        raise DeclarationError("kind", value, f"must be one of {', '.join(SUPERVISED_KINDS)}")
    return str(value)


def _toml_activity(value: object) -> ActivitySpec:
    """`activity = "cpu"` (a source or preset name) or a table `{ source, metrics_url, gauge, cpu_cores }`
    (source defaults to metrics when metrics_url or gauge is given): the declaration as written, whose
    `source` may be a preset (vllm, sglang, tgi: the metrics source with that gauge, at the command's
    port; `run --activity PRESET` resolves it), checked as `run` checks its options."""
    if isinstance(value, str):
        value = {"source": value}
    if not isinstance(value, dict):
        raise DeclarationError("activity", None, 'must be a source name or a table, e.g. activity = "cpu"')
    _known(value, ACTIVITY_KEYS, "activity")
    source = value.get("source", "metrics" if ("metrics_url" in value or "gauge" in value) else None)
    url, gauge, cores = value.get("metrics_url"), value.get("gauge"), value.get("cpu_cores")
    if source is None:
        raise DeclarationError("activity", None, f"needs a source ({', '.join(ACTIVITY_CHOICES)})")
    if not isinstance(source, str) or source not in ACTIVITY_CHOICES:
        raise DeclarationError("activity", source, f"must be one of {', '.join(ACTIVITY_CHOICES)}")
    for key, v in (("metrics_url", url), ("gauge", gauge)):
        if v is not None and not isinstance(v, str):
            raise DeclarationError("activity", v, f"{key} must be a string")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int | float)):
        raise DeclarationError("activity", cores, "cpu_cores must be a number of cores > 0")
    spec = ActivitySpec(source, url, gauge, None if cores is None else float(cores))
    _check_pairs(source, url is not None or gauge is not None, cores, TOML_WORDS)
    if source in PRESETS:  # its URL is known once the command's port is; check the rest now
        check_activity(
            replace(spec, source="metrics", metrics_url=url or "http://127.0.0.1/metrics", gauge=gauge or "-")
        )
        return spec
    return check_activity(spec)


def _toml_health(value: object) -> HealthSpec:
    """`health = "none"`, `"http"` (the kind's own /health: llama-server, vllm, sglang, tgi) or one of
    `{ url = "http://..." }` (ready on 200), `{ port = N }` (accepts a TCP connection), `{ log = "REGEX" }`."""
    if value == "none":
        return HealthSpec("none")
    if value == "http":
        return HealthSpec("http")
    if isinstance(value, str) and value in _HEALTH_EXAMPLES:
        raise DeclarationError("health", value, "needs its value: " + _HEALTH_EXAMPLES[value])
    if not isinstance(value, dict):
        given = value if isinstance(value, str) else None
        raise DeclarationError("health", given, 'must be "none", "http" or { url = ... }, { port = N }, { log = ... }')
    _known(value, HEALTH_KEYS, "health")
    if len(value) != 1:
        raise DeclarationError("health", None, "give one of url, port, log")
    ((key, v),) = value.items()
    if key == "port":
        if isinstance(v, bool) or not isinstance(v, int):
            raise DeclarationError("health", v, "needs a TCP port 1..65535")
        return check_health(HealthSpec("tcp", port=v))
    if not isinstance(v, str):
        raise DeclarationError("health", v, f"{key} must be a string")
    return check_health(HealthSpec("http", url=v) if key == "url" else HealthSpec("log", log_regex=v))


def _known(table: Mapping[str, object], keys: Sequence[str], field_name: str | None = None) -> None:
    """A DeclarationError for the first key of `table` not among `keys`: on `field_name` (a table inside
    an `[[engine]]`), else on the unknown key itself (an `[[engine]]` key)."""
    unknown = next((k for k in table if k not in keys), None)
    if unknown is None:
        return
    known = f"(known: {', '.join(keys)})"
    if field_name is None:
        raise DeclarationError(unknown, None, f"unknown key {known}")
    raise DeclarationError(field_name, None, f"unknown key {unknown!r} {known}")


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
    # the `[[engine]]` key is `class` (a Python keyword: the field is `klass`)
    klass: str = field(default="batch", metadata={"parse": check_class, "key": "class"})
    kind: str | None = field(default=None, metadata={"parse": _toml_kind})  # None: derived (engine_kind)
    activity: ActivitySpec | None = field(default=None, metadata={"parse": _toml_activity})  # None: the kind's
    health: HealthSpec | None = field(default=None, metadata={"parse": _toml_health})  # None: the kind's
    slo: SloDecl | None = field(default=None, metadata={"parse": _toml_slo})  # a latency target (None: none)

    @property
    def engine_kind(self) -> str:
        """The declared kind, else the activity preset's, else what the command runs (command_kind)."""
        if self.synth is not None:
            return SYNTH
        if self.kind is not None:
            return self.kind
        if self.activity is not None and self.activity.source in PRESETS:
            return self.activity.source
        return (
            LLAMA_SERVER
            if self.activity is not None and self.activity.source == "llama"
            else command_kind(self.command)
        )

    def run_options(self) -> SourceOptions:
        """`run`'s activity and health options for this engine (names as SourceOptions' fields; None/False:
        not given, `run` derives it): the declared activity, else the declared kind's."""
        a, h = self.activity, self.health
        source = a.source if a is not None else (kind(self.kind).activity_choice if self.kind is not None else None)
        return SourceOptions(
            activity=source,
            metrics_url=a.metrics_url if a is not None else None,
            gauge=a.gauge if a is not None else None,
            cpu_cores=a.cpu_cores if a is not None else None,
            health_url=h.url if h is not None and h.kind == "http" else None,
            health_port=h.port if h is not None and h.kind == "tcp" else None,
            health_log=h.log_regex if h is not None and h.kind == "log" else None,
            no_health=h is not None and h.kind == "none",
        )

    def same_but_weight(self, other: EngineDecl) -> bool:
        """Whether `other` differs from this at most in its weight (a live re-weight, no restart)."""
        return replace(self, weight=other.weight) == other


def _key(f) -> str:
    """A field's `[[engine]]` key (its name, unless its metadata names another)."""
    return f.metadata.get("key", f.name)


ENGINE_KEYS = tuple(_key(f) for f in fields(EngineDecl))


def parse_engine(table: Mapping[str, object], *, cwd: str) -> EngineDecl:
    """An `[[engine]]` table checked in full (its command's program and model relative to `cwd`,
    the program looked up on its env's PATH); DeclarationError for the first problem."""
    _known(table, ENGINE_KEYS)
    if "name" not in table:
        raise DeclarationError("name", None, "missing (every engine needs a unique name)")
    decl = EngineDecl(**{f.name: f.metadata["parse"](table[_key(f)]) for f in fields(EngineDecl) if _key(f) in table})
    if decl.gpu_key is not None and decl.gpu is not None:
        raise DeclarationError("gpu", None, "give gpu_key or gpu, not both")
    if decl.command and decl.synth is not None:
        raise DeclarationError("synth", None, "give command or synth, not both")
    if not decl.command and decl.synth is None:
        raise DeclarationError("command", None, "missing (or give synth = { step_ms = 5 } for a synthetic engine)")
    if decl.command:
        check_command(decl.command, cwd=cwd, path=dict(decl.env).get("PATH"))
    _check_sources(decl)
    return decl


def _check_sources(decl: EngineDecl) -> None:
    """The kind, activity and health keys together (each alone is checked by its parse)."""
    declared = next((k for k in ("kind", "activity", "health", "slo") if getattr(decl, k) is not None), None)
    if decl.synth is not None:
        if declared is not None:
            raise DeclarationError(declared, None, "goes with command (a synthetic engine has its own)")
        return
    a, kind_key = decl.activity, decl.kind
    if a is not None and kind_key is not None:
        preset = a.source if a.source in PRESETS else None
        if (kind_key in PRESETS and preset not in (None, kind_key)) or (preset and kind_key != preset):
            raise DeclarationError("activity", a.source, f"is the preset of another kind than {kind_key!r}")
    h, resolved = decl.health, decl.engine_kind
    if h is not None and h.kind == "http" and h.url is None and not kind(resolved).own_health:
        raise DeclarationError(
            "health",
            "http",
            f'a {resolved} has no /health of its own: health = {{ url = "http://127.0.0.1:PORT/health" }}',
        )


def kind_engine(
    kind_key: str, values: Mapping[str, str], *, name: str, weight: float = 1.0, cwd: str | None = None
) -> EngineDecl:
    """The checked declaration of a kind whose form field is its `command` (vllm/sglang/tgi/command) from a
    form's values (its `command` split as a shell would; for `command`, its activity/metrics_url/gauge/
    health_url); DeclarationError (`.field`: command, activity or health) for the first problem.
    llama-server and synth have their own fields (the form builds those)."""
    k = kind_named(kind_key)
    if k is None or not k.supervised or k.rewrites_command:
        takes = ", ".join(f.key for f in FORM_KINDS if f.supervised and not f.rewrites_command)
        raise DeclarationError("kind", kind_key, f"kind_engine takes {takes}")
    try:
        argv = shlex.split(values.get("command", ""))
    except ValueError as e:
        raise DeclarationError("command", values.get("command"), f"cannot split: {e}") from None
    table: dict[str, object] = {"name": name, "weight": weight, "command": argv, "kind": k.key}
    if k.key == COMMAND:
        activity: dict[str, object] = {"source": values.get("activity") or "cpu"}
        activity |= {f: values[f] for f in ("metrics_url", "gauge") if values.get(f)}
        table["activity"] = activity
        table["health"] = {"url": values["health_url"]} if values.get("health_url") else "none"
    return parse_engine(table, cwd=cwd or ".")
