"""The command line as a newcomer meets it: the engine's command line is never taken for ours, an engine that
exits 0 succeeded, every bad value is answered in one style, hints name the surface that raised them, and `run`
and `launch` take one option set."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading

import pytest
import typer

from gpushare_tui.cli import engines
from gpushare_tui.cli.typer_app import app
from gpushare_tui.core.host.errors import Interrupted
from gpushare_tui.core.observe import gpu
from testkit.cli import run_cli, run_cli_here

NO_NVML = gpu._nvml() is None


def _log_of(stderr: str) -> str:
    """The engine log `run` names in its `starting PROGRAM (log PATH)` line."""
    m = re.search(r"starting \S+ \(log (.+)\)", stderr)
    assert m, stderr
    return m.group(1)


def _engine_output(stderr: str) -> str:
    """What the engine wrote to its log (the log's marks of each run's start left out)."""
    path = _log_of(stderr)
    try:
        with open(path) as f:
            return "".join(line for line in f if not re.match(r"--- gpushare-tui: .* ---$", line))
    finally:
        os.unlink(path)


# -- the engine's command line: everything from its program on is the engine's -----------------------------


def test_an_option_after_the_engines_program_is_the_engines(gpu_key) -> None:
    """`run ... echo hello --weight 5`: the engine prints `hello --weight 5` (the weight stays ours, 1); before,
    the engine printed `hello` and the weight became 5."""
    r = run_cli("run", "--weight", "1", "--gpu-key", gpu_key, "--no-health", "echo", "hello", "--weight", "5")
    assert r.returncode == 0, r.stderr
    assert _engine_output(r.stderr) == "hello --weight 5\n"
    assert "weight 5" not in r.stderr


def test_a_shell_commands_arguments_pass_through_untouched(gpu_key) -> None:
    """`sh -c '...' x --name foo --port 8080`: the engine gets `--name foo --port 8080` (before, --name was eaten)."""
    r = run_cli(
        "run", "--gpu-key", gpu_key, "--health-log", "never", "--load-timeout", "20",
        "sh", "-c", 'echo "$@"', "x", "--name", "foo", "--port", "8080",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert _engine_output(r.stderr) == "--name foo --port 8080\n"


def test_launch_without_the_separator_starts_the_command_as_given(gpu_key) -> None:
    """`launch ... sh -c 'sleep 30' x --name foo` (no `--`): started as given, its name the program's (`--name foo`
    was the engine's); stopped at once."""
    r = run_cli(
        "launch", "--json", "--gpu-key", gpu_key, "--no-health", "--load-timeout", "30",
        "sh", "-c", "sleep 30", "x", "--name", "foo",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    reply = json.loads(r.stdout)
    try:
        status = run_cli_here("status", str(reply["engine_pid"]), "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["name"] == "sh"
    finally:
        assert run_cli_here("stop", str(reply["engine_pid"])).returncode == 0
        os.unlink(reply["log"])


@pytest.mark.parametrize("command", ["run", "launch"])
def test_an_unknown_option_before_the_program_is_an_error_never_the_engines(command, gpu_key) -> None:
    r = run_cli_here(command, "--gpu-key", gpu_key, "--weigth", "2", "echo", "hi")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--weigth" in r.stderr, r.stderr


def test_a_program_named_with_a_format_character_is_shown_replaced(gpu_key, tmp_path) -> None:
    """`run`'s lines name the engine's program through the one display rule (core.host.text.printable): a
    program named with U+202E never reaches the terminal raw (it would reorder the line it is in)."""
    prog = tmp_path / "ec\u202eho"
    prog.symlink_to("/bin/echo")
    r = run_cli("run", "--gpu-key", gpu_key, "--no-health", "--name", "rlo", str(prog), "hi")
    assert r.returncode == 0, r.stderr
    assert "\u202e" not in r.stderr and "starting " + str(tmp_path) + "/ec\ufffdho" in r.stderr, r.stderr
    _engine_output(r.stderr)


def test_launch_of_an_engine_that_finishes_with_0_before_it_is_ready_succeeds_too(gpu_key) -> None:
    """`launch` hears it from its supervisor as `run` says it: exit 0, the same line (and `--json`: ok, finished);
    an engine that fails before it is ready still fails (exit 1)."""
    r = run_cli("launch", "--gpu-key", gpu_key, "--health-log", "never printed", "--json", "--", "true")
    assert r.returncode == 0, r.stderr
    assert re.search(r"engine \d+ finished with exit code 0 before it was ready", r.stderr), r.stderr
    reply = json.loads(r.stdout)
    assert reply["ok"] is True and "finished with exit code 0" in reply["finished"], r.stdout
    r = run_cli("launch", "--gpu-key", gpu_key, "--health-log", "never printed", "--", "false")
    assert r.returncode == 1 and "exited with code 1 while loading" in r.stderr, r.stderr


def test_the_rule_is_in_the_help() -> None:
    for command in ("run", "launch"):
        r = run_cli_here(command, "--help")
        assert "everything from its program on, passed to it" in " ".join(r.stdout.split()), r.stdout


# -- an engine that exits 0 succeeded ---------------------------------------------------------------------


def test_an_engine_that_finishes_with_0_before_it_is_ready_succeeded(gpu_key) -> None:
    """`run --no-health -- echo hello` exits 0 (it said `engine exited with code 0 while loading`, exit 1): ready at
    once, echo may finish before it is seen running or after it joined; either way exit 0, and the line says which."""
    r = run_cli("run", "--gpu-key", gpu_key, "--no-health", "--", "echo", "hello")
    assert r.returncode == 0, r.stderr
    assert "finished with exit code 0 before it was ready" in r.stderr or "exited with code 0" in r.stderr
    assert "while loading" not in r.stderr and "Traceback" not in r.stderr
    assert _engine_output(r.stderr) == "hello\n"
    # always before it is ready: a ready line that never comes
    r = run_cli("run", "--gpu-key", gpu_key, "--health-log", "never printed", "--", "true")
    assert r.returncode == 0, r.stderr
    assert re.search(r"engine \d+ finished with exit code 0 before it was ready: it ran unpaced", r.stderr), r.stderr
    _engine_output(r.stderr)
    r = run_cli("run", "--gpu-key", gpu_key, "--health-log", "never printed", "--", "false")  # a failure still
    assert r.returncode == 1 and "exited with code 1 while loading" in r.stderr, r.stderr
    _engine_output(r.stderr)


# -- wording ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--interval", "abc"], "invalid --interval 'abc': must be a number"),
        (["--interval=x1"], "invalid --interval 'x1': must be a number"),
        (["run", "--gpu", "one", "--", "true"], "invalid --gpu 'one': must be an integer"),
        (["synth", "--step-ms", "fast"], "invalid --step-ms 'fast': must be a number"),
    ],
)
def test_a_value_that_is_not_a_number_is_answered_as_every_bad_value(argv, line) -> None:
    r = run_cli_here(*argv)
    assert (r.returncode, r.stderr) == (2, f"gpushare-tui: {line}\n")


