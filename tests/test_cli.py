"""The command line's own plumbing: the headless recogniser, exit codes and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import typer
import typer.main

from gpushare_tui.cli import main
from gpushare_tui.cli.engines import NO_ENGINE
from gpushare_tui.cli.once import headless_args
from gpushare_tui.core.registry.abi import WEIGHT_RULE
from testkit.cli import run_cli
from testkit.shm import shm_file


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--once"], (None, False)),
        (["--json", "--once"], (None, True)),
        (["--once", "--gpu-key", "k", "--json"], ("k", True)),
        (["--once", "--gpu-key=k"], ("k", False)),
        (["--once", "--gpu-key", "a", "--gpu-key", "b"], ("b", False)),  # the last wins, as in click
        (["--once", "--gpu-key", "--json"], ("--json", False)),  # the next word is the value, as in click
        (["--once", "--gpu-key="], ("", False)),
        (["--gpu-key", "--once"], None),  # "--once" is the key here: not a snapshot
        (["--once", "--gpu-key"], None),  # a missing value: typer's error
        (["--once", "--interval", "1"], None),
        (["--once", "-h"], None),
        (["--once", "synth"], None),
        (["--json"], None),
        ([], None),
    ],
)
def test_headless_args(argv: list[str], expected: tuple | None) -> None:
    assert headless_args(argv) == expected


@pytest.mark.parametrize(
    "argv, fragment, sub",
    [
        (["weight", "1"], "missing argument 'value'", "weight "),
        (["synth", "--gpu-key", "k", "--bogus"], "no such option: --bogus", "synth "),
        (["status", "1", "--bogus"], "no such option", "status "),
        (["no-such-command"], "no such command 'no-such-command'", ""),
        (["--once", "--gpu-key"], "'--gpu-key' requires an argument", ""),
    ],
)
def test_typer_errors_are_one_line_and_exit_2(argv: list[str], fragment: str, sub: str, capsys) -> None:
    """typer's own parse errors (their wording is click's, and varies between versions)."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert out == "" and line.startswith("gpushare-tui: ") and fragment in line.lower()
    assert line.endswith(f" (see: gpushare-tui {sub}--help)")