def test_synth_weight_defaults_as_run_and_launchs() -> None:
    """`synth --weight` was required while `run`/`launch` default to 1: one option now, one default."""
    command = typer.main.get_command(app)
    weights = {name: next(p for p in command.commands[name].params if p.name == "weight") for name in ("synth", "run")}
    assert weights["synth"].default == weights["run"].default == "1"
    assert not weights["synth"].required


def test_an_interrupted_start_says_nothing_was_started_and_never_that_it_started(gpu_key, capsys) -> None:
    """A signal during `run`'s checks (the 0.8 s of its start-up): one line, that nothing was started; before, it
    printed `starting sleep (log ...)` and then `interrupted before the engine was started`."""
    spec, sources = engines.EngineOptions(gpu_key=gpu_key, no_health=True).checked(["sleep", "5"])
    quit_event = threading.Event()
    quit_event.set()
    with pytest.raises(Interrupted, match=r"^interrupted before sleep was started \(nothing is running\)$"):
        engines._start_supervisor(spec, sources, quit_event)
    assert "starting" not in capsys.readouterr().err


# -- one option set ------------------------------------------------------------------------------------------


def test_run_and_launch_take_one_option_set() -> None:
    """Both commands' options are EngineOptions' fields (then each one's own: run's hidden fds, launch's --json)."""
    command = typer.main.get_command(app)
    shared = [f.name for f in dataclasses.fields(engines.EngineOptions)]
    for name, own in (("run", {"notify_fd", "listen_fd"}), ("launch", {"as_json"})):
        params = [p.name for p in command.commands[name].params if p.name != "help"]
        assert [p for p in params if p not in own] == shared and set(params) - set(shared) == own


def test_the_options_are_checked_once_into_a_launch_spec(gpu_key) -> None:
    spec, sources = engines.EngineOptions(
        weight="2", gpu_key=gpu_key, klass="interactive", no_health=True, name="job"
    ).checked(["sleep", "1"])
    assert (spec.engine_argv, spec.gpu_key, spec.weight, spec.klass, spec.name) == (
        ("sleep", "1"), gpu_key, 2.0, "interactive", "job",
    )  # fmt: skip
    assert (sources.kind, sources.health.kind, spec.sources.no_health) == ("command", "none", True)


# -- hints name the surface that raised them ---------------------------------------------------------------


@pytest.mark.skipif(not NO_NVML, reason="NVML present: a GPU index has a key here")
def test_a_files_gpu_index_without_nvml_names_the_files_key(tmp_path) -> None:
    path = tmp_path / "gpu.toml"
    path.write_text('gpu = 0\n\n[[engine]]\nname = "a"\nsynth = { step_ms = 5 }\n')
    r = run_cli_here("up", "--check", str(path))
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert 'set gpu_key = "KEY"' in r.stderr and "--gpu-key" not in r.stderr, r.stderr


@pytest.mark.skipif(not NO_NVML, reason="NVML present: a GPU index has a key here")
def test_gpushare_without_a_key_or_nvml_names_its_parameter() -> None:
    from gpushare_tui.core.pacing.share import GpuShare

    with pytest.raises(gpu.GpuKeyError) as e:
        GpuShare(weight=1)
    assert 'pass gpu_key="KEY"' in str(e.value) and "--gpu-key" not in str(e.value)


@pytest.mark.skipif(not NO_NVML, reason="NVML present: a GPU index has a key here")
def test_the_command_lines_hint_is_its_flag() -> None:
    r = run_cli_here("synth", "--duration", "1")
    assert r.returncode in (1, 2) and "pass --gpu-key KEY" in r.stderr, r.stderr


def test_up_builds_the_same_launch_spec_as_launch_and_the_form(tmp_path) -> None:
    """An `[[engine]]` becomes the LaunchSpec `launch` would build from the same options, and starts by the same
    command line (`run` for a command, `synth` for a synthetic engine)."""
    from gpushare_tui.core.engines.declaration import parse_engine
    from gpushare_tui.core.engines.launcher import LaunchSpec

    decl = parse_engine({"name": "job", "weight": 2, "command": ["sleep", "1"], "health": "none"}, cwd=str(tmp_path))
    spec = LaunchSpec.of_decl(decl, "k", "grp")
    given, _ = engines.EngineOptions(weight="2", name="job", gpu_key="k", no_health=True).checked(["sleep", "1"])
    assert dataclasses.replace(spec, share_group=None) == given
    assert dataclasses.replace(spec, share_group=None).argv(notify_fd=7) == given.argv(notify_fd=7)
    assert spec.argv()[spec.argv().index("--share-group") + 1] == "grp"
    synth = LaunchSpec.of_decl(parse_engine({"name": "s", "synth": {"step_ms": 2}}, cwd="."), "k")
    assert synth.argv()[3:] == [
        "synth",
        "--weight",
        "1.0",
        "--gpu-key",
        "k",
        "--name",
        "s",
        "--step-ms",
        "2.0",
        "--quiet",
    ]