BAD_KEY = "invalid gpu key '../x': use 1..64 characters of [A-Za-z0-9._-]"


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--once", "--gpu-key", "../x"], BAD_KEY),  # the headless path
        (["--once", "--interval", "0.1", "--gpu-key", "../x"], BAD_KEY),  # typer's path, the same line
        (["--json"], "--json needs --once"),
        (["--interval", "0.1"], "invalid --interval 0.1: at least 0.2 seconds"),
        (["demo", "--interval", "nan"], "invalid --interval nan: at least 0.2 seconds"),
        (["synth", "--weight", "0", "--gpu-key", "k"], f"invalid weight '0': {WEIGHT_RULE}"),
        (["weight", "1", "-1"], f"invalid weight '-1': {WEIGHT_RULE}"),  # a value, not an option
        (["weight", "1", "-inf"], f"invalid weight '-inf': {WEIGHT_RULE}"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(argv: list[str], line: str, capsys) -> None:
    assert main(argv) == 2
    assert capsys.readouterr() == ("", f"gpushare-tui: {line}\n")


def test_runtime_error_exits_1(capsys, runtime_dir: str) -> None:
    assert main(["status", "4000999"]) == 1
    assert capsys.readouterr().err.splitlines() == ["gpushare-tui: no process 4000999"]


def test_version(capsys) -> None:
    from gpushare_tui import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr() == (f"gpushare-tui {__version__}\n", "")


@pytest.mark.slow
def test_version_and_completion_in_a_real_process() -> None:
    from gpushare_tui import __version__

    for flag in ("-V", "--version"):
        r = run_cli(flag)
        assert (r.returncode, r.stdout, r.stderr) == (0, f"gpushare-tui {__version__}\n", "")
    r = run_cli("--help")
    assert all(f in r.stdout for f in ("-V, --version", "--install-completion", "--show-completion")), r.stdout
    r = run_cli("--show-completion", "bash", env={**os.environ, "SHELL": "/bin/bash"})
    assert r.returncode == 0 and "complete " in r.stdout, r.stderr
    # what the shell's completion function runs (the console script's name picks the variable)
    env = {**os.environ, "_GPUSHARE_TUI_COMPLETE": "complete_bash", "COMP_WORDS": "gpushare-tui st", "COMP_CWORD": "1"}
    as_console_script = (
        "import sys; from gpushare_tui.cli import entrypoint; sys.argv[0] = 'gpushare-tui'; entrypoint()"
    )
    r = subprocess.run([sys.executable, "-c", as_console_script], capture_output=True, text=True, env=env, timeout=60)
    assert r.stdout.split() == ["status", "stop"], (r.stdout, r.stderr)


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_once_filter_matching_nothing_is_an_error(extra: list[str], gpu_key: str, capsys) -> None:
    """A typo in --gpu-key must not look like success (an empty table, exit 0)."""
    assert main(["--once", "--gpu-key", gpu_key, *extra]) == 1
    assert capsys.readouterr() == ("", f"gpushare-tui: no segment /opencoti-gpu-{gpu_key} on this host\n")


def test_status_of_a_process_that_is_no_peer(capsys, runtime_dir: str) -> None:
    """PID 1 exists but holds no registry slot: not "a foreign peer"."""
    assert main(["status", "1"]) == 1
    assert capsys.readouterr().err == (
        "gpushare-tui: process 1 is not a gpushare-tui engine (no registry slot, no control socket)\n"
    )


def test_json_commands_print_json_on_failure(capsys, runtime_dir: str) -> None:
    assert main(["status", "4000999", "--json"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {"ok": False, "error": "no process 4000999"}
    assert err == "gpushare-tui: no process 4000999\n"
    assert main(["launch", "--json", "--gpu-key", "k"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out) == {"ok": False, "error": NO_ENGINE} and err == f"gpushare-tui: {NO_ENGINE}\n"
    assert main(["launch", "--json", "--weight", "0", "--gpu-key", "k", "--", "x"]) == 2
    assert json.loads(capsys.readouterr().out)["ok"] is False


def test_every_option_has_help() -> None:
    from gpushare_tui.cli.typer_app import app

    top = typer.main.get_command(app)
    missing = [
        f"{cmd.name} {p.opts[0] if p.opts else p.name}"
        for cmd in [top, *top.commands.values()]
        for p in cmd.params
        if not getattr(p, "hidden", False) and not getattr(p, "help", None) and p.name != "help"
    ]
    assert missing == []


@pytest.mark.parametrize("command", ["run", "launch"])
def test_engine_commands_usage_shows_the_engine_command_line(command: str, capsys) -> None:
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert f" {command} [OPTIONS] [--] COMMAND [ARGS]..." in out
    assert "--weight NUMBER" in out and "<str>" not in out.split("--weight")[1].split("\n")[0]


def test_help_comes_from_typer(capsys) -> None:
    assert main(["--once", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--once" in out and "synth" in out and "Exit codes: 0 ok, 1 runtime error, 2 usage error, 128+N" in out


@pytest.mark.parametrize("command", [[], ["synth"], ["run"], ["launch"], ["weight"], ["demo"], ["serve"], ["up"]])
def test_help_shows_no_type_beside_flags(command: list[str], capsys) -> None:
    """A flag takes no value: its help line names no type (typer's rich panels drew `<bool>`)."""
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "-h, --help" in out and "<bool>" not in out and "list[" not in out


@pytest.fixture
def engine_declared(tmp_path, monkeypatch) -> tuple[str, str]:
    """(a llama-server on PATH that leaves a marker file if it is ever started, a readable model):
    a declaration valid but for what a test adds. Logs go under tmp_path."""
    bin_dir, marker = tmp_path / "bin", tmp_path / "engine-started"
    bin_dir.mkdir()
    engine = bin_dir / "llama-server"
    engine.write_text(f"#!/bin/sh\ntouch {marker}\nsleep 30\n")
    engine.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return str(marker), str(model)


@pytest.mark.parametrize(
    "command, port",
    [("run", "99999"), ("run", "0"), ("run", "-1"), ("run", "abc"), ("run", "65536"), ("launch", "99999")],
)
@pytest.mark.parametrize("spelled", ["--port P", "--port=P"])
def test_engine_port_out_of_range_is_one_line_exit_2(
    command: str, port: str, spelled: str, engine_declared, gpu_key: str, runtime_dir: str, tmp_path, cli
) -> None:
    """The port of the engine's own command line is checked (1..65535) before anything starts:
    one line and exit 2, not a traceback from binding it."""
    marker, model = engine_declared
    port_args = spelled.replace("P", port).split(" ")
    r = cli(command, "--gpu-key", gpu_key, "--", "llama-server", "-m", model, *port_args, timeout=60)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.splitlines() == [f"gpushare-tui: invalid --port {port!r}: must be 1..65535"]
    assert not os.path.exists(marker) and not os.path.exists(shm_file(gpu_key))
    assert not (tmp_path / "state").exists()  # no supervisor (launch) nor engine log (run) was begun


@pytest.mark.parametrize(
    "args, line",
    [
        (["--", "./no-such-engine", "-m", "{model}"], "invalid engine binary './no-such-engine': no such file"),
        (["--", "llama-server", "-m", "missing.gguf"], "invalid model 'missing.gguf': no such file"),
        (["--name", "n" * 49, "--", "llama-server", "-m", "{model}"], "invalid --name 'nnn"),
        (["--name", "a\tb", "--", "llama-server", "-m", "{model}"], "invalid --name 'a\\tb': must not contain control"),
        (["--load-timeout", "nan", "--", "llama-server", "-m", "{model}"], "invalid --load-timeout nan: must be"),
    ],
    ids=["binary", "model", "name-long", "name-control", "load-timeout"],
)
@pytest.mark.parametrize("command", ["run", "launch"])
def test_engine_declaration_errors_are_one_line_exit_2(
    command: str, args: list[str], line: str, engine_declared, gpu_key: str, runtime_dir: str, tmp_path, cli
) -> None:
    """run and launch check the whole declaration (core/engines/declaration.py) before anything is started."""
    marker, model = engine_declared
    r = cli(command, "--gpu-key", gpu_key, *(a.replace("{model}", model) for a in args), cwd=tmp_path, timeout=60)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith(f"gpushare-tui: {line}"), r.stderr
    assert not os.path.exists(marker) and not os.path.exists(shm_file(gpu_key))


@pytest.mark.parametrize("on_terminal, waiting", [(True, ["5", "10"]), (False, [])])
def test_wait_progress_cadence(on_terminal: bool, waiting: list[str], capsys) -> None:
    from gpushare_tui.cli.common import WaitProgress

    progress = WaitProgress(on_terminal=on_terminal, every_s=5.0)
    for waited_s in (0.0, 1.0, 4.9, 5.0, 5.1, 9.9, 10.2, 12.0):
        progress("llama-server /health on 127.0.0.1:8080", waited_s, 600.0, False)
    progress("llama-server /health on 127.0.0.1:8080", 12.34, 600.0, True)
    out, err = capsys.readouterr()
    expected = [f"gpushare-tui: waiting for llama-server /health on 127.0.0.1:8080 ({s} s of 600 s)" for s in waiting]
    expected.append("gpushare-tui: ready after 12.3 s (waited for llama-server /health on 127.0.0.1:8080)")
    assert (out, err.splitlines()) == ("", expected)


def test_signal_lateness_text() -> None:
    from gpushare_tui.cli.control_cmds import lateness_text

    assert lateness_text({"n": 123, "p50_us": 300, "p99_us": 1200, "max_us": 4000}) == (
        "p50 0.3 ms, p99 1.2 ms, max 4 ms (n=123)"
    )
    assert lateness_text({"n": 0, "p50_us": None, "p99_us": None, "max_us": None}) == (
        "none measured yet (n=0: measured each time the engine is paused for a peer; alone or idle it never is)"
    )
    assert lateness_text({"n": 9, "p50_us": 12_345_678}) == "p50 12346 ms (n=9)"


@pytest.mark.parametrize(("raised", "code"), [(SystemExit(128 + 15), 143), (KeyboardInterrupt(), 130)])
def test_a_signal_the_interpreter_wrapped_ends_the_start_up_in_order(raised, code, monkeypatch, capsys) -> None:
    """A termination signal during start-up raises the guard's SystemExit (SIGINT: KeyboardInterrupt) wherever the
    main thread is; inside an import that defines a class, Python 3.11 wraps it ("RuntimeError: Error calling
    __set_name__"): seen once as a traceback when a SIGTERM landed in pydantic's import under typer. It is still
    that signal: its exit code, nothing on stderr."""
    import gpushare_tui.cli.typer_app as typer_app

    def interrupted(argv: list[str]) -> int:
        try:
            raise raised
        except BaseException as e:
            raise RuntimeError("Error calling __set_name__ on 'cached_property' instance 'data'") from e

    monkeypatch.setattr(typer_app, "run_app", interrupted)
    assert main(["status", "x"]) == code
    assert capsys.readouterr().err == ""


def test_an_error_not_raised_from_a_signal_still_fails_loudly(monkeypatch) -> None:
    import gpushare_tui.cli.typer_app as typer_app

    def broken(argv: list[str]) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(typer_app, "run_app", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["status", "x"])


_SWALLOWED = """
import os, signal
from gpushare_tui.core.host import lifecycle

lifecycle.guard_startup()


class Field:
    def __set_name__(self, owner, name):
        os.kill(os.getpid(), signal.SIGTERM)  # the guard's SystemExit, raised in here: Python wraps it


try:  # a library's import fallback, as some do: the wrapped SystemExit goes no further
    class Model:
        data = Field()
except Exception:
    pass
termination = lifecycle.Termination()
lifecycle.on_signals(termination)  # the command's own handler: it is told of the signal the guard raised for
print(termination.event.is_set(), termination.signum, flush=True)
"""


def test_a_signal_whose_exit_a_library_swallowed_reaches_the_commands_handler() -> None:
    """A SIGTERM right after the start-up guard raised its SystemExit inside an import whose `except Exception`
    fallback swallowed it (Python 3.11 wraps it in a RuntimeError there): `run` started and served on, told to stop
    by nobody (test_signals_startup: "still running 40 s after the signal"). The command's own handler is given
    that signal as it is installed: its loop ends as for a signal that came then."""
    out = subprocess.run([sys.executable, "-c", _SWALLOWED], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["True", "15"], (out.stdout, out.stderr)


_UNRAISABLE = """
import os, signal, weakref
from gpushare_tui.core.host import lifecycle

lifecycle.guard_startup()


class Module:
    pass


def dropped(_ref):  # as importlib's module-lock callback: what it raises, Python prints and drops
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):  # the handler runs here, inside the callback
        pass


m = Module()
ref = weakref.ref(m, dropped)
del m
termination = lifecycle.Termination()
lifecycle.on_signals(termination)
print(termination.event.is_set(), termination.signum, flush=True)
"""


def test_a_signal_whose_exit_python_could_not_raise_prints_nothing_and_reaches_the_handler() -> None:
    """The guard's SystemExit raised inside a weakref callback (importlib's module lock, during an import: seen
    under `serve`) is one Python prints as "Exception ignored in" with a traceback, and drops: nothing is printed
    now, and the command's own handler gets the signal as it is installed."""
    out = subprocess.run([sys.executable, "-c", _UNRAISABLE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["True", "15"] and out.stderr == "", (out.stdout, out.stderr)
